"""Docker Compose v2 driven from the tests: one project per test module, on loopback ports of its own.

The engine is whatever `docker` reaches: Docker, or podman's Docker-API socket set up by
tools/container_ci.sh (which exports DOCKER_HOST and JEV_COMPOSE_OVERRIDES, the override file with its
build args). The project publishes the frontend on 127.0.0.1:<free port> (JEV_FRONTEND_PUBLISH) and
Prometheus on another, so it neither collides with a stack already on :8080 nor listens beyond loopback.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from ..fakes.net import free_port

ROOT = Path(__file__).resolve().parents[2]
HINT = "run them with: bash tools/container_ci.sh run -- .venv/bin/python -m pytest tests/compose"


def engine_reason() -> str | None:
    """Why compose tests cannot run here, or None."""
    docker = shutil.which("docker")
    if docker is None:
        return f"no docker CLI on PATH ({HINT})"
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        detail = (info.stderr or info.stdout).strip().splitlines()
        return f"no Docker engine reachable (`docker info`: {detail[-1][:160] if detail else info.returncode}; {HINT})"
    compose = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=60)
    if compose.returncode != 0:
        return "the docker compose v2 plugin is not installed"
    return None


class Project:
    """`docker compose -f docker-compose.yml [-f overrides...] -p <unique> --profile P` with its own env."""

    def __init__(self, profile: str, tmp: Path, extra_files: list[Path] = (), env: dict[str, str] | None = None):
        self.name = f"jevtest{uuid.uuid4().hex[:8]}"
        self.profile = profile
        files = [ROOT / "docker-compose.yml"]
        files += [Path(p) for p in os.environ.get("JEV_COMPOSE_OVERRIDES", "").split(os.pathsep) if p]
        files += list(extra_files)
        self.base = ["docker", "compose", "-p", self.name, "--profile", profile]
        for path in files:
            self.base += ["-f", str(path)]
        self.frontend_port, self.prometheus_port = free_port(), free_port()
        hf, models = tmp / "hf", tmp / "models"
        for folder in (hf, models):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o755)  # the services run as uid 10001
        self.env = dict(
            os.environ,
            JEV_FRONTEND_PUBLISH=f"127.0.0.1:{self.frontend_port}",
            JEV_PROMETHEUS_PUBLISH=str(self.prometheus_port),
            JEV_REDIS_PASSWORD=secrets.token_hex(12),
            JEV_HF_HOME=str(hf),
            JEV_MODELS_DIR=str(models),
        )
        self.env.update(env or {})
        self.base_url = f"http://127.0.0.1:{self.frontend_port}"
        self.prometheus_url = f"http://127.0.0.1:{self.prometheus_port}"

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            self.base + list(args), cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"docker compose {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}\n{self.logs()}"
            )
        return done

    def logs(self, tail: int = 60) -> str:
        done = subprocess.run(
            self.base + ["logs", "--no-color", "--tail", str(tail)],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done.stdout[-6000:]

    def up(self, *args: str, wait_s: int = 600, timeout: float = 1800) -> None:
        self.run("up", "-d", "--wait", "--wait-timeout", str(wait_s), *args, timeout=timeout)

    def down(self) -> subprocess.CompletedProcess:
        return self.run("down", "-v", "--remove-orphans", "--timeout", "10", timeout=300, check=False)

    def container(self, service: str) -> dict:
        """`docker inspect` of the service's container (also a stopped one)."""
        ids = self.run("ps", "-a", "-q", service).stdout.split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        inspect = subprocess.run(
            ["docker", "inspect", ids[0]], capture_output=True, text=True, timeout=60, env=self.env, check=True
        )
        return json.loads(inspect.stdout)[0]

    def exec(self, service: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run("exec", "-T", service, *argv, timeout=timeout, check=False)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, volumes and networks still labelled with this project."""
        label = f"label=com.docker.compose.project={self.name}"
        found = {}
        for kind, argv in (
            ("containers", ["ps", "-a", "-q"]),
            ("volumes", ["volume", "ls", "-q"]),
            ("networks", ["network", "ls", "-q"]),
        ):
            done = subprocess.run(
                ["docker", *argv, "--filter", label],
                capture_output=True,
                text=True,
                timeout=60,
                env=self.env,
                check=True,
            )
            found[kind] = done.stdout.split()
        return found


def wait_for(predicate, timeout_s: float, what: str, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except OSError as exc:  # connection refused / reset while a service restarts
            last = exc
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")
