"""Vela 2.0: the decoders (family `vela-decoder`: layout.py, heads.py, readout.py on their own backend,
backend.py) and the 0.3B encoder (family `vela-encoder`: marker_layout.py, marker_head.py, marker.py on the
encoder backend with the package's files, encoder_files.py)."""
