"""The generic backends: what runs the network for a readout. One module per backend; registry.py names them.
A family's own backend (Valen's, Vela's decoder) lives in its folder under families/."""
