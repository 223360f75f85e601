"""Cua-S1 4B 0.2 (families `cua-s1`, text adapter, and `cua-s1-screenshot`, multimodal adapter): Cua-S1's own
contracts on the causal-lm backend; readout.py (text) and screenshot.py (one screenshot as the state)."""
