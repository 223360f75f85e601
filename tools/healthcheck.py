"""Container health probe: exit 0 when URL answers 2xx within the timeout, else 1.

    python -m tools.healthcheck [URL] [--timeout S]

URL defaults to $JEV_HEALTH_URL, else http://127.0.0.1:8000/health (the worker). Standard library only,
so it runs in every image (the Dockerfiles' HEALTHCHECK and docker-compose.yml's healthchecks use it).
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/health"


def probe(url: str, timeout: float = 3.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback probe
            return 200 <= response.status < 300, f"{response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return False, f"unreachable: {getattr(exc, 'reason', exc)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.healthcheck")
    parser.add_argument("url", nargs="?", default=os.environ.get("JEV_HEALTH_URL", DEFAULT_URL))
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    ok, detail = probe(args.url, args.timeout)
    print(f"{args.url}: {detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
