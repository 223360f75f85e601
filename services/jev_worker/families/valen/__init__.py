"""Valen (family `valen`): its compiler's branches and bilinear head (readout.py) on its own backend, the base
its checkpoint names with the trained deltas applied (backend.py)."""
