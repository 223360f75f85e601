"""Laya (family `laya`): Laya's per-question sequences (layout.py) and decision layers (readout.py) on the
encoder backend."""
