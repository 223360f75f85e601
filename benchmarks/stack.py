"""Start the real services as local processes on free loopback ports, for the benchmarks.

    async with Stack(log_dir) as stack:
        worker = await stack.worker("a", JEV_BATCHING="1")       # python -m jev_worker
        front = await stack.frontend("f", worker.url)             # python -m jev_frontend
        await stack.wait_healthy()

Every process gets its own log file under log_dir and is stopped (SIGTERM, then SIGKILL after a
grace period) when the stack closes, also on errors and Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# What a shell may hold that would change who a benchmark's services serve and how much: never inherited, only given
# (`extra`), so a benchmark's direct calls to a worker (its /v1/cache/*, reliability's x-jev-client) meet the
# credentials and limits the benchmark chose, whatever the shell that started it had set.
NOT_INHERITED = (
    "JEV_API_KEYS",
    "JEV_INTERNAL_TOKENS",
    "JEV_INTERNAL_TOKEN_FILE",
    "JEV_RATE_LIMITS",
    "JEV_RATE_LIMITS_FILE",
)


def service_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in NOT_INHERITED}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "services"), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


@dataclass
class Service:
    name: str
    module: str
    url: str
    env: dict[str, str]
    log: Path
    process: asyncio.subprocess.Process | None = None
    health: dict = field(default_factory=dict)
    started_at: float = 0.0
    ready_s: float | None = None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""


class ServiceFailed(RuntimeError):
    pass


class Stack:
    def __init__(self, log_dir: str | os.PathLike, python: str = sys.executable):
        self.log_dir = Path(log_dir)
        self.python = python
        self.services: list[Service] = []

    async def __aenter__(self) -> Stack:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop_all()

    async def start(self, name: str, module: str, port: int, env: dict[str, str]) -> Service:
        service = Service(
            name=name,
            module=module,
            url=f"http://127.0.0.1:{port}",
            env=service_env(env),
            log=self.log_dir / f"{name}.log",
        )
        with open(service.log, "wb") as log:
            service.process = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                module,
                cwd=str(REPO),
                env=service.env,
                stdout=log,
                stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
            )
        service.started_at = time.perf_counter()
        self.services.append(service)
        return service

    async def worker(self, name: str, **env: str) -> Service:
        port = free_port()
        base = {"JEV_WORKER_HOST": "127.0.0.1", "JEV_WORKER_PORT": str(port), "JEV_WORKER_ID": f"bench-{name}"}
        return await self.start(name, "jev_worker", port, {**base, **env})

    async def frontend(self, name: str, backend_url: str, **env: str) -> Service:
        port = free_port()
        base = {"JEV_FRONTEND_HOST": "127.0.0.1", "JEV_FRONTEND_PORT": str(port), "JEV_BACKEND_URL": backend_url}
        return await self.start(name, "jev_frontend", port, {**base, **env})

    async def worker_and_frontend(
        self, worker_env: dict[str, str], frontend_env: dict[str, str], worker_timeout_s: float = 300.0
    ) -> tuple[Service, Service]:
        """A worker, healthy, then a frontend routing to it by the model it serves (JEV_BACKENDS), healthy."""
        worker = await self.worker("worker", **worker_env)
        await self.wait_healthy([worker], timeout_s=worker_timeout_s)
        name = (await get_json(worker.url + "/v1/models"))["models"][0]["name"]
        frontend = await self.frontend("frontend", worker.url, JEV_BACKENDS=f"{name}={worker.url}", **frontend_env)
        await self.wait_healthy([frontend], timeout_s=120)
        return worker, frontend

    async def wait_healthy(self, services: list[Service] | None = None, timeout_s: float = 300.0) -> None:
        """Until every service answers GET /health 200; raises ServiceFailed with its log tail."""
        pending = list(services or self.services)
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while pending:
                for service in list(pending):
                    if service.process.returncode is not None:
                        raise ServiceFailed(
                            f"{service.name} ({service.module}) exited with "
                            f"{service.process.returncode}:\n{service.log_tail()}"
                        )
                    try:
                        async with session.get(service.url + "/health") as resp:
                            if resp.status == 200:
                                service.health = await resp.json()
                                service.ready_s = time.perf_counter() - service.started_at
                                pending.remove(service)
                    except (TimeoutError, aiohttp.ClientError, ValueError):
                        pass
                if pending and time.monotonic() > deadline:
                    names = ", ".join(s.name for s in pending)
                    raise ServiceFailed(f"not healthy within {timeout_s:g} s: {names}\n{pending[0].log_tail()}")
                if pending:
                    await asyncio.sleep(0.25)

    async def stop(self, service: Service, grace_s: float = 10.0) -> int | None:
        process = service.process
        if process is None or process.returncode is not None:
            return None if process is None else process.returncode
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            return await process.wait()

    async def stop_all(self) -> None:
        # frontends first (they were started after their workers), then the rest
        await asyncio.gather(*(self.stop(s) for s in reversed(self.services)), return_exceptions=True)


async def get_json(url: str, timeout_s: float = 10.0) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url) as resp:
            resp.raise_for_status()
            return await resp.json()


async def get_text(url: str, timeout_s: float = 10.0) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url) as resp:
            resp.raise_for_status()
            return await resp.text()
