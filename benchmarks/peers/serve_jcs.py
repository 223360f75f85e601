"""jev-compatible-server on 127.0.0.1:$PEER_PORT, configured by its own env (DECISION_BACKEND, ...).

Its `main()` binds 0.0.0.0:8000; the benchmark serves on loopback only, so this builds the same app
(`create_app()`, which reads DECISION_BACKEND, DECISION_MODEL_PATH / DECISION_MODEL_ID,
DECISION_CONFIG, DECISION_MAX_BATCH_SIZE, DECISION_BATCH_WAIT_MS) and runs it with uvicorn as its
`main()` does, on another address. Nothing else is changed. Run in benchmarks/peers/.venv.
"""

from __future__ import annotations

import os

import uvicorn
from jev_compatible_server.app import create_app


def main() -> None:
    uvicorn.run(
        create_app(), host="127.0.0.1", port=int(os.environ["PEER_PORT"]), log_level="warning", access_log=False
    )


if __name__ == "__main__":
    main()
