"""Request forms: a System One envelope (`envelope.py`) or the single-question JEV-VL form (`legacy.py`) parsed
into the one `Job` (`job.py`), and the typed answers read back into the form's response. May import prompt/,
questions/ and the top-level protocols; nothing of scheduling, the engine or a model."""
