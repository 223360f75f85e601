"""System One question types: rows after the state prefix, and answers from their label logits."""
