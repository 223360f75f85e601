"""A small fake worker (no model) that speaks the worker HTTP contract of docs/CONTRACTS.md.

Answers are computed deterministically from the request (a softmax over option lengths plus a stable
per-option hash), so different requests get different, reproducible decisions. A per-request
"prompt cache" makes a repeated identical request report cached tokens, like the real worker.

In process (knobs are plain attributes and may be changed while it runs):

    fake = FakeWorker(delay_s=0.5)
    async with fake as url:          # http://127.0.0.1:<free port>
        fake.healthy = False

As a process (prints one line `FAKE_WORKER_URL=http://host:port` on stdout when it is serving; stops
cleanly on SIGTERM/SIGINT):

    python -m tests.fakes.fake_worker --port 0 --delay 2 --error-status 429

Knobs can also be changed over HTTP: `POST /fake/config` with a JSON object of knob names, e.g.
`{"healthy": false, "delay_s": 3}`; `GET /fake/config` shows them.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import signal
import sys
import time
import zlib
from dataclasses import asdict, dataclass, fields

from aiohttp import web
from prometheus_client import Counter

from jev_common.errors import HTTP_ERROR_TYPES, ApiError, error_body, validation_error
from jev_common.http import error_middleware, parse_model, read_json, request_id_middleware
from jev_common.metrics import HttpMetrics
from jev_common.schema import (
    LATEST_ALIAS,
    CacheLevelStats,
    CacheStats,
    ChoiceAnswer,
    DecisionRequest,
    DecisionResponse,
    HealthResponse,
    ModelInfo,
    ModelList,
    NoulAnswer,
    ScoreAnswer,
    SetAnswer,
    Span,
    SpanAnswer,
    State,
    SystemOneRequest,
    SystemOneResponse,
    SystemOneUsage,
    Usage,
    choice_confidence,
    is_envelope,
    score_confidence,
)

MAX_BODY_BYTES = 16 << 20


@dataclass
class Knobs:
    healthy: bool = True
    delay_s: float = 0.0  # before answering /v1/systemone
    health_delay_s: float = 0.0  # before answering /health
    error_status: int | None = None  # answer /v1/systemone with this status and the error envelope
    model: str = "fake-worker"
    logit_scale: float = 1.0  # a second fake with another scale gives deliberately different answers
    cache: bool = True  # repeated identical requests report cached_tokens
    worker_id: str = "fake-0"


def _softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def _logits(request: DecisionRequest, scale: float) -> list[float]:
    return [
        scale * (len(option) + (zlib.crc32(f"{request.question}\x00{option}".encode()) % 1009) / 100) / 4.0
        for option in request.options
    ]


def _hash_logit(*parts: object, scale: float = 1.0) -> float:
    digest = zlib.crc32(json.dumps(parts, sort_keys=True, default=str).encode())
    return scale * ((digest % 10007) / 10007 * 6 - 3)


def envelope_answer(state: object, question, scale: float):
    text = question.instructions
    if question.type == "noul":
        return NoulAnswer(noul=1 / (1 + math.exp(-_hash_logit(state, text, question.model_dump(), scale=scale))))
    if question.type == "score":
        probs = _softmax([_hash_logit(state, text, i, level, scale=scale) for i, level in enumerate(question.criteria)])
        return ScoreAnswer(
            score=sum(i * p for i, p in enumerate(probs)),
            legend={str(i): level for i, level in enumerate(question.criteria)},
            probabilities={str(i): p for i, p in enumerate(probs)},
            confidence=score_confidence(probs),
        )
    names = list(question.criteria)
    probs = _softmax([_hash_logit(state, text, name, scale=scale) for name in names])
    if question.type == "set":
        return SetAnswer(selected=[n for n, p in zip(names, probs) if p >= 0.5], probabilities=dict(zip(names, probs)))
    best = max(range(len(names)), key=probs.__getitem__)
    if question.type == "span":
        start = str(state).index(names[best])
        return SpanAnswer(
            span=Span(start=start, end=start + len(names[best]), text=names[best]),
            probabilities=dict(zip(names, probs)),
            confidence=choice_confidence(probs),
        )
    return ChoiceAnswer(choice=names[best], probabilities=dict(zip(names, probs)), confidence=choice_confidence(probs))


def _cache_key(request: DecisionRequest) -> str:
    payload = request.model_dump(exclude={"request_id", "deadline_s"})
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def decide(request: DecisionRequest, knobs: Knobs, cached: bool, elapsed: float) -> DecisionResponse:
    """The fake decision for a request (pure apart from `cached` and `elapsed`)."""
    logits = _logits(request, knobs.logit_scale)
    words = len((request.state.text or "").split()) + len(request.question.split())
    prompt_tokens = words + sum(len(o.split()) for o in request.options) + 8
    extra: dict = {}
    if request.kind == "noul":
        joint = _softmax(logits + [sum(logits) / len(logits)])
        probabilities, noul = joint[:-1], joint[-1]
        extra["noul"] = noul
        best = max(range(len(probabilities)), key=probabilities.__getitem__)
        choice_index = None if noul > probabilities[best] else best
    elif request.kind == "set":
        mean = sum(logits) / len(logits)
        yes = [1.0 / (1.0 + math.exp(-(x - mean))) for x in logits]
        probabilities = [y / sum(yes) for y in yes]
        extra["yes_probabilities"] = yes
        extra["selected"] = [i for i, y in enumerate(yes) if y >= 0.5]
        choice_index = max(range(len(probabilities)), key=probabilities.__getitem__)
    else:
        probabilities = _softmax(logits)
        choice_index = max(range(len(probabilities)), key=probabilities.__getitem__)
        if request.kind == "score":
            extra["score"] = sum(p * float(o) for p, o in zip(probabilities, request.options))
        elif request.kind == "span":
            chosen = request.options[choice_index]
            start = (request.state.text or "").find(chosen)
            extra["span"] = Span(start=start, end=start + len(chosen), text=chosen)
    return DecisionResponse(
        request_id=request.request_id,
        kind=request.kind,
        model=knobs.model,
        probabilities=probabilities,
        choice_index=choice_index,
        choice=None if choice_index is None else request.options[choice_index],
        usage=Usage(prompt_tokens=prompt_tokens, cached_tokens=prompt_tokens if cached else 0),
        elapsed_seconds=elapsed,
        **extra,
    )


class FakeWorker:
    """The fake worker app plus a loopback server for it. `async with` yields the base URL."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, shutdown_timeout: float = 0.5, **knobs):
        self.host = host
        self.port = port
        self.shutdown_timeout = shutdown_timeout  # how long stop() lets in-flight (delayed) answers finish
        self.knobs = Knobs(**knobs)
        self.seen: set[str] = set()
        self.hits = 0
        self.misses = 0
        self.received = 0  # /v1/systemone requests that arrived, valid or not
        self.requests: list[dict] = []  # the valid ones, parsed
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        self.metrics = HttpMetrics("worker")
        self.decisions = Counter(
            "jev_worker_decisions_total", "Decisions answered by kind", ["kind"], registry=self.metrics.registry
        )

    # Knobs read and written as attributes of the worker itself: fake.healthy = False.
    def __getattr__(self, name):
        knobs = self.__dict__.get("knobs")
        if knobs is not None and name in {f.name for f in fields(Knobs)}:
            return getattr(knobs, name)
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name in {f.name for f in fields(Knobs)}:
            setattr(self.knobs, name, value)
        else:
            super().__setattr__(name, value)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[request_id_middleware, self.metrics.middleware, error_middleware])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/systemone", self._systemone)
        app.router.add_get("/metrics", self.metrics.handle_metrics)
        app.router.add_get("/v1/cache/stats", self._cache_stats)
        app.router.add_post("/v1/cache/reset", self._cache_reset)
        app.router.add_get("/fake/config", self._get_config)
        app.router.add_post("/fake/config", self._set_config)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=self.shutdown_timeout)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # --- handlers -------------------------------------------------------------------------------
    async def _health(self, _request: web.Request) -> web.Response:
        if self.knobs.health_delay_s:
            await asyncio.sleep(self.knobs.health_delay_s)
        if not self.knobs.healthy:  # like the worker: the error envelope plus a HealthResponse
            detail = {"fake": True, **error_body("not_ready", "fake worker is configured unhealthy")["detail"]}
            body = HealthResponse(status="unavailable", detail=detail).model_dump()
            return web.json_response(body, status=503)
        body = HealthResponse(
            status="ok", detail={"model": self.knobs.model, "fake": True, "worker_id": self.knobs.worker_id}
        )
        return web.json_response(body.model_dump())

    async def _systemone(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        headers = {"x-jev-worker": self.knobs.worker_id}
        self.received += 1
        payload = await read_json(request, MAX_BODY_BYTES)
        if is_envelope(payload):
            return await self._envelope(parse_model(SystemOneRequest, payload), headers)
        decision = parse_model(DecisionRequest, payload)
        if not isinstance(decision.state, State) or decision.options is None:  # as a label-token worker refuses
            raise validation_error(
                "this fake reads the single-question form with options and a text or {text, image} state", ("state",)
            )
        await self._take(decision.model_dump(exclude_none=True), headers)
        key = _cache_key(decision)
        cached = self.knobs.cache and key in self.seen
        if self.knobs.cache:
            self.seen.add(key)
        if cached:
            self.hits += 1
        else:
            self.misses += 1
        headers["x-jev-cache"] = "l1=hit" if cached else "l1=miss"
        self.decisions.labels(decision.kind).inc()
        answer = decide(decision, self.knobs, cached, time.perf_counter() - started)
        # Like the worker: kind-specific fields only when they apply, choice_index/choice always.
        body = answer.model_dump(mode="json", exclude_none=True)
        body.setdefault("choice_index", None)
        body.setdefault("choice", None)
        return web.json_response(body, headers=headers)

    async def _take(self, request: dict, headers: dict) -> None:
        """Record a decision request, then misbehave as the knobs say (delay, a configured error)."""
        self.requests.append(request)
        if self.knobs.delay_s:
            await asyncio.sleep(self.knobs.delay_s)
        if self.knobs.error_status is not None:
            status = self.knobs.error_status
            raise ApiError(
                status,
                HTTP_ERROR_TYPES.get(status, "fake_error"),
                f"fake worker is configured to answer {status}",
                headers,
            )

    async def _envelope(self, request: SystemOneRequest, headers: dict) -> web.Response:
        """The System One envelope: deterministic answers from a hash of (state, question), never of the
        question id, the other questions or their order (like a real model)."""
        await self._take(request.model_dump(exclude_none=True), headers)
        answers = {
            qid: envelope_answer(request.state, question, self.knobs.logit_scale)
            for qid, question in request.questions.items()
        }
        self.decisions.labels("systemone").inc()
        response = SystemOneResponse(
            model=self.knobs.model,
            answers=answers,
            usage=SystemOneUsage(input_tokens=len(str(request.state)), output_tokens=0),
        )
        return web.json_response(text=response.model_dump_json(), headers=headers)

    async def _models(self, _request: web.Request) -> web.Response:
        models = ModelList(
            models=[
                ModelInfo(name=self.knobs.model, description="fake", release_date="unknown"),
                ModelInfo(name=LATEST_ALIAS, description="alias", release_date="unknown"),
            ]
        )
        return web.json_response(models.model_dump())

    def cache_stats(self) -> CacheStats:
        level = CacheLevelStats(
            enabled=self.knobs.cache, hits=self.hits, misses=self.misses, resident_entries=len(self.seen), budget=4096
        )
        return CacheStats(enabled=self.knobs.cache, levels={"l1": level})

    async def _cache_stats(self, _request: web.Request) -> web.Response:
        return web.json_response(self.cache_stats().model_dump())

    async def _cache_reset(self, _request: web.Request) -> web.Response:
        self.seen.clear()
        self.hits = self.misses = 0
        return web.json_response(self.cache_stats().model_dump())

    async def _get_config(self, _request: web.Request) -> web.Response:
        return web.json_response(asdict(self.knobs))

    async def _set_config(self, request: web.Request) -> web.Response:
        update = await read_json(request, 1 << 16)
        names = {f.name for f in fields(Knobs)}
        if not isinstance(update, dict) or not set(update) <= names:
            raise ApiError(422, "validation_error", f"expected an object with keys among {sorted(names)}")
        for name, value in update.items():
            setattr(self.knobs, name, value)
        return web.json_response(asdict(self.knobs))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.fake_worker", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (see the FAKE_WORKER_URL line)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before answering /v1/systemone")
    parser.add_argument("--health-delay", type=float, default=0.0, help="seconds before answering /health")
    parser.add_argument("--unhealthy", action="store_true", help="/health answers 503 not_ready")
    parser.add_argument("--error-status", type=int, default=None, help="answer /v1/systemone with this status")
    parser.add_argument("--model", default="fake-worker")
    parser.add_argument("--logit-scale", type=float, default=1.0)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--worker-id", default="fake-0")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    fake = FakeWorker(
        host=args.host,
        port=args.port,
        healthy=not args.unhealthy,
        delay_s=args.delay,
        health_delay_s=args.health_delay,
        error_status=args.error_status,
        model=args.model,
        logit_scale=args.logit_scale,
        cache=not args.no_cache,
        worker_id=args.worker_id,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    url = await fake.start()
    print(f"FAKE_WORKER_URL={url}", flush=True)
    try:
        await stop.wait()
    finally:
        await fake.stop()


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
