"""Prompts: the chat-template prompt builder and the prepared request it makes (exact token ids, the shared state
prefix, the rows; `builder.py`), and the bounds of what a model reads, checked before any forward (`bounds.py`).
May import the top-level protocols only."""
