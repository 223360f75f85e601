"""The clm family."""
