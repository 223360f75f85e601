"""The Grafana dashboard (deploy/grafana/jev-dashboard.json), rendered from the panels below: one place for its
queries, which tests/unit/test_grafana_dashboard.py checks (every query parses, every metric is one a running stack
exports).

    python -m tools.grafana_dashboard --write    # rewrite deploy/grafana/jev-dashboard.json
    python -m tools.grafana_dashboard --check    # exit 1 when the JSON differs from what this renders

Per model (the `model` variable: the label every worker series carries), with the frontend's routing. Every query
names its job (jev-frontend, jev-worker, jev-preencoder): the frontend's /metrics re-exports its workers' series,
which would otherwise count twice.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "grafana" / "jev-dashboard.json"
CHART_COPY = ROOT / "deploy" / "helm" / "jev" / "files" / "jev-dashboard.json"  # a copy: helm warns on links
UID = "jev-overview"

W = 'job="jev-worker",model=~"$model"'  # the worker series of the chosen models
F = 'job="jev-frontend"'
P = 'job="jev-preencoder"'
RATE = "[$__rate_interval]"


def quantiles(metric: str, selector: str, by: str, qs=(0.5, 0.99)) -> list[tuple[str, str]]:
    """histogram_quantile targets: (expr, legend) per quantile."""
    grouping = f"{by}, le" if by else "le"
    return [
        (
            f"histogram_quantile({q}, sum by ({grouping}) (rate({metric}_bucket{{{selector}}}{RATE})))",
            f"p{round(q * 100)} {{{{{by}}}}}" if by else f"p{round(q * 100)}",
        )
        for q in qs
    ]


def ratio(metric: str, selector: str, part: str, by: str) -> str:
    """The share of `metric`'s rate whose labels also match `part`, per `by` (0 when none did)."""
    total = f"sum by ({by}) (rate({metric}{{{selector}}}{RATE}))"
    return f"(sum by ({by}) (rate({metric}{{{selector},{part}}}{RATE})) or 0 * {total}) / {total}"


def mean(metric: str, selector: str, by: str) -> str:
    """A histogram's mean per `by`: the rate of its sum over the rate of its count."""
    total = f"sum by ({by}) (rate({metric}_sum{{{selector}}}{RATE}))"
    return f"{total} / sum by ({by}) (rate({metric}_count{{{selector}}}{RATE}))"


