"""Readouts: what turns a backend's outputs into typed answers. One module per readout; registry.py names them."""
