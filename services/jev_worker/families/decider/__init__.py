"""Decider-2B v11 (family `decider`): Decider's own plain-text contract on the causal-lm backend; prompt.py,
readout.py."""
