"""Open-Jev (family `open-jev`): every candidate its own sequence in Open-Jev's layout (layout.py), its rows
(candidates.py), read by the trained scalar head over the saved temperature on the causal-lm backend
(readout.py)."""
