"""The open_jev family."""
