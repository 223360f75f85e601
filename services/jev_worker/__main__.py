"""python -m jev_worker: serve one recipe's checkpoint (env: README worker table)."""
from jev_common.http import run_app
from jev_common.logs import setup_logging

from .app import create_app
from .settings import WorkerSettings


def main() -> None:
    setup_logging("jev.worker")
    settings = WorkerSettings.from_env()
    run_app(create_app(settings), settings.host, settings.port)


if __name__ == "__main__":
    main()
