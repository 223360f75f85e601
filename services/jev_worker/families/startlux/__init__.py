"""StartLux-Decision (family `startlux`): StartLux's own lettered chat contract on the causal-lm backend; readout.py."""
