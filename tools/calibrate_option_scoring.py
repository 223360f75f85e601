"""Fit option scoring's per-type scaling (readouts/option_scoring.py) on a fixed labelled calibration set, through the
worker's own engine.

    python -m tools.calibrate_option_scoring [--recipe NAME] [--model-path DIR] [--set FILE.jsonl] [--out FILE]

Loads the model as `python -m jev_worker` does (JEV_* variables included), asks every question of the set (its
cases: a state, its questions and their gold answers, as benchmarks/data/everyday-210.jsonl) and reads each row's
[score, baseline] as the worker reads them. Per type (noul, choice, score; span and set take choice's and noul's), a
grid search picks the baseline weight, temperature and (yes/no) bias that minimise the mean negative log-likelihood
of the gold answers: `(score - weight * baseline) / temperature`, plus `bias` on the yes side. Writes
`{"option_scoring": {...}}` to `--out` (default: the file the recipe names, `serving.options.calibration_file`,
beside its recipe.yaml), with the set's sha256, the checkpoint's identity and the layout digest, which the worker
checks before applying it. The set is fixed and committed (tools/calibration_sets/scoring-v1.jsonl, apart from the
benchmark's sets): never live traffic, so answers do not drift and replicas agree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from tools.calibrate_prior import read_set, started_worker

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SET = REPO / "tools" / "calibration_sets" / "scoring-v1.jsonl"
WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
TEMPERATURES = tuple(round(0.25 * 2 ** (k / 4), 4) for k in range(17))  # 0.25 .. 4, geometric
BIASES = tuple(b / 4 for b in range(-16, 17))  # -4 .. 4 (yes/no only)
FITTED = ("noul", "choice", "score")


def gold_index(question: dict, gold) -> int:
    if question["type"] == "noul":
        return 0 if gold else 1  # rows: yes, no
    if question["type"] == "choice":
        return list(question["criteria"]).index(gold)
    return int(gold)


async def case_rows(service, case: dict) -> list[tuple[str, list[list[float]], int]]:
    """(type, each row's [score, baseline?], the gold row) of every labelled question of `case`."""
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import rows_for
    from jev_worker.scheduling.batch import EngineItem

    model, readout = service.model, service.model.readout
    request = SystemOneRequest.model_validate(
        {"model": "jev-latest", "state": case["state"], "questions": case["questions"]}
    )
    rows, plan = rows_for(request.questions, request.state, model.builder, readout.kinds, readout.name)
    prepared = model.builder.prepare(readout.envelope_state(request), rows, (), plan)
    result = await model.scheduler.submit(EngineItem(prepared=prepared), 600.0)
    out = []
    for q in plan.questions:
        if q.qid in case["gold"]:
            logits = [row.tolist() for row in result.row_logits[q.first_row : q.first_row + q.n_rows]]
            question = case["questions"][q.qid]
            out.append((question["type"], logits, gold_index(question, case["gold"][q.qid])))
    return out


def nll(samples, weight: float, temperature: float, bias: float) -> float:
    from jev_worker.questions.scored import Scaling

    scaling = Scaling(weight, temperature, bias)
    total = 0.0
    for rows, gold in samples:
        scores = scaling.scores(rows)
        scores[0] += bias / temperature  # the yes row's (bias is 0 for the other types)
        top = max(scores)
        total -= scores[gold] - top - math.log(sum(math.exp(s - top) for s in scores))
    return total / len(samples)


def fit(samples, yes_no: bool, calibrated: bool) -> dict:
    """The grid point with the least mean NLL of the gold answers."""
    best = None
    for weight in WEIGHTS if calibrated else (0.0,):
        for temperature in TEMPERATURES:
            for bias in BIASES if yes_no else (0.0,):
                value = nll(samples, weight, temperature, bias)
                if best is None or value < best[0]:
                    best = (value, weight, temperature, bias)
    assert best is not None, "a grid of at least one point"
    value, weight, temperature, bias = best
    out = {"weight": weight, "temperature": temperature}
    if yes_no:
        out["bias"] = bias
    return {"scaling": out, "nll": round(value, 4), "questions": len(samples)}


async def calibrate(settings, set_path: Path) -> dict:
    cases, digest = read_set(set_path)
    async with started_worker(settings) as service:
        model = service.model
        assert model is not None  # started ok
        readout: Any = model.readout  # an OptionScoringReadout (checked by name below)
        if readout.name != "option-scoring":
            raise SystemExit(f"recipe {settings.recipe.name} is served by {readout.name!r}, not option-scoring")
        started = time.perf_counter()
        by_type: dict[str, list] = {t: [] for t in FITTED}
        for case in cases:
            for type_, rows, gold in await case_rows(service, case):
                by_type[type_].append((rows, gold))
        seconds = time.perf_counter() - started
        calibrated = readout.option("baseline") != "none"
        fits = {t: fit(samples, t == "noul", calibrated) for t, samples in by_type.items() if samples}
        block = {
            "method": "grid search of weight, temperature (and yes/no bias) minimising the gold answers' mean NLL",
            "types": {t: f["scaling"] for t, f in fits.items()},
            "calibration_set": {
                "name": set_path.stem,
                "sha256": digest,
                "questions": sum(len(s) for s in by_type.values()),
            },
            "checkpoint": model.builder.identity,
            "layout": readout.layout(model.builder),
        }
        return {"block": block, "fits": fits, "seconds": seconds}


def default_out(recipe) -> Path | None:
    name = recipe.serving.options.get("calibration_file")
    return Path(recipe.folder) / name if name and recipe.folder is not None else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.calibrate_option_scoring", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--recipe", help="JEV_RECIPE (a recipe name under recipes/, or a folder)")
    parser.add_argument("--model-path", help="JEV_MODEL_PATH (a local checkpoint folder)")
    parser.add_argument("--set", type=Path, default=DEFAULT_SET, help="the labelled calibration set (JSON lines)")
    parser.add_argument("--out", type=Path, help="the file to write (default: the recipe's calibration_file)")
    args = parser.parse_args(argv)
    if args.recipe:
        os.environ["JEV_RECIPE"] = args.recipe
    if args.model_path:
        os.environ["JEV_MODEL_PATH"] = args.model_path
    os.environ.setdefault("JEV_REDIS_URL", "")
    os.environ.setdefault("JEV_WORKER_REGISTER_TTL_S", "0")
    logging.basicConfig(level=logging.ERROR)
    from jev_worker.settings import WorkerSettings

    settings = WorkerSettings.from_env()
    out = args.out or default_out(settings.recipe)
    if out is None:
        parser.error(f"recipe {settings.recipe.name} names no serving.options.calibration_file: give --out")
    result = asyncio.run(calibrate(settings, args.set))
    block = result["block"]
    out.write_text(json.dumps({"option_scoring": block}, indent=1) + "\n", encoding="utf-8")
    print(
        f"{block['calibration_set']['questions']} questions ({args.set.name}, sha256 "
        f"{block['calibration_set']['sha256'][:12]}) in {result['seconds']:.1f} s on {block['checkpoint']}"
    )
    for type_, f in result["fits"].items():
        print(f"  {type_}: {f['scaling']} (mean NLL {f['nll']} over {f['questions']})")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
