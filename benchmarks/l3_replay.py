"""The L3 hit rate of the benchmark corpora, before and after a change to prompt building.

Replays each built-in corpus (benchmarks/corpora.py) through a prompt builder in order and counts the
requests whose state-prefix key was already seen: the hit rate of an L3 with an unbounded budget, the
same number the worker's /v1/cache/stats reports for that sequence at concurrency 1. No model forward
is needed, only the recipe's tokenizer. `--before REV` also replays through the prompt module of an
earlier git revision, side by side.

    python -m benchmarks.l3_replay --before d7b9ec6
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

from jev_common.recipe import load_recipe
from jev_common.schema import DecisionRequest

from .corpora import BUILTIN

REPO = Path(__file__).resolve().parents[1]


def tokenizer_of(recipe):
    from transformers import AutoTokenizer

    from jev_worker.loading.loader import resolve_checkpoint  # the worker's own way to find the files

    folder = resolve_checkpoint(recipe, None)
    return AutoTokenizer.from_pretrained(folder, gguf_file=recipe.model.gguf_file)


def current_keys(recipe, tokenizer, corpus: list[dict]) -> list[str]:
    from jev_worker.prompt.builder import ChatPromptBuilder
    from jev_worker.request.legacy import prepare_legacy

    builder = ChatPromptBuilder(tokenizer, recipe, recipe.identity)
    return [prepare_legacy(builder, DecisionRequest.model_validate(body)).prefix_key for body in corpus]


def revision_keys(revision: str, recipe, tokenizer, corpus: list[dict]) -> list[str]:
    """Prefix keys from services/jev_worker/prompt/builder.py as it was at `revision` (its prepare(request))."""
    source = subprocess.run(
        ["git", "show", f"{revision}:services/jev_worker/prompt/builder.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "old_prompt.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("jev_worker._old_prompt", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(spec.name, None)
    builder = module.PromptBuilder(tokenizer, recipe, recipe.identity)  # its name before ChatPromptBuilder
    return [builder.prepare(DecisionRequest.model_validate(body)).prefix_key for body in corpus]


def hit_rate(keys: list[str]) -> tuple[int, int, float]:
    seen: set[str] = set()
    hits = 0
    for key in keys:
        hits += key in seen
        seen.add(key)
    return hits, len(keys) - hits, hits / len(keys) if keys else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="smollm2-135m-cpu")
    parser.add_argument("--before", default=None, help="a git revision to compare with (e.g. d7b9ec6)")
    args = parser.parse_args(argv)
    recipe = load_recipe(args.recipe)
    tokenizer = tokenizer_of(recipe)
    print(f"L3 hit rate per corpus (unbounded L3, requests in corpus order), recipe {recipe.name}")
    header = f"{'corpus':<15} {'requests':>8} {'now':>8}" + (f" {args.before:>10}" if args.before else "")
    print(header)
    worse = False
    for name, make in BUILTIN.items():
        corpus = make()
        _, _, now = hit_rate(current_keys(recipe, tokenizer, corpus))
        line = f"{name:<15} {len(corpus):>8} {now:>8.3f}"
        if args.before:
            _, _, then = hit_rate(revision_keys(args.before, recipe, tokenizer, corpus))
            line += f" {then:>10.3f}"
            worse |= now < then - 1e-9
        print(line)
    if worse:
        print("WARNING: a corpus has a lower L3 hit rate than before", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
