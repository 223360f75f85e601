"""`make up` / tools.local_stack as a user meets them, at the process level: a busy port, a second
launch, Ctrl-C with the output piped, SIGTERM, a service that fails to start, `make down` without
Docker. Each ends within 10 s, says why, exits non-zero (but `down`) and leaves no process behind.

The services are tiny HTTP servers from a compose file written per test (fast, no model); each
carries a marker in its argv, so "no process behind" is checked by scanning /proc for it."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.fakes.net import free_port
from tools import local_stack as ls, stack_run

ROOT = Path(__file__).resolve().parents[2]
NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}  # `docker info` fails: the local path

SERVER = textwrap.dedent("""
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    time.sleep(float(os.environ.get("T_DELAY", "0")))
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            failed = os.environ.get("T_FAIL")
            body = {"status": "ok"}
            if failed:
                body = {"status": "unavailable", "detail": {"state": "unavailable", "error": failed}}
            self.send_response(503 if failed else 200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())
        def log_message(self, *a):
            pass
    print(json.dumps({"msg": "serving"}), flush=True)
    HTTPServer(("127.0.0.1", int(os.environ["T_PORT"])), H).serve_forever()
""")


class Fake:
    """A compose file of fake services plus the marker that names their processes."""

    def __init__(self, tmp_path: Path, **envs: dict):
        self.marker = f"jev-test-{uuid.uuid4().hex[:12]}"
        self.state = tmp_path / "state"
        self.ports = {name: free_port() for name in envs}
        services, previous = {}, None
        for name, env in envs.items():
            port = self.ports[name]
            services[name] = {
                "build": ".",
                "profiles": ["t"],
                "command": ["python", "-c", SERVER, self.marker],
                "environment": {"T_PORT": str(port), **env},
                "healthcheck": {"test": ["CMD", "x", f"http://127.0.0.1:{port}/health"]},
                **({"depends_on": [previous]} if previous else {}),
            }
            previous = name
        self.compose = tmp_path / "compose.yml"
        self.compose.write_text(yaml.safe_dump({"services": services}))
        self.args = ["--profile", "t", "--compose", str(self.compose), "--state-dir", str(self.state), "--no-redis"]

    def cli(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "tools.local_stack", *extra, *self.args]

    def make_args(self) -> list[str]:
        return ["LOCAL_STACK_ARGS=" + " ".join(self.args[2:]), "PROFILE=t"]

    def leftovers(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if self.marker.encode() in (entry / "cmdline").read_bytes():
                        stat = (entry / "stat").read_text()
                        if stat.split(") ", 1)[1][:1] != "Z":
                            found.append(int(entry.name))
                except OSError:
                    pass
        return found

    def wait_up(self, proc: subprocess.Popen | None = None, timeout: float = 20) -> None:
        last = list(self.ports.values())[-1]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"launcher exited with {proc.returncode}: {_out(proc)}")
            if stack_run.probe(f"http://127.0.0.1:{last}/health")[0] == 200 and ls_info(self.state).get("urls"):
                return
            time.sleep(0.1)
        raise AssertionError("the fake stack did not come up")


def ls_info(state: Path) -> dict:
    return stack_run.read_info(state / "stack.json")


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'services'}{os.pathsep}{ROOT}", **NO_DOCKER, **extra)
    env.pop("MAKEFLAGS", None)
    env.pop("MFLAGS", None)
    return env


def _out(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=15)
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def _run(argv, timeout=10, **kw) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, text=True, **kw
    )
    return done.returncode, done.stdout, time.monotonic() - started


def _assert_gone(fake: Fake, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while fake.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not fake.leftovers(), f"processes left behind: {fake.leftovers()}"


def _start(argv, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **kw
    )


@pytest.fixture
def cleanup():
    """Kill whatever a failed test left (by process group of the launchers it started)."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def test_busy_port_is_reported_before_anything_starts(tmp_path):
    fake = Fake(tmp_path, api={}, edge={})
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", fake.ports["edge"]))
        holder.listen(1)
        code, out, elapsed = _run(fake.cli("up"))
    assert code == 1 and elapsed < 10, out
    assert f"port already in use: 127.0.0.1:{fake.ports['edge']} (edge)" in out, out
    assert "local_stack: started" not in out  # nothing was started
    assert not fake.leftovers() and not (fake.state / "stack.json").exists()


