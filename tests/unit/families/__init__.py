"""One test module per family (services/jev_worker/families/ and the generic label-tokens and code-readout)."""
