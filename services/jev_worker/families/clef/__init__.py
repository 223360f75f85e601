"""The clef family."""