def test_a_busy_port_names_the_make_up_command_that_moves_it(tmp_path):
    """The refusal gives the exact `make up LOCAL_STACK_ARGS="--set SERVICE.VAR=PORT"` (the service's own port
    variable, a port free now), and the plan that command makes listens there."""
    import re
    import socket

    ports = {"api": free_port(), "edge": free_port()}
    compose = {
        "services": {
            name: {
                "build": ".",
                "profiles": ["t"],
                "command": ["python", "-c", "pass"],
                "environment": {f"JEV_{name.upper()}_PORT": str(port)},
                "healthcheck": {"test": ["CMD", "x", f"http://127.0.0.1:{port}/health"]},
            }
            for name, port in ports.items()
        }
    }
    path = tmp_path / "compose.yml"
    path.write_text(yaml.safe_dump(compose))
    args = ["--profile", "t", "--compose", str(path), "--state-dir", str(tmp_path / "state"), "--no-redis"]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports["edge"]))
        holder.listen(1)
        code, out, _ = _run([sys.executable, "-m", "tools.local_stack", "up", *args])
        assert code == 1, out
        found = re.search(r'make up LOCAL_STACK_ARGS="--set edge\.JEV_EDGE_PORT=(\d+)"', out)
        assert found, out
        moved = int(found.group(1))
        assert moved not in ports.values() and not stack_run.port_in_use(moved)
        code, out, _ = _run(
            [sys.executable, "-m", "tools.local_stack", "plan", *args, "--set", f"edge.JEV_EDGE_PORT={moved}"]
        )
    assert code == 0 and f"JEV_EDGE_PORT={moved}" in out and f"(port {moved}," in out, out


def test_second_launch_is_refused_and_sigterm_stops_the_first(tmp_path, cleanup):
    fake = Fake(tmp_path, api={}, edge={})
    first = _start(fake.cli("up"))
    cleanup.append(first)
    fake.wait_up(first)
    code, out, elapsed = _run(fake.cli("up"))
    assert code == 1 and elapsed < 10, out
    assert f"a local stack is already running (pid {first.pid}, profile t" in out, out
    assert stack_run.probe(f"http://127.0.0.1:{fake.ports['edge']}/health")[0] == 200  # the first one is untouched

    started = time.monotonic()
    first.send_signal(signal.SIGTERM)
    out = _out(first)
    assert first.returncode == 128 + signal.SIGTERM and time.monotonic() - started < 10, out
    assert "SIGTERM received" in out and "stopped edge" in out and "stopped api" in out, out
    _assert_gone(fake)
    assert not (fake.state / "stack.json").exists()


def test_ctrl_c_with_the_output_piped_stops_everything(tmp_path, cleanup):
    """A terminal's Ctrl-C: SIGINT to the whole foreground group, the reader of the pipe included,
    so the launcher's cleanup writes into a closed pipe."""
    fake = Fake(tmp_path, api={}, edge={})
    shell = _start(["bash", "-c", f"make --no-print-directory up {shlex.join(fake.make_args())} 2>&1 | head -c 100000"])
    cleanup.append(shell)
    fake.wait_up(shell, timeout=60)
    pids = [p["pid"] for p in ls_info(fake.state)["processes"]]
    started = time.monotonic()
    os.killpg(shell.pid, signal.SIGINT)
    shell.wait(timeout=15)
    assert time.monotonic() - started < 10
    _assert_gone(fake)
    assert not any(stack_run._alive(pid) for pid in pids)
    assert not (fake.state / "stack.json").exists()


def test_sigterm_to_make_up_stops_everything(tmp_path, cleanup):
    fake = Fake(tmp_path, api={}, edge={})
    make = _start(["make", "--no-print-directory", "up", *fake.make_args()])
    cleanup.append(make)
    fake.wait_up(make, timeout=60)
    started = time.monotonic()
    make.send_signal(signal.SIGTERM)  # make passes it on to the stack it waits for
    out = _out(make)
    assert make.returncode != 0 and time.monotonic() - started < 10, out
    assert "SIGTERM received" in out, out
    _assert_gone(fake)


