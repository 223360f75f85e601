"""Estimate a recipe's position prior (x_coherence `prior`, PriDe) from a fixed calibration set, through the worker's
own engine.

    python -m tools.calibrate_prior [--recipe NAME] [--model-path DIR] [--set FILE.jsonl] [--out FILE]

Loads the model as `python -m jev_worker` does (the same settings, JEV_* variables included), asks every question of
the calibration set under x_coherence `cyclic` (every cyclic shift of its options: the set holds 2..8 options per
question), reads each shift's label logits as the worker reads them (its readout's calibration applied) and computes
PriDe's prior per option count (jev_worker/values/position_prior.py, Eq. 4-5). Writes `{"position_prior": {...}}`
to `--out`, merged into the file when it already holds a JSON object (a checkpoint's decision_config.json keeps
its other fields); by default the file the recipe names (`serving.options.position_prior_file`, beside its
recipe.yaml). The block records the set's sha256, the checkpoint's identity and the layout digest, which the worker
checks before applying it. The set is fixed and committed (tools/calibration_sets/choice-v1.jsonl): never live
traffic, so answers do not drift, replicas agree and no tenant's requests reach another's answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SET = REPO / "tools" / "calibration_sets" / "choice-v1.jsonl"


def read_set(path: Path) -> tuple[list[dict], str]:
    """The calibration questions (id, state, instructions, criteria) and the file's sha256."""
    blob = path.read_bytes()
    questions = [json.loads(line) for line in blob.decode("utf-8").splitlines() if line.strip()]
    return questions, hashlib.sha256(blob).hexdigest()


@contextlib.asynccontextmanager
async def started_worker(settings) -> AsyncIterator[Any]:
    """A WorkerService on `settings`, started in this process and stopped after (SystemExit when it did not start):
    the calibration tools read rows through its own scheduler and engine."""
    from jev_worker.service import WorkerService

    service = WorkerService(settings)
    await service.start()
    try:
        if service.state != "ok":
            raise SystemExit(f"the worker did not start: {service.error}")
        yield service
    finally:
        await service.stop()


async def shift_log_probs(service, question: dict) -> list[list[float]]:
    """log P_obs(position i) for every cyclic shift s of the question's options (rows in shift order), read through
    the worker's scheduler and engine, with the readout's calibration applied as it is when answering."""
    import torch

    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.choice import MAX_SHIFTS, cyclic_shifts
    from jev_worker.questions.plan import rows_for
    from jev_worker.scheduling.batch import EngineItem

    n = len(question["criteria"])
    if not 2 <= n <= MAX_SHIFTS:
        raise SystemExit(
            f"calibration question {question.get('id')!r}: {n} options; PriDe's prior needs every cyclic "
            f"shift, so the set holds 2..{MAX_SHIFTS} options per question"
        )
    request = SystemOneRequest.model_validate(
        {
            "model": "jev-latest",
            "state": question["state"],
            "x_coherence": "cyclic",
            "questions": {
                "q": {"type": "choice", "instructions": question["instructions"], "criteria": question["criteria"]}
            },
        }
    )
    model, readout = service.model, service.model.readout
    rows, plan = rows_for(request.questions, request.state, model.builder, readout.kinds, readout.name, "cyclic")
    assert len(rows) == n and cyclic_shifts(n) == list(range(n))
    prepared = model.builder.prepare(readout.envelope_state(request), rows, (), plan)
    result = await model.scheduler.submit(EngineItem(prepared=prepared), 600.0)
    return [
        torch.log_softmax(readout.calibration.apply("choice", row).to(torch.float64), dim=-1).tolist()
        for row in result.row_logits
    ]


async def calibrate(settings, set_path: Path) -> dict:
    """{"prior": PositionPrior, "seconds", "rows"}: the set asked of a worker on `settings`, in this process."""
    from jev_worker.values.position_prior import PositionPrior, estimate, layout_digest

    questions, digest = read_set(set_path)
    async with started_worker(settings) as service:
        readout = service.model.readout
        choice = readout.kinds.get("choice")
        if choice is None or "cyclic" not in choice.coherence_modes or readout.calibration is None:
            raise SystemExit(
                f"readout {readout.name!r} does not read choices from option codes under cyclic: "
                "a position prior does not apply to it"
            )
        started = time.perf_counter()
        observed = [await shift_log_probs(service, q) for q in questions]
        seconds = time.perf_counter() - started
        prior = PositionPrior(
            {n: tuple(p) for n, p in estimate(observed).items()},
            {"name": set_path.stem, "sha256": digest, "questions": len(questions)},
            checkpoint=service.identity,
            layout=layout_digest(readout.name, service.model.builder.recipe, readout.calibration),
        )
        return {"prior": prior, "seconds": seconds, "rows": sum(len(o) for o in observed)}


def default_out(recipe) -> Path | None:
    name = recipe.serving.options.get("position_prior_file")
    return Path(recipe.folder) / name if name and recipe.folder is not None else None


def write(out: Path, prior) -> None:
    """`{"position_prior": ...}` into `out`, keeping the other fields of a JSON object already there."""
    config = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
    if not isinstance(config, dict):
        raise SystemExit(f"{out} holds no JSON object to add the position prior to")
    config["position_prior"] = prior.to_config()
    text = json.dumps(config, indent=1)
    text = re.sub(
        r"\[\s*([-0-9.e,\s]+?)\s*\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", text
    )
    out.write_text(text + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.calibrate_prior", description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", help="JEV_RECIPE (a recipe name under recipes/, or a folder)")
    parser.add_argument("--model-path", help="JEV_MODEL_PATH (a local checkpoint folder)")
    parser.add_argument("--set", type=Path, default=DEFAULT_SET, help="the calibration set (JSON lines)")
    parser.add_argument("--out", type=Path, help="the file to write (default: the recipe's position_prior_file)")
    args = parser.parse_args(argv)
    if args.recipe:
        os.environ["JEV_RECIPE"] = args.recipe
    if args.model_path:
        os.environ["JEV_MODEL_PATH"] = args.model_path
    os.environ.setdefault("JEV_REDIS_URL", "")  # no cache index: nothing to announce or to log
    os.environ.setdefault("JEV_WORKER_REGISTER_TTL_S", "0")
    logging.basicConfig(level=logging.ERROR)  # the absent cache index is not worth a warning per request
    from jev_worker.settings import WorkerSettings

    settings = WorkerSettings.from_env()
    out = args.out or default_out(settings.recipe)
    if out is None:
        parser.error(f"recipe {settings.recipe.name} names no serving.options.position_prior_file: give --out")
    result = asyncio.run(calibrate(settings, args.set))
    prior = result["prior"]
    write(out, prior)
    print(
        f"{result['rows']} rows of {prior.calibration_set['questions']} questions ({args.set.name}, sha256 "
        f"{prior.calibration_set['sha256'][:12]}) in {result['seconds']:.1f} s on {prior.checkpoint}"
    )
    for n, values in sorted(prior.priors.items()):
        print(f"  {n} options: " + " ".join(f"{p:.3f}" for p in values))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
