"""Schemathesis against the real frontend (python -m jev_frontend, rate limits on) routing to a real worker on the
tiny checkpoint: positive and negative requests generated from the frontend's own /openapi.json, every answer
checked by benchmarks.fuzz_api's checks (no 500; other 5xx only where documented; every answer as described; none
later than its deadline; none missing). The 10,000-case run is the benchmark (python -m benchmarks.fuzz_api)."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from benchmarks.fuzz_api import Fuzzer, start_stack
from benchmarks.stack import Stack

from ..unit.test_cache_index import needs_redis

pytestmark = [pytest.mark.slow, needs_redis]
CASES = 400  # about a minute on a busy 2-core machine, the stack's start included


async def test_generated_requests_get_documented_answers(tiny_text_dir, tmp_path):
    redis_url = f"redis://127.0.0.1:6379/{random.randint(1, 15)}"
    async with Stack(tmp_path / "logs") as stack:
        _worker, frontend = await start_stack(stack, tiny_text_dir, redis_url)
        fuzzer = Fuzzer(frontend.url, seed=int(os.environ.get("JEV_FUZZ_SEED", "0")))
        tally = await asyncio.to_thread(fuzzer.run, CASES)
    summary = tally.summary()
    assert not tally.failures, "\n".join(f.line() for f in tally.failures[:20]) + f"\n{summary}"
    assert summary["by_mode"].get("positive") and summary["by_mode"].get("negative"), summary
    assert 200 in tally.by_status and 422 in tally.by_status, summary  # decisions answered, and refused
