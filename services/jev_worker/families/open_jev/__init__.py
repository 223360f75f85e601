"""Open-Jev (family `open-jev`): one row per candidate (candidates.py) read by its trained scalar head on the
causal-lm backend; readout.py."""
