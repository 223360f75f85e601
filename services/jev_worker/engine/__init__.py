"""The engine: the model runner (`runner.py`) over the forwards (`forwards.py`: packed, padded, chunked prefill),
CUDA-graph replay (`graphs.py`), the generic forward adapters (`adapters.py`), the LM-head decision head
(`head.py`) and the optional GPU kernels (`kernels.py`). Runs on the single model thread. May import scheduling/
(batch and prefix-state types) and the top-level protocols; knows nothing of questions or requests."""
