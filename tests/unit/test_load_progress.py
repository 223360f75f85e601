"""services/jev_worker/loading/load_progress.py: the loading step, its number among the steps this load runs and its
age; and a real load (the tiny model) counts every step it shows, with no jump."""

from __future__ import annotations

import pytest

from jev_worker.loading.load_progress import MEASURE_REUSE, STEPS, LoadProgress


def test_the_step_its_number_and_how_long_it_has_run():
    now = [100.0]
    progress = LoadProgress(clock=lambda: now[0])
    assert progress.describe() == "starting"
    progress.enter("loading the weights", "from /models/x")
    now[0] += 21.4
    assert progress.describe() == f"step 2/{len(STEPS)}: loading the weights from /models/x (21 s in this step)"
    progress.enter("warming up")
    now[0] += 3
    assert progress.describe() == f"step {len(STEPS)}/{len(STEPS)}: warming up (3 s in this step)"
    with pytest.raises(ValueError):
        progress.enter("something else")
    with pytest.raises(ValueError):
        progress.skip("something else")


def test_a_skipped_step_leaves_the_count_and_one_that_runs_after_all_comes_back():
    progress = LoadProgress(clock=lambda: 0.0)
    progress.skip(MEASURE_REUSE)
    progress.enter("building the prompt layout, head and engine")
    assert progress.describe().startswith(f"step 3/{len(STEPS) - 1}: ")
    progress.enter("warming up")
    assert progress.describe().startswith(f"step {len(STEPS) - 1}/{len(STEPS) - 1}: warming up")
    progress.enter(MEASURE_REUSE)
    assert progress.describe().startswith(f"step 4/{len(STEPS)}: {MEASURE_REUSE}")


@pytest.mark.parametrize("l3_reuse, steps", [("auto", len(STEPS) - 1), ("measured", len(STEPS))])
async def test_a_real_load_counts_every_step_it_shows(worker_settings, monkeypatch, l3_reuse, steps):
    """On a CPU (`auto`: reuse is not measured) the counter runs 1/4 .. 4/4; where reuse is measured, 1/5 .. 5/5.
    Before the fix it went from 3/5 to 5/5 on every CPU worker."""
    from .worker_helpers import worker_client

    shown: list[str] = []
    enter = LoadProgress.enter

    def recording(self, step, detail=""):
        enter(self, step, detail)
        shown.append(self.describe().split(":")[0])

    monkeypatch.setattr(LoadProgress, "enter", recording)
    async with worker_client(worker_settings(l3_reuse=l3_reuse)):
        pass
    assert shown == [f"step {k}/{steps}" for k in range(1, steps + 1)]
