"""Reusable fakes for tests: fake_worker (the worker HTTP contract without a model)."""
