"""The benchmark comparisons shared by run_all, worker_bench and gpu_check.

Workers (each its own `python -m jev_worker` process on a free loopback port, same checkpoint):
  A  defaults: L3 prefix cache on, candidate batching on
  B  L3 off (JEV_CACHE_L3_BYTES=0), batching on          -- only for the `l3` group
  C  batching off (JEV_BATCHING=0), L3 on                -- only for the `batching` group
  F  `python -m jev_frontend` in front of A              -- for `frontend`, `pooling`, `concurrency`

Groups, in the order they run (the first variant of each is its baseline; the others are compared
with it):
  l3           B (L3 off)  vs  A (L3 on)                        (direct, shared-prefix, concurrency 1;
                                                                  runs first, on cold caches: the first
                                                                  question about each state misses)
  frontend     direct to A  vs  through F                       (mixed corpus, concurrency 1)
  pooling      new ClientSession per request  vs  one pooled    (through F, mixed, concurrency 1)
  batching     C (batching off)  vs  A (batching on)            (direct, set corpus, concurrency 4)
  concurrency  through F at 1, 2, 4, 8                          (mixed corpus)
  coherence    x_coherence off  vs  cyclic on A                 (direct, the `ordered` corpus and the same
                                                                  requests with cyclic; warm L3, so the cost
                                                                  is the shift rows, not the state)

The A/B pairs are measured in interleaved rounds (a part of A, a part of B, and again) so drift in a
shared machine's load hits both sides alike. Apart from the `l3` group, each worker sees every
corpus entry once (unmeasured) before its runs, so measured requests meet the same warm caches.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .corpora import load_corpus
from .loadgen import Report, merge_reports, run_load
from .stack import REPO, Service, Stack, get_json, get_text

ALL_GROUPS = ("l3", "frontend", "pooling", "batching", "concurrency", "coherence")  # l3 first: it needs cold caches
CONCURRENCY_LEVELS = (1, 2, 4, 8)


@dataclass
class BenchConfig:
    requests: int = 32  # per variant (per concurrency level in the sweep)
    rounds: int = 4  # interleaved rounds per A/B pair
    groups: tuple[str, ...] = ALL_GROUPS
    worker_env: dict[str, str] = field(default_factory=dict)  # common env of every worker
    frontend_env: dict[str, str] = field(default_factory=dict)
    concurrency_levels: tuple[int, ...] = CONCURRENCY_LEVELS
    batching_concurrency: int = 4
    timeout_s: float = 120.0  # per request
    max_seconds: float = 300.0  # per measured load
    ready_timeout_s: float = 300.0


@dataclass
class WorkerDelta:
    """What the worker did during one measured load (from /v1/cache/stats and /metrics)."""

    l3_hits: int = 0
    l3_misses: int = 0
    batches: float = 0.0
    batch_requests: float = 0.0
    batch_rows: float = 0.0

    def add(self, other: WorkerDelta) -> None:
        for name in ("l3_hits", "l3_misses", "batches", "batch_requests", "batch_rows"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def l3_hit_rate(self) -> float | None:
        total = self.l3_hits + self.l3_misses
        return self.l3_hits / total if total else None

    @property
    def requests_per_batch(self) -> float | None:
        return self.batch_requests / self.batches if self.batches else None

    @property
    def rows_per_batch(self) -> float | None:
        return self.batch_rows / self.batches if self.batches else None

    def to_dict(self) -> dict:
        return {
            "l3_hits": self.l3_hits,
            "l3_misses": self.l3_misses,
            "l3_hit_rate": self.l3_hit_rate,
            "batches": self.batches,
            "requests_per_batch": self.requests_per_batch,
            "rows_per_batch": self.rows_per_batch,
        }


@dataclass
class Run:
    group: str
    variant: str
    path: str  # worker | frontend
    worker: str  # A | B | C
    corpus: str
    concurrency: int
    report: Report
    delta: WorkerDelta
    baseline: bool = False
    effect: dict = field(default_factory=dict)
    loadavg: float | None = None  # 1-minute load average after the run (our processes count too)

    def to_dict(self) -> dict:
        return {
            "group": self.group,
            "variant": self.variant,
            "path": self.path,
            "worker": self.worker,
            "corpus": self.corpus,
            "concurrency": self.concurrency,
            "baseline": self.baseline,
            "loadavg_1m": self.loadavg,
            "report": self.report.to_dict(with_latencies=True),
            "worker_delta": self.delta.to_dict(),
            "effect": self.effect,
        }


async def _worker_snapshot(worker: Service) -> dict:
    stats = await get_json(worker.url + "/v1/cache/stats")
    metrics = await get_text(worker.url + "/metrics")
    values = {}
    for line in metrics.splitlines():
        for name in ("jev_worker_batch_requests_sum", "jev_worker_batch_requests_count", "jev_worker_batch_rows_sum"):
            if line.startswith(name + " "):
                values[name] = float(line.split()[1])
    l3 = stats["levels"].get("l3", {})
    return {"l3_hits": l3.get("hits", 0), "l3_misses": l3.get("misses", 0), **values}


def _delta(before: dict, after: dict) -> WorkerDelta:
    def d(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    return WorkerDelta(
        l3_hits=int(d("l3_hits")),
        l3_misses=int(d("l3_misses")),
        batches=d("jev_worker_batch_requests_count"),
        batch_requests=d("jev_worker_batch_requests_sum"),
        batch_rows=d("jev_worker_batch_rows_sum"),
    )


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def effect(run: Run, base: Run) -> dict:
    """How `run` differs from its group's baseline."""
    a, b = base.report, run.report
    out: dict = {}
    for q in ("p50", "p95", "p99", "mean"):
        x, y = getattr(a, f"{q}_ms"), getattr(b, f"{q}_ms")
        if x is not None and y is not None:
            out[f"{q}_delta_ms"] = y - x
            out[f"{q}_ratio"] = y / x if x > 0 else None
    if a.decisions_per_s > 0:
        out["throughput_ratio"] = b.decisions_per_s / a.decisions_per_s
    return out