def hit_ratio(selector: str) -> str:
    hits = f"sum by (level) (rate(jev_worker_cache_hits_total{{{selector}}}{RATE}))"
    misses = f"sum by (level) (rate(jev_worker_cache_misses_total{{{selector}}}{RATE}))"
    return f"{hits} / ({hits} + {misses})"


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"
    width: int = 8
    options: dict = field(default_factory=dict)


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Traffic",
        [
            Panel(
                "Decisions/s by model",
                [(f"sum by (model) (rate(jev_worker_decisions_total{{{W}}}{RATE}))", "{{model}}")],
                "reqps",
                "Requests that passed the workers' admission, every outcome (jev_worker_decisions_total).",
            ),
            Panel(
                "Decisions/s by outcome",
                [(f"sum by (model, outcome) (rate(jev_worker_decisions_total{{{W}}}{RATE}))", "{{model}} {{outcome}}")],
                "reqps",
            ),
            Panel(
                "Frontend answers/s by status",
                [
                    (
                        f'sum by (status) (rate(jev_frontend_http_requests_total{{{F},route="/v1/systemone"}}{RATE}))',
                        "{{status}}",
                    )
                ],
                "reqps",
                "What callers get at the edge: POST /v1/systemone by HTTP status.",
            ),
            Panel(
                "Targets up",
                [
                    ('sum(up{job="jev-frontend"})', "frontends"),
                    ('sum(up{job="jev-worker"})', "workers"),
                    ('sum(up{job="jev-preencoder"})', "preencoders"),
                ],
                kind="stat",
            ),
        ],
    ),
    (
        "Latency",
        [
            Panel(
                "Decision latency in the worker",
                quantiles("jev_worker_decision_seconds", W, "model", (0.5, 0.9, 0.99)),
                "s",
                "Admission to answer inside the worker (jev_worker_decision_seconds).",
            ),
            Panel(
                "Latency at the frontend",
                quantiles("jev_frontend_http_request_seconds", f'{F},route="/v1/systemone"', ""),
                "s",
                "POST /v1/systemone as callers see it, the frontend's proxying included.",
            ),
            Panel(
                "The frontend's own time per decision",
                quantiles("jev_frontend_overhead_seconds", F, ""),
                "s",
                "From its handler's start to the answer, less the backend call (jev_frontend_overhead_seconds).",
            ),
            Panel(
                "Backend call latency by backend (p99)",
                quantiles("jev_frontend_route_request_seconds", F, "backend", (0.99,)),
                "s",
            ),
        ],
    ),
    (
        "Errors",
        [
            Panel(
                "5xx share by model",
                [
                    (
                        ratio("jev_worker_http_requests_total", f'{W},route="/v1/systemone"', 'status=~"5.."', "model"),
                        "{{model}}",
                    )
                ],
                "percentunit",
                "The workers' POST /v1/systemone answered 5xx (alert JevErrorRatioHigh over 5%).",
            ),
            Panel(
                "429 share by model",
                [
                    (
                        ratio("jev_worker_http_requests_total", f'{W},route="/v1/systemone"', 'status="429"', "model"),
                        "{{model}}",
                    )
                ],
                "percentunit",
                "Refused: the queue full or a client past its share (alert JevTooManyRequests over 5%).",
            ),
            Panel(
                "Frontend backend errors/s by type",
                [(f"sum by (type) (rate(jev_frontend_backend_errors_total{{{F}}}{RATE}))", "{{type}}")],
                "reqps",
                "Backend calls that failed: backend_unavailable (refused, broken) or backend_timeout.",
            ),
        ],
    ),
    (
        "Queue",
        [
            Panel(
                "Queue depth by worker",
                [
                    (f"jev_worker_queue_depth{{{W}}}", "{{instance}}"),
                    (f"max by (model) (jev_worker_queue_limit{{{W}}})", "limit {{model}}"),
                ],
                "short",
                "Requests queued or running; past the limit (JEV_MAX_QUEUE) they are refused 429.",
            ),
            Panel(
                "In flight from the frontend by backend",
                [(f"jev_frontend_route_in_flight{{{F}}}", "{{backend}}")],
            ),
            Panel(
                "Rows by fate",
                [(f"sum by (event) (rate(jev_worker_flight_rows_total{{{W}}}{RATE}))", "{{event}}")],
                "short",
                "computed = answered + unwanted; joined: single flight; abandoned rows stopped between layers.",
            ),
            Panel(
                "Abandoned rows/s",
                [(f"sum by (model) (rate(jev_worker_abandoned_rows_total{{{W}}}{RATE}))", "{{model}}")],
            ),
        ],
    ),
    (
        "Caches",
        [
            Panel(
                "Hit ratio by level (L1 prompts, L2 images, L3 prefix states)",
                [
                    (
                        hit_ratio(W),
                        "{{level}}",
                    )
                ],
                "percentunit",
            ),
            Panel(
                "Resident bytes by level",
                [(f"sum by (level) (jev_worker_cache_resident_bytes{{{W}}})", "{{level}}")],
                "bytes",
            ),
            Panel(
                "Evictions/s by level",
                [(f"sum by (level) (rate(jev_worker_cache_evictions_total{{{W}}}{RATE}))", "{{level}}")],
            ),
            Panel(
                "Prompt tokens/s (cached: read from L3)",
                [(f"sum by (source) (rate(jev_worker_tokens_total{{{W}}}{RATE}))", "{{source}}")],
            ),
        ],
    ),
    (
        "Batches",
        [
            Panel(
                "Mean batch size",
                [
                    (
                        mean("jev_worker_batch_rows", W, "model"),
                        "rows {{model}}",
                    ),
                    (
                        mean("jev_worker_batch_requests", W, "model"),
                        "requests {{model}}",
                    ),
                ],
            ),
            Panel(
                "Rows per batch (p50, p90)",
                quantiles("jev_worker_batch_rows", W, "model", (0.5, 0.9)),
            ),
            Panel(
                "Batches/s",
                [(f"sum by (model) (rate(jev_worker_batch_rows_count{{{W}}}{RATE}))", "{{model}}")],
                "ops",
            ),
        ],
    ),
    (
        "Device and stages",
        [
            Panel(
                "Model time per batch",
                quantiles("jev_worker_forward_seconds", W, "model"),
                "s",
                "The runner's whole run of a batch on the model thread (jev_worker_forward_seconds).",
            ),
            Panel(
                "Mean time per stage",
                [(mean("jev_worker_stage_seconds", W, "stage"), "{{stage}}")],
                "s",
                "Where a decision's time goes, back to back: parse, asset, prepare, queue, batch, device, readout, "
                "respond (jev_worker_stage_seconds; a trace shows the same stages as spans).",
            ),
            Panel(
                "Device busy",
                [(f"sum by (instance) (rate(jev_worker_device_seconds_total{{{W}}}{RATE}))", "{{instance}}")],
                "percentunit",
                "The share of time the device ran batches (jev_worker_device_seconds).",
            ),
            Panel(
                "CUDA graphs: replays and eager fallbacks/s",
                [
                    (f"sum by (model) (rate(jev_worker_graph_replays_total{{{W}}}{RATE}))", "replays {{model}}"),
                    (f"sum by (reason) (rate(jev_worker_graph_fallbacks_total{{{W}}}{RATE}))", "eager: {{reason}}"),
                ],
                "ops",
                "Only where graphs are on (JEV_CUDA_GRAPHS).",
            ),
            Panel(
                "L3 reuse decisions/s",
                [(f"sum by (decision) (rate(jev_worker_l3_reuse_decisions_total{{{W}}}{RATE}))", "{{decision}}")],
                "ops",
                "L3 hits used (reuse) or recomputed (the measured policy found it cheaper).",
            ),
            Panel(
                "Health: stalled, progress age, event loop lag",
                [
                    (f"max by (instance) (jev_worker_stalled{{{W}}})", "stalled {{instance}}"),
                    (f"max by (instance) (jev_worker_progress_age_seconds{{{W}}})", "progress age {{instance}}"),
                    (f"max by (instance) (jev_worker_event_loop_lag_seconds{{{W}}})", "loop lag {{instance}}"),
                ],
                "s",
                "Stalled is 1 while no layer finished for JEV_STALL_S during a batch (alert JevWorkerStalled).",
            ),
        ],
    ),
    (
        "Routing (frontend)",
        [
            Panel(
                "Routing decisions/s",
                [
                    (
                        f'sum by (decision) (rate(jev_frontend_route_requests_total{{{F},model=~"$model"}}{RATE}))',
                        "{{decision}}",
                    )
                ],
                "reqps",
                "warm (prefix resident), affinity, l2 (image held), load (overflow), cold (two choices), ...",
            ),
            Panel(
                "Backends in rotation by model",
                [(f'sum by (model) (jev_frontend_route_backend_up{{{F},model=~"$model"}})', "{{model}}")],
                "short",
                "0 for a model fires JevNoHealthyBackend.",
            ),
            Panel(
                "Redis (cache index) reachable",
                [
                    (f"min by (instance) (jev_frontend_index_up{{{F}}})", "frontend {{instance}}"),
                    (f"min by (instance) (jev_worker_index_up{{{W}}})", "worker {{instance}}"),
                    (f"min by (instance) (jev_preencoder_index_up{{{P}}})", "preencoder {{instance}}"),
                ],
                "short",
                "1 while the service's latest index call reached Redis (alert JevRedisUnreachable).",
            ),
        ],
    ),
    (
        "Preencoder",
        [
            Panel(
                "Images/s by outcome",
                [(f"sum by (status) (rate(jev_preencoder_images_total{{{P}}}{RATE}))", "{{status}}")],
            ),
            Panel(
                "Encode time per request",
                quantiles("jev_preencoder_request_encode_seconds", P, ""),
                "s",
            ),
        ],
    ),
]


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    out = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": panel.options
        or ({"legend": {"displayMode": "list", "placement": "bottom"}} if panel.kind == "timeseries" else {}),
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "expr": expr,
                "legendFormat": legend,
            }
            for i, (expr, legend) in enumerate(panel.targets)
        ],
    }
    if panel.description:
        out["description"] = panel.description
    return out


