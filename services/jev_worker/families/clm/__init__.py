"""CLM (family `clm`): answered by CLM's own server on the external-http backend; readout.py translates."""
