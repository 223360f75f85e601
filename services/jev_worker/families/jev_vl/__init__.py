"""JEV-27B-VL (family `jev-vl`): upstream's raw System 1 prompt (contract.py, layout.py), the merged FP32
label rows (head.py) and the calibrated verbalizer readout (readout.py), on the causal-lm backend."""
