"""LFM2.5-350M (family `lfm2`): system1-omni's JSON-value likelihood contract (prompt.py) on the family's
lfm2-values backend (backend.py); readout.py."""
