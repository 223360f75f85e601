"""Running a local stack's processes: preflight (ports, one stack per state folder), start, wait for
health with a progress line, supervise, stop every process, and `down` from another shell.

Nothing here knows about compose; tools/local_stack.py plans the processes and calls these.

* Every service runs in its own session (Ctrl-C on the terminal reaches only the supervisor, which
  stops them in order) and gets SIGTERM from the kernel if the supervisor dies without cleaning up
  (PR_SET_PDEATHSIG).
* `<state_dir>/stack.lock` is held (flock) while a stack runs; `<state_dir>/stack.json` says which
  processes belong to it, so a second launch is refused with the first one's pid and `down` can stop
  it from another shell.
* Redis started for the stack runs as one of its processes, in a per-run folder under
  `<state_dir>/runs/`, removed when the stack stops.
* Each run writes its services' logs to a folder of its own, `<state_dir>/logs/<run>/<service>.log`, with
  `<state_dir>/logs/latest` naming the newest; the last LOG_RUNS_KEPT runs are kept. A failing service's last
  lines come from its log of this run only, progress bars left out.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 5.0
PROGRESS_S = 5.0
LOG_RUNS_KEPT = 10
_PR_SET_PDEATHSIG = 1


class StackError(RuntimeError):
    """The launch or the running stack failed; the message names the cause."""


# ----- output that survives a closed pipe --------------------------------------------------------
def say(message: str) -> None:
    """print() to stdout; when the reader of a pipe is gone (Ctrl-C on `make up | tee`), to stderr,
    and when that is gone too, nowhere: losing a progress line must never stop the cleanup."""
    for stream_name in ("stdout", "stderr"):
        stream = getattr(sys, stream_name)
        try:
            stream.write(message + "\n")
            stream.flush()
            return
        except (BrokenPipeError, OSError, ValueError):
            with contextlib.suppress(OSError):
                setattr(sys, stream_name, open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the process


# ----- preflight ---------------------------------------------------------------------------------
def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    """True when something listens on host:port (bound the way aiohttp binds: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def reachable(port: int, host: str = LOOPBACK) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    return False


def free_port_after(port: int, avoid: set[int]) -> int:
    """The first port above `port` that nothing listens on and `avoid` does not hold."""
    candidate = port + 1
    while candidate in avoid or port_in_use(candidate):
        candidate += 1
    return candidate


def check_ports(ports: dict[str, int], port_vars: dict[str, str] | None = None) -> None:
    """Raise StackError naming every planned port that is already taken, before anything starts, with the
    `make up LOCAL_STACK_ARGS="--set SERVICE.VAR=PORT"` that starts the stack on free ones instead
    (port_vars: service -> the variable that sets its port)."""
    busy = {name: port for name, port in ports.items() if port and port_in_use(port)}
    if not busy:
        return
    planned = {port for port in ports.values() if port}
    sets = []
    for name, port in busy.items():
        if (port_vars or {}).get(name):
            free = free_port_after(port, planned)
            planned.add(free)
            sets.append(f"--set {name}.{port_vars[name]}={free}")
    how = f'make up LOCAL_STACK_ARGS="{" ".join(sets)}"' if sets else "--set SERVICE.JEV_..._PORT=PORT"
    raise StackError(
        "port already in use: "
        + ", ".join(f"{LOOPBACK}:{port} ({name})" for name, port in busy.items())
        + ". Another process listens there (a stack started earlier? `make down` stops a local one). "
        f"Free it, or start this stack on free ports: {how} (README, 'Set up': LOCAL_STACK_ARGS)"
    )


class RunLock:
    """One running stack per state folder: an flock held for the stack's lifetime plus stack.json."""

    def __init__(self, state_dir: Path):
        self.lock_path = state_dir / "stack.lock"
        self.info_path = state_dir / "stack.json"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            info = read_info(self.info_path)
            where = f"pid {info.get('pid', '?')}, profile {info.get('profile', '?')}"
            if info.get("urls"):
                where += ", " + ", ".join(f"{k} {v}" for k, v in info["urls"].items())
            raise StackError(
                f"a local stack is already running ({where}); stop it with `make down` "
                f"(python -m tools.local_stack down)"
            ) from None
        self._fd = fd

    def write(self, info: dict) -> None:
        tmp = self.info_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=1))
        tmp.replace(self.info_path)

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.info_path.unlink()
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def read_info(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# ----- processes ---------------------------------------------------------------------------------
def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    url: str | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid


def spawn(name: str, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path, url: str | None = None) -> Proc:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        popen = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    return Proc(name, popen, log_path, url, list(argv))


def stop_all(procs: list[Proc], grace_s: float = STOP_GRACE_S, log: Callable[[str], None] = say) -> None:
    """SIGTERM every process group (last started first), wait up to grace_s together, SIGKILL the rest."""
    live = [p for p in reversed(procs) if p.popen.poll() is None]
    for proc in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in live:
        try:
            proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.popen.wait(timeout=5)
            log(f"local_stack: {proc.name} did not stop within {grace_s:.0f} s; killed")
    for proc in procs:  # anything the services left in their groups
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in live:
        log(f"local_stack: stopped {proc.name}")


def _readable(line: str) -> str:
    """A JSON log line as `level logger: msg` (+ the exception's last line); other lines as they are."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line
    if not isinstance(entry, dict) or "msg" not in entry:
        return line
    text = f"  {entry.get('level', '?')} {entry.get('logger', '')}: {entry['msg']}"
    if entry.get("exc"):
        text += " — " + str(entry["exc"]).strip().splitlines()[-1]
    return text


# tqdm's bar ("desc:  40%|####      | 109/272 [00:05<00:07, 21.3it/s]") and its count-only form ("12it [00:01, ...]")
_PROGRESS_BAR = re.compile(r"\d+%\|.*\|\s*[\d.]+[kMG]?/[\d.]+[kMG]?|\d+it \[\d+:\d\d")


def is_progress_bar(line: str) -> bool:
    """A progress bar's line (raw, or wrapped as a JSON log line's msg): what a log dump leaves out."""
    try:
        entry = json.loads(line)
    except ValueError:
        entry = None
    text = str(entry.get("msg", "")) if isinstance(entry, dict) else line
    return bool(_PROGRESS_BAR.search(text))


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log, readable, progress bars left out."""
    try:
        kept = [line for line in path.read_text(errors="replace").splitlines() if not is_progress_bar(line)]
    except OSError:
        return ""
    return "\n".join(_readable(line) for line in kept[-lines:])


