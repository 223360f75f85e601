"""Scheduling: the queue in front of the one model thread (`scheduler.py`: admission, single flight, fairness,
deadlines, batches formed by prefix), the batch's items and results (`batch.py`), the prefix cache L3 the
scheduler owns (`prefix_cache.py`) and whether a hit pays (`reuse.py`), stopping forwards nobody waits for
(`abandon.py`), and the L1/L2/L3 budgets (`caches.py`). May import prompt/ and the top-level protocols and
settings; never the engine, which it drives through protocols.Engine."""
