"""`python -m jev_frontend`: serve the frontend on JEV_FRONTEND_HOST:JEV_FRONTEND_PORT."""

from __future__ import annotations

import sys

from jev_common.http import run_app
from jev_common.logs import setup_logging

from .app import create_app
from .settings import Settings


def main() -> int:
    log = setup_logging("jev_frontend")
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        log.error("bad configuration: %s", exc)
        return 2
    log.info("frontend listening on %s:%d, backend %s", settings.host, settings.port, settings.backend_url)
    run_app(create_app(settings), settings.host, settings.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
