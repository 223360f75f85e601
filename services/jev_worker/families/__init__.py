"""One folder per model family: its readout, prompt layout, heads and (only where no generic backend fits)
its backend; registry.py names each family's readout. Generic pieces stay in backends/, readouts/ and
questions/."""
