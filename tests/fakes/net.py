"""Loopback port helpers for tests."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def free_port() -> int:
    """A port that was free a moment ago (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so nobody else takes it) but never listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