def dashboard() -> dict:
    panels, y, next_id = [], 0, 1
    for title, row in ROWS:
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id, y, x = next_id + 1, y + 1, 0
        for panel in row:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(panel, next_id, x, y))
            next_id, x = next_id + 1, x + panel.width
        y += 8
    return {
        "uid": UID,
        "title": "jev: decisions per model",
        "description": "Traffic, latency, errors, queues, caches, batches, device and the frontend's routing per model "
        "(docs/operations.md). Generated by tools/grafana_dashboard.py.",
        "tags": ["jev"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                {
                    "name": "model",
                    "label": "Model",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": {
                        "query": 'label_values(jev_worker_decisions_total{job="jev-worker"}, model)',
                        "refId": "models",
                    },
                    "definition": 'label_values(jev_worker_decisions_total{job="jev-worker"}, model)',
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "sort": 1,
                    "hide": 0,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite {OUT.relative_to(ROOT)} and the chart's copy")
    mode.add_argument("--check", action="store_true", help="exit 1 when the file differs from what this renders")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        for out in (OUT, CHART_COPY):
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        return 0
    stale = [out for out in (OUT, CHART_COPY) if not out.is_file() or out.read_text() != text]
    for out in stale:
        print(f"{out.relative_to(ROOT)} is not what tools/grafana_dashboard.py renders: run --write", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
