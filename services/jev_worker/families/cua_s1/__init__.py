"""Cua-S1 4B 0.2 text (family `cua-s1`): Cua-S1's own text contract on the causal-lm backend; readout.py."""
