"""tools/calibrate_prior.py: the committed calibration set, the embedded recipe's committed prior computed from it,
and the block written beside a checkpoint's other calibration fields. (The tool itself runs through a tiny worker in
tests/unit/test_coherence.py, prior_checkpoint.)"""

from __future__ import annotations

import hashlib
import json
from collections import Counter

from jev_common.recipe import load_recipe
from jev_worker.readouts.calibration import Calibration
from jev_worker.values.position_prior import PositionPrior, layout_digest
from tools.calibrate_prior import DEFAULT_SET, default_out, read_set, write


def test_the_calibration_set_holds_every_option_count_with_all_its_shifts_once_per_question():
    questions, digest = read_set(DEFAULT_SET)
    assert Counter(len(q["criteria"]) for q in questions) == {n: 8 for n in range(2, 9)}  # 2..MAX_SHIFTS
    assert len({q["id"] for q in questions}) == len(questions)
    assert digest == hashlib.sha256(DEFAULT_SET.read_bytes()).hexdigest()


def test_the_embedded_recipe_s_prior_was_computed_from_the_committed_set_on_its_checkpoint_and_layout():
    """A changed set, prompt, verbalizer or pinned checkpoint makes the committed prior stale: recompute it
    (python -m tools.calibrate_prior), or the worker would not apply it."""
    recipe = load_recipe()
    path = default_out(recipe)
    prior = PositionPrior.from_config(json.loads(path.read_text())["position_prior"], str(path))
    assert prior.calibration_set["sha256"] == read_set(DEFAULT_SET)[1]
    assert sorted(prior.priors) == list(range(2, 9))
    assert prior.mismatch(recipe.identity, layout_digest("label-tokens", recipe, Calibration())) is None


def test_the_block_is_written_beside_a_checkpoint_s_other_calibration_fields(tmp_path):
    config = tmp_path / "decision_config.json"
    config.write_text(json.dumps({"temperature": 1.5, "biases": {"noul": 0.2}}))
    prior = PositionPrior(
        {2: (0.25, 0.75), 3: (0.2, 0.3, 0.5)},
        {"name": "s", "sha256": "ab", "questions": 2},
        checkpoint="local:x",
        layout="sha256:y",
    )
    write(config, prior)
    loaded = Calibration.from_config(json.loads(config.read_text()), "decision_config.json")
    assert loaded.temperatures["choice"] == 1.5 and loaded.biases == {"noul": 0.2}
    assert loaded.position_prior.priors == prior.priors and loaded.position_prior.layout == "sha256:y"