def test_make_down_is_a_clean_stop_of_make_up(tmp_path, cleanup):
    """`make down` from another shell stops `make up`, which then exits 0 (no `make: *** Error 143`)."""
    fake = Fake(tmp_path, api={}, edge={})
    make = _start(["make", "--no-print-directory", "up", *fake.make_args()])
    cleanup.append(make)
    fake.wait_up(make, timeout=60)
    down = subprocess.run(
        ["make", "--no-print-directory", "down", *fake.make_args()],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = _out(make)
    assert down.returncode == 0, down.stdout + down.stderr
    assert make.returncode == 0, out
    assert "stopped by `down`" in out and "Error" not in out, out
    _assert_gone(fake)


def test_a_service_that_gives_up_stops_the_launch_with_its_reason(tmp_path):
    fake = Fake(tmp_path, api={"T_FAIL": "FileNotFoundError: no checkpoint at /nowhere"}, edge={})
    code, out, elapsed = _run(fake.cli("up"))
    assert code == 1 and elapsed < 10, out
    assert "api failed to start: FileNotFoundError: no checkpoint at /nowhere" in out, out
    assert "started edge" not in out
    _assert_gone(fake)


def test_a_service_that_dies_while_running_stops_the_stack(tmp_path, cleanup):
    fake = Fake(tmp_path, api={}, edge={})
    up = _start(fake.cli("up"))
    cleanup.append(up)
    fake.wait_up(up)
    api = next(p["pid"] for p in ls_info(fake.state)["processes"] if p["name"] == "api")
    os.kill(api, signal.SIGKILL)
    out = _out(up)
    assert up.returncode == 1 and "api killed by SIGKILL while the stack was running" in out, out
    _assert_gone(fake)


def test_progress_lines_while_a_service_starts(tmp_path):
    fake = Fake(tmp_path, slow={"T_DELAY": "1.5"})
    lines: list[str] = []
    compose = yaml.safe_load(fake.compose.read_text())
    with ls.start_profile(
        "t", compose=compose, state_dir=fake.state, log=lines.append, progress_s=0.5, startup_timeout_s=30
    ):
        pass
    waiting = [line for line in lines if line.startswith("local_stack: waiting for slow: not answering yet")]
    assert len(waiting) >= 2, lines
    assert all("s; last log:" in line for line in waiting)
    assert lines[-1] == "local_stack: stopped slow"


def test_make_down_without_docker(tmp_path, cleanup):
    fake = Fake(tmp_path, api={}, edge={})
    code, out, _ = _run(["make", "--no-print-directory", "down", *fake.make_args()])
    assert code == 0 and "no local stack is running" in out, out

    up = _start(fake.cli("up"))
    cleanup.append(up)
    fake.wait_up(up)
    code, out, elapsed = _run(["make", "--no-print-directory", "down", *fake.make_args()])
    assert code == 0 and elapsed < 10, out
    assert f"stopping the t stack (pid {up.pid})" in out, out
    up.wait(timeout=10)
    _assert_gone(fake)


def test_down_cleans_up_after_a_killed_supervisor(tmp_path, cleanup):
    fake = Fake(tmp_path, api={}, edge={})
    up = _start(fake.cli("up"))
    cleanup.append(up)
    fake.wait_up(up)
    os.kill(up.pid, signal.SIGKILL)  # no cleanup ran; the services die with it (PDEATHSIG)
    up.wait(timeout=10)
    _assert_gone(fake)
    code, out, _ = _run(fake.cli("down"))
    assert code == 0
    assert not (fake.state / "stack.json").exists()


def test_redis_started_for_the_stack_is_stopped_with_it(tmp_path):
    port = free_port()
    fake = Fake(tmp_path, api={"T_REDIS": "redis://redis:6379/0"})
    compose = yaml.safe_load(fake.compose.read_text())
    compose["services"]["redis"] = {"image": "redis:7-alpine", "profiles": ["t"]}
    lines: list[str] = []
    with ls.start_profile(
        "t", compose=compose, state_dir=fake.state, log=lines.append, start_redis=True, redis_port=port
    ) as stack:
        assert stack_run.reachable(port)
        redis_dir = stack.run_dir / "redis"
        assert redis_dir.is_dir() and redis_dir.is_relative_to(fake.state / "runs")
        info = ls_info(fake.state)
        assert [p["name"] for p in info["processes"]] == ["redis", "api"]
    assert not stack_run.reachable(port)
    assert not redis_dir.exists()
    assert any(line.startswith("local_stack: started redis (pid") for line in lines)


def test_ensure_redis_runs_a_command_with_a_redis_it_then_stops(tmp_path):
    port = free_port()
    env = _env(JEV_REDIS_URL=f"redis://127.0.0.1:{port}/0")
    check = (
        f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port})); "
        f"s.sendall(b'PING\\r\\n'); print(s.recv(7))\"; exit 7"
    )
    done = subprocess.run(
        ["bash", "tools/ensure_redis.sh", "--", "bash", "-c", check],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 7, done.stdout + done.stderr
    assert "+PONG" in done.stdout
    folder = done.stdout.split(" in ", 1)[1].split()[0]
    assert "/jev-redis." in folder and not Path(folder).exists()
    assert not stack_run.reachable(port)


def test_missing_checkpoint_stops_make_up_at_once(tmp_path):
    """The real cpu profile, with a checkpoint folder that does not exist: the worker gives up at
    load and the launch stops with its reason, instead of waiting for a health that never comes."""
    argv = [
        sys.executable,
        "-m",
        "tools.local_stack",
        "up",
        "--profile",
        "cpu",
        "--state-dir",
        str(tmp_path),
        "--set",
        "worker-cpu.JEV_MODEL_PATH=/nonexistent/checkpoint",
        "--set",
        f"worker-cpu.JEV_WORKER_PORT={free_port()}",
        "--set",
        f"frontend-cpu.JEV_FRONTEND_PORT={free_port()}",
    ]
    code, out, elapsed = _run(argv, timeout=30)
    assert code == 1 and elapsed < 10, (elapsed, out)
    assert "worker-cpu failed to start" in out and "/nonexistent/checkpoint" in out, out
    assert out.index("failed to start") < out.index("stopped worker-cpu")
    assert "started frontend-cpu" not in out
    assert not (tmp_path / "stack.json").exists()
    worker_pid = int(out.split("started worker-cpu (pid ", 1)[1].split(")", 1)[0])
    assert not stack_run._alive(worker_pid)
