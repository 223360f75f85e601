"""The generic backends: what runs the network for a readout. One module per backend; registry.py names them.
A family's own backend (Valen's, Vela's decoder) lives in its folder under families/. May import engine/,
loading/, scheduling/ (batch types) and the top-level protocols."""
