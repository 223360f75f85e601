"""System One question types: rows after the state prefix, and answers from their label logits; the position
prior a choice may be answered with (`position_prior.py`). May import prompt/ and the top-level protocols."""