class Suite:
    def __init__(self, config: BenchConfig, out_dir: Path, log: Callable[[str], None] = print):
        self.config = config
        self.out_dir = Path(out_dir)
        self.log = log
        self.runs: list[Run] = []
        self.services: dict[str, Service] = {}
        self._warmed: set[tuple[str, str]] = set()

    # ----- measuring ----------------------------------------------------------------------------
    async def _load(
        self,
        target: Service,
        worker: Service,
        corpus: list[dict],
        *,
        concurrency: int,
        requests: int,
        pooled: bool = True,
        offset: int = 0,
    ) -> tuple[Report, WorkerDelta]:
        before = await _worker_snapshot(worker)
        report = await run_load(
            target.url,
            corpus,
            concurrency=concurrency,
            requests=requests,
            pooled=pooled,
            timeout_s=self.config.timeout_s,
            max_seconds=self.config.max_seconds,
            offset=offset,
        )
        after = await _worker_snapshot(worker)
        return report, _delta(before, after)

    async def _prewarm(self, worker_name: str, corpus_name: str) -> None:
        """Send every corpus entry once (unmeasured), so measured runs meet warm caches."""
        if (worker_name, corpus_name) in self._warmed:
            return
        corpus = load_corpus(corpus_name)
        worker = self.services[worker_name]
        await run_load(
            worker.url,
            corpus,
            concurrency=1,
            requests=len(corpus),
            timeout_s=self.config.timeout_s,
            max_seconds=self.config.max_seconds,
        )
        self._warmed.add((worker_name, corpus_name))

    async def pair(self, group: str, corpus_name: str, concurrency: int, variants: list[tuple]) -> list[Run]:
        """variants: (label, target service, worker service, pooled[, corpus name: the variant's own]); the first is
        the baseline."""
        names = {label: rest[0] if rest else corpus_name for label, _t, _w, _p, *rest in variants}
        corpora = {label: load_corpus(name) for label, name in names.items()}
        total = self.config.requests
        rounds = max(1, min(self.config.rounds, total))
        sizes = [total // rounds + (1 if i < total % rounds else 0) for i in range(rounds)]
        reports: dict[str, list[Report]] = {label: [] for label, *_ in variants}
        deltas: dict[str, WorkerDelta] = {label: WorkerDelta() for label, *_ in variants}
        offset = 0  # each round continues through the corpus where the last one stopped
        for size in sizes:
            for label, target, worker, pooled, *_ in variants:
                report, delta = await self._load(
                    self.services[target],
                    self.services[worker],
                    corpora[label],
                    concurrency=concurrency,
                    requests=size,
                    pooled=pooled,
                    offset=offset,
                )
                reports[label].append(report)
                deltas[label].add(delta)
            offset += size
        runs = []
        for i, (label, target, worker, *_) in enumerate(variants):
            run = Run(
                group=group,
                variant=label,
                path="frontend" if target == "F" else "worker",
                worker=worker,
                corpus=names[label],
                concurrency=concurrency,
                report=merge_reports(reports[label]),
                delta=deltas[label],
                baseline=(i == 0),
            )
            runs.append(run)
        for run in runs[1:]:
            run.effect = effect(run, runs[0])
        for run in runs:
            run.loadavg = _loadavg()
            self.log(f"  {group:<12} {run.variant:<24} {run.report.summary()}")
        self.runs += runs
        return runs

    # ----- the groups ---------------------------------------------------------------------------
    async def group_frontend(self) -> None:
        await self._prewarm("A", "mixed")
        await self.pair(
            "frontend", "mixed", 1, [("direct to worker", "A", "A", True), ("through frontend", "F", "A", True)]
        )

    async def group_pooling(self) -> None:
        await self._prewarm("A", "mixed")
        await self.pair(
            "pooling",
            "mixed",
            1,
            [("new session per request", "F", "A", False), ("one pooled session", "F", "A", True)],
        )

    async def group_l3(self) -> None:
        # no prewarm: the first question about each state misses on both sides, as in real traffic
        await self.pair("l3", "shared-prefix", 1, [("L3 off", "B", "B", True), ("L3 on", "A", "A", True)])

    async def group_batching(self) -> None:
        await self._prewarm("A", "set")
        await self._prewarm("C", "set")
        await self.pair(
            "batching",
            "set",
            self.config.batching_concurrency,
            [("batching off", "C", "C", True), ("batching on", "A", "A", True)],
        )

    async def group_concurrency(self) -> None:
        await self._prewarm("A", "mixed")
        corpus = load_corpus("mixed")
        runs = []
        for c in self.config.concurrency_levels:
            report, delta = await self._load(
                self.services["F"], self.services["A"], corpus, concurrency=c, requests=max(self.config.requests, c)
            )
            run = Run(
                group="concurrency",
                variant=f"concurrency {c}",
                path="frontend",
                worker="A",
                corpus="mixed",
                concurrency=c,
                report=report,
                delta=delta,
                baseline=not runs,
            )
            if runs:
                run.effect = effect(run, runs[0])
            run.loadavg = _loadavg()
            runs.append(run)
            self.log(f"  {'concurrency':<12} {run.variant:<24} {report.summary()}")
        self.runs += runs

    async def group_coherence(self) -> None:
        await self._prewarm("A", "ordered")
        await self._prewarm("A", "ordered-cyclic")
        await self.pair(
            "coherence",
            "ordered",
            1,
            [("x_coherence off", "A", "A", True), ("x_coherence cyclic", "A", "A", True, "ordered-cyclic")],
        )

    # ----- the whole thing ----------------------------------------------------------------------
    async def run(self) -> None:
        groups = [g for g in ALL_GROUPS if g in self.config.groups]
        unknown = set(self.config.groups) - set(ALL_GROUPS)
        if unknown:
            raise ValueError(f"unknown groups {sorted(unknown)}; known: {', '.join(ALL_GROUPS)}")
        env = dict(self.config.worker_env)
        async with Stack(self.out_dir / "logs") as stack:
            started = time.perf_counter()
            self.services["A"] = await stack.worker("A", **env)
            if "l3" in groups:
                self.services["B"] = await stack.worker("B", **{**env, "JEV_CACHE_L3_BYTES": "0"})
            if "batching" in groups:
                self.services["C"] = await stack.worker("C", **{**env, "JEV_BATCHING": "0"})
            if {"frontend", "pooling", "concurrency"} & set(groups):
                self.services["F"] = await stack.frontend("F", self.services["A"].url, **self.config.frontend_env)
            self.log(f"started {', '.join(self.services)}; waiting for /health (models load in parallel)")
            await stack.wait_healthy(timeout_s=self.config.ready_timeout_s)
            self.log(f"all healthy after {time.perf_counter() - started:.1f} s")
            for name in groups:
                await getattr(self, f"group_{name}")()

    # ----- output -------------------------------------------------------------------------------
    def services_info(self) -> dict:
        keep = (
            "JEV_MODEL_PATH",
            "JEV_RECIPE",
            "JEV_BATCHING",
            "JEV_CACHE_L3_BYTES",
            "JEV_DEVICE",
            "JEV_DTYPE",
            "JEV_BACKEND_URL",
            "JEV_REDIS_URL",
        )
        return {
            name: {
                "module": s.module,
                "url": s.url,
                "ready_s": s.ready_s,
                "health": s.health,
                "env": {k: s.env[k] for k in keep if k in s.env},
            }
            for name, s in self.services.items()
        }


# ----- reporting ----------------------------------------------------------------------------------
def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _effect_text(run: Run) -> str:
    e = run.effect
    if run.baseline:
        return "baseline"
    if "p50_delta_ms" not in e:
        return "-"
    parts = [f"p50 {e['p50_delta_ms']:+.1f} ms (x{e['p50_ratio']:.2f})"]
    if "throughput_ratio" in e:
        parts.append(f"dec/s x{e['throughput_ratio']:.2f}")
    return ", ".join(parts)


TABLE_COLUMNS = (
    "group",
    "variant",
    "path",
    "corpus",
    "conc",
    "ok/sent",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "mean ms",
    "dec/s",
    "L3 hit",
    "req/batch",
    "rows/batch",
    "vs baseline",
)


def table_rows(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs:
        r, d = run.report, run.delta
        rows.append(
            [
                run.group,
                run.variant,
                run.path,
                run.corpus,
                str(run.concurrency),
                f"{r.ok}/{r.sent}",
                _ms(r.p50_ms),
                _ms(r.p95_ms),
                _ms(r.p99_ms),
                _ms(r.mean_ms),
                f"{r.decisions_per_s:.2f}",
                "-" if d.l3_hit_rate is None else f"{100 * d.l3_hit_rate:.0f}%",
                "-" if d.requests_per_batch is None else f"{d.requests_per_batch:.2f}",
                "-" if d.rows_per_batch is None else f"{d.rows_per_batch:.2f}",
                _effect_text(run),
            ]
        )
    return rows


def markdown_table(runs: list[Run]) -> str:
    rows = table_rows(runs)
    header = "| " + " | ".join(TABLE_COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"
    return "\n".join([header, rule] + ["| " + " | ".join(row) + " |" for row in rows])


def text_table(runs: list[Run]) -> str:
    rows = [list(TABLE_COLUMNS)] + table_rows(runs)
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment_info() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _git("rev-parse", "--short", "HEAD") or "unknown",
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    info["loadavg_1m"] = _loadavg()
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.is_available()
        if info["cuda"]:
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        info["torch"] = None
    return info


def plot_concurrency(runs: list[Run], path: Path, title: str) -> Path | None:
    sweep = [r for r in runs if r.group == "concurrency" and r.report.ok]
    if not sweep:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [r.concurrency for r in sweep]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for q, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
        ax.plot(levels, [getattr(r.report, f"{q}_ms") for r in sweep], style, label=f"{q} latency")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("client concurrency (through the frontend)")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, alpha=0.3)
    twin = ax.twinx()
    twin.plot(levels, [r.report.decisions_per_s for r in sweep], "kx-", alpha=0.6, label="decisions/s")
    twin.set_ylabel("decisions/s")
    lines = ax.get_legend_handles_labels()
    lines2 = twin.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_outputs(
    suite: Suite, out_dir: Path, meta: dict, stem: str = "results", plot_title: str = "latency vs concurrency"
) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "markdown": out_dir / f"{stem}.md"}
    data = {"meta": meta, "services": suite.services_info(), "runs": [r.to_dict() for r in suite.runs]}
    paths["json"].write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown_table(suite.runs) + "\n", encoding="utf-8")
    plot = plot_concurrency(suite.runs, out_dir / "latency_vs_concurrency.png", plot_title)
    if plot is not None:
        paths["plot"] = plot
    return paths


def run_suite_sync(config: BenchConfig, out_dir: Path, log: Callable[[str], None] = print) -> Suite:
    suite = Suite(config, out_dir, log)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(suite.run())
    return suite
