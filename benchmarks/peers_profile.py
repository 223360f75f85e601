"""Where an arm of benchmarks/peers.py spends its time: py-spy on the serving process under one cell's load.

    python -m benchmarks.peers_profile --workload single,8q --concurrency 1 [--arm ours|llama-bare]
                                       [--seconds 20] [--native] [--ours-env JEV_TORCH_THREADS=1]

Starts only that arm (as benchmarks.peers does: the same env, the same loopback ports), sends the
cell's requests (the same corpus, fresh requests, bounded by --seconds) while
`py-spy record --format raw` samples the serving process (ours: the worker; llama-bare: the scorer)
at 200 Hz, idle threads excluded, so the samples say where CPU time goes. Prints the top functions by
inclusive and by self share of samples, and writes the raw collapsed stacks (flamegraph input) and a
summary JSON under --out. py-spy comes from the peers' venv (benchmarks/peers/install.sh), else the project's
(requirements-dev.txt). `--ours-env JEV_MODEL_PATH=DIR` profiles another checkpoint (the smoke run: a tiny one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from . import peers


def summarise(raw_lines: list[str], top: int = 25) -> dict:
    """Collapsed stacks ("f1;f2;...;leaf N") -> inclusive and self sample shares per function."""
    inclusive: Counter[str] = Counter()
    self_: Counter[str] = Counter()
    total = 0
    for line in raw_lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f for f in stack.split(";") if f]
        names = [f.split(" (")[0] + (f" ({f.split(' (')[1].split(':')[0]})" if " (" in f else "") for f in frames]
        for name in set(names):
            inclusive[name] += n
        if names:
            self_[names[-1]] += n

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, n / total) for name, n in counter.most_common(top)] if total else []

    return {"samples": total, "inclusive": share(inclusive), "self": share(self_)}


def py_spy() -> str:
    """The peers' venv's py-spy (benchmarks/peers/install.sh), else the one beside this python (requirements-dev)."""
    for candidate in (peers.PEER_VENV / "bin" / "py-spy", Path(sys.executable).parent / "py-spy"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy not found: run `bash benchmarks/peers/install.sh` or `make venv`")
    return found


async def profile(args) -> list[dict]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = peers.build_corpus(6, peers.DEFAULT_COUNTS, seed=77)  # other requests than the benchmark's
    cells = [(w, c) for w in args.workload for c in args.concurrency]
    ref = peers.Reference() if args.arm in ("jcs-transformers", "jcs-llama") else None
    jcs_config = out / "jcs-config-profile.json"
    hf_folder = None
    if ref is not None:
        every = [b for bodies in corpus.values() for b in bodies]
        jcs_config.write_text(json.dumps(ref.jcs_config(every + peers.WARMUP)))
        hf_folder = ref.save_hf_folder(out / "smollm2-135m-fp32-hf")
    stacks, urls, pids = await peers.start_arms(
        [args.arm], out, peers.gguf_path(), hf_folder, jcs_config, args.bare_threads, 300.0, args.ours_env
    )
    summaries = []
    try:
        await peers.run_cell(urls[args.arm], peers.WARMUP, 1, timeout_s=300, max_seconds=300)
        for workload, conc in cells:
            bodies = [b for r in range(6) for b in corpus[(workload, conc, r)]]
            stem = f"profile-{args.arm}-{workload}-c{conc}"
            raw_path = out / f"{stem}.txt"
            cmd = [
                py_spy(),
                "record",
                "--pid",
                str(pids[args.arm]),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(raw_path),
                "--duration",
                str(int(args.seconds)),
            ]
            cmd.append("--native" if args.native else "--nonblocking")  # py-spy cannot do both
            recorder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            await asyncio.sleep(1.0)
            load_before = peers.loadavg()
            results, wall = await peers.run_cell(
                urls[args.arm], bodies, conc, timeout_s=300, max_seconds=args.seconds - 1.5
            )
            sent = [r for r in results if r is not None]
            latencies = sorted(r[1] * 1000 for r in sent if r[0] == 200)
            _, err = await asyncio.to_thread(recorder.communicate, None, args.seconds + 60)
            if recorder.returncode != 0:
                raise SystemExit(f"py-spy failed ({recorder.returncode}): {err.decode(errors='replace')[-2000:]}")
            summary = summarise(raw_path.read_text().splitlines(), args.top)
            summary.update(
                {
                    "arm": args.arm,
                    "ours_env": args.ours_env,
                    "workload": workload,
                    "concurrency": conc,
                    "requests_ok": len(latencies),
                    "requests_sent": len(sent),
                    "wall_s": wall,
                    "p50_ms": peers.percentile(latencies, 50),
                    "native": args.native,
                    "loadavg_before": load_before,
                    "loadavg_after": peers.loadavg(),
                    "raw": str(raw_path),
                }
            )
            (out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
            summaries.append(summary)
            await peers.run_cell(urls[args.arm], peers.WARMUP[:1], 1, timeout_s=900, max_seconds=900)  # drain
    finally:
        for stack in reversed(stacks):
            await stack.stop_all()
    return summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers_profile", description=__doc__.split("\n")[0])
    parser.add_argument("--arm", choices=peers.ARMS, default="ours")
    parser.add_argument("--workload", default="single", help=f"comma-separated of {','.join(peers.WORKLOADS)}")
    parser.add_argument("--concurrency", default="1", help="comma-separated of 1,8")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--native", action="store_true", help="C/C++ frames too (torch, ggml kernels)")
    parser.add_argument("--bare-threads", type=int, default=None)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--ours-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra env for our worker (e.g. JEV_TORCH_THREADS=1); repeatable",
    )
    parser.add_argument("--out", default=str(peers.DEFAULT_OUT))
    args = parser.parse_args(argv)
    args.ours_env = peers.parse_env(args.ours_env, parser)
    import os

    args.bare_threads = args.bare_threads or os.cpu_count() or 1
    args.workload = [w for w in args.workload.split(",") if w]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    if not set(args.workload) <= set(peers.WORKLOADS) or not set(args.concurrency) <= set(peers.CONCURRENCY):
        parser.error("unknown workload or concurrency")
    summaries = asyncio.run(profile(args))
    for summary in summaries:
        print(
            f"\n{summary['arm']} {summary['ours_env'] or ''} {summary['workload']} c={summary['concurrency']}: "
            f"{summary['requests_ok']}/{summary['requests_sent']} ok, p50 {summary['p50_ms'] or 0:.1f} ms, "
            f"{summary['samples']} samples (load average {summary['loadavg_before']} -> {summary['loadavg_after']})"
        )
        for title in ("inclusive", "self"):
            print(f"{title} share of samples:")
            for name, share in summary[title][: args.top]:
                print(f"  {share * 100:5.1f}%  {name}")
        print(f"raw stacks: {summary['raw']}")
    broken = failures(summaries)
    for line in broken:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if broken else 0


def failures(summaries: list[dict]) -> list[str]:
    """Cells whose profile is not of the load it names: requests that were not answered 200, or no sample."""
    return [
        f"{s['arm']} {s['workload']} c={s['concurrency']}: {s['requests_ok']}/{s['requests_sent']} answered 200, "
        f"{s['samples']} samples"
        for s in summaries
        if s["requests_ok"] < s["requests_sent"] or not s["requests_sent"] or not s["samples"]
    ]


if __name__ == "__main__":
    sys.exit(main())
