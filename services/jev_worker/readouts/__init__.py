"""The generic readouts (label-tokens, code-readout), calibration, and the checkpoint checks every readout
uses (base.py). Each family's own readout lives in its folder under families/; families/registry.py names
them all."""
