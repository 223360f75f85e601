"""python -m jev_worker: serve one recipe's checkpoint (env: README worker table).

Before serving, the recipe's backend and readout must exist and its checkpoint must hold what the
readout needs; otherwise the worker exits with status 2 and a message naming what is missing."""

import logging
import sys

from jev_common.cpu import prefer_passive_waits
from jev_common.logs import no_progress_bars

prefer_passive_waits()  # before torch is imported (jev_common.cpu says why)
no_progress_bars()  # before tqdm is imported: the GGUF loader's bar is not a log line (jev_common.logs says why)

from jev_common.checkpoint_files import ServingError  # noqa: E402
from jev_common.gc_pauses import freeze_heap  # noqa: E402
from jev_common.http import run_app  # noqa: E402
from jev_common.logs import setup_logging  # noqa: E402

from .app import SERVICE, create_app  # noqa: E402
from .serving import preflight  # noqa: E402
from .settings import WorkerSettings  # noqa: E402


def main() -> None:
    setup_logging("jev.worker")
    settings = WorkerSettings.from_env()
    try:
        preflight(settings.recipe, settings.model_path)
    except ServingError as exc:
        logging.getLogger("jev.worker").error("cannot serve %s: %s", settings.recipe.name, exc)
        print(f"jev_worker: cannot serve {settings.recipe.name}: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.setswitchinterval(settings.gil_switch_ms / 1000)  # the model thread gets the interpreter back soon
    app = create_app(settings, on_ready=freeze_loaded_heap)
    run_app(app, settings.host, settings.port, on_stop=lambda: app[SERVICE].drain(settings.shutdown_grace_s))


def freeze_loaded_heap() -> None:
    """The loaded model out of the garbage collector's walks (jev_common.gc_pauses says why)."""
    logging.getLogger("jev.worker").info("froze %d start-up objects out of the collector's walks", freeze_heap())


if __name__ == "__main__":
    main()
