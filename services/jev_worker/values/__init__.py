"""Plain values the protocols name and every layer passes around: a loaded checkpoint, a prepared prompt and its
rows, a job, a batch's items and output (datatypes.py), a calibrated position prior (position_prior.py). Below every
other folder: imports nothing of the worker but itself."""