def last_message(path: Path) -> str:
    """The last log line of a service, its `msg` when it is a JSON log line."""
    for line in reversed(tail(path, 5).splitlines()):
        if line.strip():
            return line.strip()[:160]
    return "(no output yet)"


def exited(proc: Proc, when: str) -> StackError:
    code = proc.popen.returncode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
    return StackError(f"{proc.name} {how} {when}; last lines of {proc.log_path}:\n{tail(proc.log_path)}")


def check_alive(procs: list[Proc], when: str = "while the stack was running") -> None:
    for proc in procs:
        if proc.popen.poll() is not None:
            raise exited(proc, when)


# ----- health ------------------------------------------------------------------------------------
def probe(url: str, timeout: float = 1.0) -> tuple[int | None, dict]:
    """(HTTP status or None when nothing answers, JSON body or {})."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError):
        return None, {}
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    return status, body if isinstance(body, dict) else {}


def failure_of(body: dict) -> str | None:
    """The reason a /health body says the service gave up (state `unavailable`), else None."""
    detail = body.get("detail") if isinstance(body.get("detail"), dict) else {}
    states = {body.get("status"), detail.get("state"), detail.get("status")}
    if "unavailable" in states or "failed" in states:
        error = detail.get("error") or body.get("error") or detail
        if isinstance(error, dict):
            error = error.get("message") or json.dumps(error)[:300]
        return str(error)
    return None


_STEP = re.compile(r"step \d+/\d+")


def wait_healthy(
    proc: Proc,
    url: str,
    *,
    others: list[Proc],
    timeout_s: float,
    log: Callable[[str], None] = say,
    progress_s: float = PROGRESS_S,
) -> None:
    """Until url answers 2xx. Fails at once when the process exits, when its health says it gave up,
    or when an earlier service dies; a progress line (state, elapsed, last log line) every progress_s, and one
    as soon as its health names a new loading step (`step k/n`), so no step goes unseen."""
    started = time.monotonic()
    next_line = started + progress_s
    shown_step = None
    while True:
        status, body = probe(url)
        if status is not None and 200 <= status < 300:
            return
        reason = failure_of(body)
        if reason:
            raise StackError(
                f"{proc.name} failed to start: {reason}\nlast lines of {proc.log_path}:\n" + tail(proc.log_path)
            )
        if proc.popen.poll() is not None:
            raise exited(proc, "before it was healthy")
        check_alive(others, f"while {proc.name} was starting")
        now = time.monotonic()
        if now - started > timeout_s:
            raise StackError(
                f"{proc.name} not healthy at {url} after {timeout_s:.0f} s; last lines of "
                f"{proc.log_path}:\n{tail(proc.log_path)}"
            )
        detail = body.get("detail") if isinstance(body.get("detail"), dict) else {}
        step = _STEP.match(str(detail.get("stage") or ""))
        if now >= next_line or (step and step.group(0) != shown_step):
            shown_step = step.group(0) if step else shown_step
            state = detail.get("state") or ("not answering yet" if status is None else f"HTTP {status}")
            if detail.get("stage"):
                state += f" ({detail['stage']})"
            log(
                f"local_stack: waiting for {proc.name}: {state}, {now - started:.0f} s; "
                f"last log: {last_message(proc.log_path)}"
            )
            next_line = now + progress_s
        time.sleep(0.25)


# ----- redis -------------------------------------------------------------------------------------
def start_redis(port: int, run_dir: Path, cwd: Path, log: Callable[[str], None] = say) -> Proc | None:
    """A Redis for this stack on 127.0.0.1:port in run_dir/redis, unless one answers there already."""
    if reachable(port):
        log(f"local_stack: redis answers at {LOOPBACK}:{port} already; using it (not ours to stop)")
        return None
    exe = shutil.which("redis-server")
    if exe is None:
        raise StackError(
            "redis-server is not installed and no Redis answers at "
            f"{LOOPBACK}:{port}: install it (apt-get install redis-server, or "
            "bash tools/ensure_redis.sh --install)"
        )
    folder = run_dir / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    proc = spawn(
        "redis",
        [exe, "--bind", LOOPBACK, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(folder)],
        dict(os.environ),
        cwd,
        folder / "redis.log",
    )
    deadline = time.monotonic() + 10
    while not reachable(port):
        if proc.popen.poll() is not None:
            raise exited(proc, "at start")
        if time.monotonic() > deadline:
            stop_all([proc], log=lambda *_: None)
            raise StackError(f"redis did not answer at {LOOPBACK}:{port} within 10 s:\n{tail(proc.log_path)}")
        time.sleep(0.05)
    log(f"local_stack: started redis (pid {proc.pid}) at {LOOPBACK}:{port} in {folder}")
    return proc


def new_run_dir(state_dir: Path) -> Path:
    (state_dir / "runs").mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=state_dir / "runs"))


_LOG_RUN = re.compile(r"\d{8}-\d{6}-\d{9}-\d+$")  # sorts by start time: date, time, nanoseconds, pid


def new_log_dir(state_dir: Path, keep: int = LOG_RUNS_KEPT) -> Path:
    """A fresh `<state_dir>/logs/<run>/` for this run's service logs, `logs/latest` pointing at it (replaced in one
    rename), and the runs before the last `keep` removed."""
    logs = Path(state_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    now = time.time_ns()
    folder = logs / f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now / 1e9))}-{now % 10**9:09d}-{os.getpid()}"
    folder.mkdir()
    staged = logs / f".latest-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()
    staged.symlink_to(folder.name)
    staged.replace(logs / "latest")
    runs = sorted(p for p in logs.iterdir() if _LOG_RUN.match(p.name) and p.is_dir() and not p.is_symlink())
    for old in runs[: max(0, len(runs) - keep)]:
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)
    return folder


# ----- down --------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


DOWN_REQUEST = "down-requested"  # names the supervisor `down` stopped: its SIGTERM is a clean stop, exit 0


def down_requested(state_dir: Path, pid: int) -> bool:
    """Whether `down` asked the supervisor `pid` to stop (the request is consumed)."""
    path = Path(state_dir) / DOWN_REQUEST
    try:
        asked = path.read_text().strip() == str(pid)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        path.unlink()
    return asked


def stop_running(state_dir: Path, timeout_s: float = 10.0, log: Callable[[str], None] = say) -> bool:
    """Stop the stack running from state_dir (from another shell). False when none runs."""
    lock = RunLock(state_dir)
    info = read_info(lock.info_path)
    supervisor = info.get("pid")
    try:
        lock.acquire()
        running = False
    except StackError:
        running = True
    if not running:  # no supervisor: only leftovers of one that was killed, if any
        lock.release()
    elif supervisor:
        log(f"local_stack: stopping the {info.get('profile', '?')} stack (pid {supervisor})")
        with contextlib.suppress(OSError):
            (Path(state_dir) / DOWN_REQUEST).write_text(str(supervisor))
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(supervisor):
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor, signal.SIGKILL)
    leftovers = [
        p for p in info.get("processes", []) if _alive(p["pid"]) and _cmdline(p["pid"])[:1] == p.get("argv", [])[:1]
    ]
    for p in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p["pid"], signal.SIGKILL)
        log(f"local_stack: killed leftover {p.get('name')} (pid {p['pid']})")
    if leftovers or not running:
        with contextlib.suppress(FileNotFoundError):
            lock.info_path.unlink()
    return running or bool(leftovers)
