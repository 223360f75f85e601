"""`jev batch`: a dataset in, answers out (runner.py); its input forms (inputs.py), state window (window.py),
concurrency (pacing.py), output and resume (output.py) and progress (progress.py)."""
