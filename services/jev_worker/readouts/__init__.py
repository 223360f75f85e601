"""The generic readouts (label-tokens, code-readout), their shared defaults (`standard.py`) and calibration. Each
family's own readout lives in its folder under families/; families/registry.py names them all. May import
backends/, engine/, loading/, prompt/, questions/, request/ and the top-level protocols."""
