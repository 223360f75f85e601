"""The status a request ended with, as every observer reports it (the metrics' counters and the trace's server span):
the answer's status; an HTTP exception's; 499 where the caller left before its answer (nginx's "client closed
request": no answer was sent and nothing failed here, so no 5xx and no error); 500 for anything else raised."""

from __future__ import annotations

import asyncio

from aiohttp import web

CLIENT_CLOSED = 499


def status_of(outcome: web.StreamResponse | BaseException) -> int:
    """The status of a handler's outcome: the response it returned, or what it raised."""
    if isinstance(outcome, web.StreamResponse):  # web.HTTPException is one too
        return outcome.status
    if isinstance(outcome, asyncio.CancelledError):
        return CLIENT_CLOSED
    return 500


def is_error(status: int) -> bool:
    """A server error: what a trace marks an error and alerts count (a caller that left, 499, is not one)."""
    return status >= 500
