"""The vela family."""
