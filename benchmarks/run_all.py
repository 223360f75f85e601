"""Every benchmark in one run, on real services started as local processes (docs/benchmarks.md).

    python -m benchmarks.run_all [--model smollm2|tiny] [--requests N] [--out benchmarks/out]

Starts `python -m jev_worker` three times (defaults; L3 off; batching off) and `python -m
jev_frontend` in front of the first, all on free loopback ports, and prints ONE table: direct worker
vs through the frontend, client session pooling, L3 prefix cache on vs off, candidate batching on vs
off, and latency vs concurrency (1, 2, 4, 8). Writes results.json, results.md and
latency_vs_concurrency.png under --out, and the services' logs under --out/logs.

--model smollm2 (default) serves the embedded SmolLM2-135M (real numbers); --model tiny builds a tiny
random checkpoint first (tools/tiny_checkpoints.py) for a quick run of the machinery.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .suite import ALL_GROUPS, BenchConfig, environment_info, run_suite_sync, text_table, write_outputs

DEFAULT_OUT = Path(__file__).resolve().parent / "out"


def tiny_checkpoint(out_dir: Path) -> Path:
    from tools.tiny_checkpoints import make_tiny_text

    path = out_dir / "tiny-checkpoint"
    if not (path / "config.json").is_file():
        make_tiny_text(path)
    return path


def model_env(model: str, out_dir: Path, model_path: str | None) -> dict[str, str]:
    if model_path:
        return {"JEV_MODEL_PATH": str(Path(model_path).resolve())}
    if model == "tiny":
        return {"JEV_MODEL_PATH": str(tiny_checkpoint(out_dir).resolve()), "JEV_DTYPE": "float32"}
    return {}  # the recipe's own checkpoint: the embedded SmolLM2 GGUF


def parse_args(argv: list[str] | None, description: str = __doc__, default_groups=ALL_GROUPS) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description.split("\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--model-path", default=None, help="serve this local checkpoint folder instead")
    parser.add_argument("--requests", type=int, default=32, help="requests per variant (and per concurrency level)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per A/B comparison")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument(
        "--groups", default=",".join(default_groups), help=f"comma-separated subset of {','.join(ALL_GROUPS)}"
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="JEV_TORCH_THREADS for every worker (default: torch's own, one per core)",
    )
    parser.add_argument("--redis-url", default=os.environ.get("JEV_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= 10_000:
        parser.error("--requests must be 1..10000")
    args.groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
    unknown = set(args.groups) - set(ALL_GROUPS)
    if unknown:
        parser.error(f"unknown groups {sorted(unknown)}; known: {', '.join(ALL_GROUPS)}")
    return args


def run(args: argparse.Namespace, stem: str, title: str) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    env = {**model_env(args.model, out_dir, args.model_path), "JEV_REDIS_URL": args.redis_url}
    if args.torch_threads:
        env["JEV_TORCH_THREADS"] = str(args.torch_threads)
    config = BenchConfig(requests=args.requests, rounds=args.rounds, groups=args.groups, worker_env=env)
    model = args.model_path or args.model
    print(f"{title}: model {model}, {args.requests} requests per variant, groups {','.join(args.groups)}", flush=True)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load_at_start is not None and load_at_start > 0.5 * cpus:
        print(
            f"WARNING: load average {load_at_start:.2f} on {cpus} CPUs before starting: other processes are "
            "busy, so latencies will be noisy (see docs/benchmarks.md, 'Reading CPU numbers')",
            flush=True,
        )
    suite = run_suite_sync(config, out_dir, log=lambda line: print(line, flush=True))
    meta = {
        **environment_info(),
        "model": model,
        "requests_per_variant": args.requests,
        "rounds": args.rounds,
        "groups": list(args.groups),
        "loadavg_1m_at_start": load_at_start,
        "torch_threads": args.torch_threads,
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    paths = write_outputs(suite, out_dir, meta, stem=stem, plot_title=f"{title}: {model} ({meta['cpu']})")
    print()
    print(
        f"{title} -- model {model}, commit {meta['commit']}{'+dirty' if meta['dirty'] else ''}, "
        f"{meta['cpus_usable']} CPUs ({meta['cpu']}), {meta['total_seconds']} s"
    )
    print(text_table(suite.runs))
    print()
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    failed = [r for r in suite.runs if r.report.ok != r.report.sent]
    if failed:
        print(
            f"WARNING: {len(failed)} runs had non-200 answers: "
            + "; ".join(f"{r.group}/{r.variant}: {r.report.statuses}" for r in failed),
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv), stem="results", title="jev benchmarks")


if __name__ == "__main__":
    sys.exit(main())
