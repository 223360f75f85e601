"""Backends: what runs the network for a readout. One module per backend; registry.py names them."""
