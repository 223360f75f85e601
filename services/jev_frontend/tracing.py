"""The frontend's spans (jev_common.tracing): the request's server span (the middleware), `route` (which replica and
why: the router's decision, in words), and `proxy` (the call to the worker, carrying the trace on in its
`traceparent`). Off, each hook is one attribute test."""

from __future__ import annotations

import contextlib

from jev_common.tracing import Tracing

# the router's decisions (router.Route.decision), said as a reason
REASONS = {
    "warm": "the state's prefix is resident on this replica (the cache index)",
    "affinity": "this frontend sent the same state to this replica recently",
    "l2": "this replica holds one of the request's images in L2",
    "load": "the replica the state prefers is overloaded: the least loaded instead",
    "cold": "no replica is warm for the state: the less loaded of two at random",
    "round_robin": "round-robin routing: the next replica in turn",
    "only": "the only replica of the model in rotation",
    "down": "every replica is out of rotation: the one out the longest",
    "single": "one backend (JEV_BACKEND_URL): no routing",
}


class _Off:
    """What a hook yields when tracing is off: its methods do nothing."""

    def chose(self, *args, **kwargs) -> None:
        pass

    def answered(self, status: int) -> None:
        pass


OFF = _Off()
OFF_CONTEXT = contextlib.nullcontext(OFF)  # what a hook returns when tracing is off: no generator, no span


class _Routing:
    def __init__(self, span):
        self.span = span

    def chose(self, decision: str, backend, tried: int = 0) -> None:
        """The replica chosen (a pool.BackendState) and why; `tried`: replicas already tried for this request."""
        self.span.set_attributes(
            {
                "jev.route.decision": decision,
                "jev.route.reason": REASONS.get(decision, decision),
                "jev.route.backend": backend.url,
                "jev.route.backend_load": backend.load,
                "jev.route.tried": tried,
            }
        )


class _Proxy:
    def __init__(self, span):
        self.span = span

    def answered(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)


class FrontendSpans:
    def __init__(self, tracing: Tracing):
        self.tracing = tracing

    @property
    def enabled(self) -> bool:
        return self.tracing.enabled

    def middlewares(self) -> list:
        return self.tracing.middlewares()

    def routing(self, model: str | None):
        """A context yielding the recorder of the routing decision."""
        return self._routing(model) if self.tracing.enabled else OFF_CONTEXT

    def proxy(self, url: str, method: str, path: str, headers: dict[str, str]):
        """A context around the call to a backend, its traceparent added to `headers`; yields its recorder."""
        return self._proxy(url, method, path, headers) if self.tracing.enabled else OFF_CONTEXT

    @contextlib.contextmanager
    def _routing(self, model: str | None):
        with self.tracing.span("route", **{"jev.model": model or ""}) as span:
            yield _Routing(span)

    @contextlib.contextmanager
    def _proxy(self, url: str, method: str, path: str, headers: dict[str, str]):
        attributes = {"http.request.method": method, "url.full": url + path, "jev.backend": url}
        with self.tracing.span("proxy", kind="client", **attributes) as span:
            self.tracing.inject(headers)
            yield _Proxy(span)

    async def shutdown(self) -> None:
        await self.tracing.shutdown()
