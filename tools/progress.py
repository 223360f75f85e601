"""Run one quiet, slow command (a pip install) with a progress line every few seconds.

    python3 tools/progress.py "installing dev requirements" -- .venv/bin/python -m pip install -r ...

Prints `LABEL: ... N s` every --every seconds (default 5) while the command runs, then `LABEL: done
in N s`; on failure the command's last output lines and its exit status. The command's output goes
to a temporary file, not the terminal. Standard library only: it runs before the venv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time


def _say(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(message, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/progress.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("label")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between progress lines")
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" not in argv:
        parser.error("the command follows -- (LABEL [--every S] -- COMMAND ...)")
    cut = argv.index("--")
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    if not command:
        parser.error("no command given after --")
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )

        def stop(signum, _frame):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            _say(f"{args.label}: interrupted after {time.monotonic() - started:.0f} s")
            sys.exit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, stop)
        _say(f"{args.label}: started ({' '.join(command[:4])} ...)")
        while True:
            try:
                code = proc.wait(timeout=args.every)
                break
            except subprocess.TimeoutExpired:
                _say(f"{args.label}: ... {time.monotonic() - started:.0f} s")
        elapsed = time.monotonic() - started
        if code == 0:
            _say(f"{args.label}: done in {elapsed:.0f} s")
            return 0
        out.seek(0)
        lines = out.read().decode(errors="replace").splitlines()[-30:]
        _say(f"{args.label}: failed with exit status {code} after {elapsed:.0f} s; last output:")
        _say("\n".join(lines))
        return code


if __name__ == "__main__":
    sys.exit(main())
