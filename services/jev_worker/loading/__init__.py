"""Loading a checkpoint: transformers' model and tokenizer on the device (`loader.py`), the checks a readout asks
of a checkpoint folder before any weight is read (`checkpoint.py`), the packages a family needs (`package_gate.py`),
load progress for /health (`load_progress.py`), classes named by registry strings (`named.py`) and prepared image
assets (`vision.py`). May import scheduling/ (the L2 budget) and jev_common; nothing above."""
