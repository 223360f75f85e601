"""services/jev_worker/loading/load_progress.py: the loading step, its number among the steps and its age."""

from __future__ import annotations

import pytest

from jev_worker.loading.load_progress import STEPS, LoadProgress


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
