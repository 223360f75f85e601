"""The decision worker: one pinned checkpoint, one forward pass per decision, no generation."""
