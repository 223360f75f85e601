"""The valen family."""
