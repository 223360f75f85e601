"""Run a docker-compose.yml profile as local processes on loopback, with the env the compose file gives.

    python -m tools.local_stack up --profile cpu     # until Ctrl-C, SIGTERM or `down` (what `make up` runs)
    python -m tools.local_stack down                 # stop it from another shell (what `make down` runs)
    python -m tools.local_stack plan --profile cpu   # print the processes, env and ports; start nothing
    python -m tools.local_stack up --profile cpu --set worker-cpu.JEV_DEVICE=cpu

docker-compose.yml stays the one source of truth for ports and env. For each service of the profile:

* ``${VAR:-default}`` interpolation is resolved against this process's environment;
* compose service hostnames in URLs (``http://worker-cpu:8000``, ``redis://redis:6379/0``) become
  ``127.0.0.1`` with that service's local port; ``host.docker.internal`` becomes ``127.0.0.1``;
* listen addresses ``0.0.0.0`` become ``127.0.0.1`` (nothing binds beyond loopback);
* a service listens on its published host port if it has one, else on its container port; two
  services that would share a port get the next free one, and every URL naming them follows;
* container paths of volumes (``/data/hf``, ``/models``, ``/var/lib/jev/assets``) become the host
  paths of the bind mounts (relative to the repository), named volumes a folder under
  ``.cache/local-stack/``;
* ``python`` in a command is this interpreter; PYTHONPATH is ``services:.`` as in the images.
* the rest of this shell's environment reaches every process, but for the variables the compose file gives
  some service: those reach only the services it gives them to (``JEV_API_KEYS`` the frontend's alone), and
  the internal token file lands in the shared ``jev-secrets`` folder, generated on the first start.

Services without a ``build`` (redis) are not compose-built: `up` uses a Redis that answers on the
host, or starts one for this stack (stopped with it, in a per-run folder). Services start in
depends_on order, each after the previous one answers its healthcheck URL; how the processes are
run, watched and stopped (ports checked first, one stack per state folder, a progress line every
5 s, a failing service stops the launch with its last log lines) is tools/stack_run.py.

``start_profile(profile, overrides)`` is the same as a context manager, returning the service URLs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tools import stack_run

REPO_ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
STATE_DIR = REPO_ROOT / ".cache" / "local-stack"
LOOPBACK = stack_run.LOOPBACK
EXTERNAL_PORTS = {"redis": 6379}  # image name prefix -> the port it is expected on, on the host
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME_OP = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?+])?")


def interpolate(value: str, environ: Mapping[str, str]) -> str:
    """Compose-style ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``,
    ``${VAR:+alt}``, ``$VAR`` and ``$$``; defaults may nest (``${A:-${B}/x}``)."""
    out: list[str] = []
    i, n = 0, len(value)
    while i < n:
        ch = value[i]
        if ch != "$":
            out.append(ch)
            i += 1
            continue
        if value.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if value.startswith("${", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if value.startswith("${", j):
                    depth, j = depth + 1, j + 2
                    continue
                if value[j] == "}":
                    depth -= 1
                j += 1
            if depth:
                raise ValueError(f"unterminated ${{ in {value!r}")
            out.append(_expand(value[i + 2 : j - 1], environ))
            i = j
            continue
        match = _BARE.match(value, i + 1)
        if match:
            out.append(environ.get(match.group(0), ""))
            i = match.end()
        else:
            out.append("$")
            i += 1
    return "".join(out)


def _expand(body: str, environ: Mapping[str, str]) -> str:
    match = _NAME_OP.match(body)
    if not match:
        raise ValueError(f"bad variable reference ${{{body}}}")
    name, op, arg = match.group("name"), match.group("op"), body[match.end() :]
    present, current = name in environ, environ.get(name, "")
    if not op:
        if arg:
            raise ValueError(f"bad variable reference ${{{body}}}")
        return current
    unset_or_empty = not current if op.startswith(":") else not present
    if op in (":-", "-"):
        return interpolate(arg, environ) if unset_or_empty else current
    if op in (":?", "?"):
        if unset_or_empty:
            raise ValueError(f"required variable {name} is missing: {arg}")
        return current
    return "" if unset_or_empty else interpolate(arg, environ)  # :+ / +


def load_compose(path: str | os.PathLike = COMPOSE_FILE) -> dict:
    import yaml  # not needed by `down`, which runs before the venv may exist

    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def profile_services(compose: dict, profile: str) -> dict[str, dict]:
    """The services a ``--profile`` run starts: those listing the profile, plus those with no profiles."""
    services = {}
    for name, svc in (compose.get("services") or {}).items():
        profiles = svc.get("profiles")
        if not profiles or profile in profiles:
            services[name] = svc
    if not any(profile in (svc.get("profiles") or []) for svc in services.values()):
        known = sorted({p for s in compose.get("services", {}).values() for p in s.get("profiles") or []})
        raise KeyError(f"no service in the compose file has profile {profile!r}; known: {', '.join(known)}")
    return services


def environment_of(svc: dict) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.split("=", 1) if "=" in item else (item, os.environ.get(item, "")) for item in env)
        return {k: v for k, v in pairs}
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def command_of(svc: dict) -> list[str]:
    command = svc.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def depends_of(svc: dict) -> list[str]:
    deps = svc.get("depends_on") or []
    return list(deps) if isinstance(deps, (list, dict)) else []


def health_url_of(svc: dict) -> str | None:
    test = (svc.get("healthcheck") or {}).get("test") or []
    items = shlex.split(test) if isinstance(test, str) else [str(t) for t in test]
    return next((t for t in items if t.startswith(("http://", "https://"))), None)


def _port_of_url(url: str | None) -> int | None:
    match = re.match(r"^[a-z]+://[^/:]+:(\d+)", url or "")
    return int(match.group(1)) if match else None


def _listen_port(env: dict[str, str], command: list[str], health: str | None) -> int | None:
    for key, value in env.items():
        if re.fullmatch(r"JEV_[A-Z]+_PORT", key) and value.isdigit():
            return int(value)
    for flag, value in zip(command, command[1:]):
        if flag == "--port" and value.isdigit():
            return int(value)
    return _port_of_url(health)


def _published(svc: dict, container_port: int | None, environ: Mapping[str, str]) -> int | None:
    for item in svc.get("ports") or []:
        text = interpolate(str(item), environ)
        pieces = text.split(":")
        published = len(pieces) >= 2 and pieces[-1].split("/")[0].isdigit() and pieces[-2].isdigit()
        if published and (container_port is None or int(pieces[-1].split("/")[0]) == container_port):
            return int(pieces[-2])
    return None


@dataclass
class LocalService:
    name: str
    argv: list[str]
    env: dict[str, str]  # only what the compose file (and overrides) set, after translation
    port: int | None
    health_url: str | None
    depends_on: list[str] = field(default_factory=list)

    @property
    def url(self) -> str | None:
        return f"http://{LOOPBACK}:{self.port}" if self.port else None

    @property
    def port_var(self) -> str | None:
        """The variable that sets this service's port (`--set NAME.JEV_WORKER_PORT=...` moves it), if any."""
        return next(
            (k for k, v in self.env.items() if re.fullmatch(r"JEV_[A-Z]+_PORT", k) and v == str(self.port)), None
        )


def plan_profile(
    profile: str,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    *,
    compose: dict | None = None,
    environ: Mapping[str, str] | None = None,
    state_dir: str | os.PathLike = STATE_DIR,
    repo_root: str | os.PathLike = REPO_ROOT,
    external_ports: Mapping[str, int] | None = None,
) -> list[LocalService]:
    """The local processes for a profile, in start order. Pure: starts nothing, touches no file.
    external_ports: image name prefix -> host port of services without a build (default EXTERNAL_PORTS)."""
    external_ports = EXTERNAL_PORTS if external_ports is None else external_ports
    compose = load_compose() if compose is None else compose
    environ = dict(os.environ if environ is None else environ)
    overrides = {k: dict(v) for k, v in (overrides or {}).items()}
    repo_root, state_dir = Path(repo_root), Path(state_dir)
    services = profile_services(compose, profile)
    # services marked `x-local-stack: skip` (Prometheus, one-shot jobs) are compose-only
    services = {n: s for n, s in services.items() if s.get("x-local-stack") != "skip"}
    unknown = sorted(set(overrides) - set(services))
    if unknown:
        raise KeyError(f"overrides name services not in profile {profile!r}: {unknown}")

    external: dict[str, int] = {}
    raw: dict[str, tuple[dict[str, str], list[str], str | None]] = {}
    for name, svc in services.items():
        if "build" not in svc:
            image = str(svc.get("image", ""))
            port = next((p for prefix, p in external_ports.items() if image.startswith(prefix)), None)
            if port is None:
                raise ValueError(f"service {name} has no build and no known host port (image {image!r})")
            external[name] = port
            continue
        env = {k: interpolate(v, environ) for k, v in environment_of(svc).items()}
        command = [interpolate(c, environ) for c in command_of(svc)]
        raw[name] = (env, command, health_url_of(svc))

    # ports: the published host port, else the container port; never two services on one port
    taken = set(external.values())
    ports: dict[str, int | None] = {}
    container_ports: dict[str, int | None] = {}
    for name, (env, command, health) in raw.items():
        container = _listen_port(env, command, health)
        container_ports[name] = container
        forced = next(
            (
                int(v)
                for k, v in overrides.get(name, {}).items()
                if re.fullmatch(r"JEV_[A-Z]+_PORT", k) and str(v).isdigit()
            ),
            None,
        )
        port = forced or _published(services[name], container, environ) or container
        while forced is None and port is not None and port in taken:
            port += 1
        if port is not None:
            taken.add(port)
        ports[name] = port
    hosts = {name: port for name, port in {**external, **ports}.items() if port is not None}

    def urls(text: str) -> str:
        def sub(match: re.Match) -> str:
            host, port = match.group("host"), match.group("port")
            if host in hosts:  # credentials for a host-provided service (redis: none locally) are dropped
                user = "" if host in external else (match.group("user") or "")
                return f"{match.group('scheme')}://{user}{LOOPBACK}:{hosts[host]}"
            if host == "host.docker.internal":
                return f"{match.group('scheme')}://{LOOPBACK}" + (f":{port}" if port else "")
            return match.group(0)

        return re.sub(
            r"(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<user>[^@/\s]*@)?(?P<host>[A-Za-z0-9_.-]+)(?::(?P<port>\d+))?",
            sub,
            text,
        )

    plan: list[LocalService] = []
    for name, (env, command, health) in raw.items():
        svc = services[name]
        mounts: list[tuple[str, str]] = []
        for volume in svc.get("volumes") or []:
            spec = interpolate(volume if isinstance(volume, str) else f"{volume['source']}:{volume['target']}", environ)
            pieces = spec.split(":")
            if len(pieces) < 2:
                continue
            source, target = pieces[0], pieces[1]
            if source.startswith(("/", ".", "~")):
                host_path = Path(os.path.expanduser(source))
                host_path = host_path if host_path.is_absolute() else (repo_root / host_path)
            else:
                host_path = state_dir / source
            mounts.append((target.rstrip("/"), str(host_path.resolve() if host_path.exists() else host_path)))
        mounts.sort(key=lambda m: len(m[0]), reverse=True)

        def paths(text: str, mounts: list[tuple[str, str]] = mounts) -> str:
            for target, host in mounts:
                if text == target or text.startswith(target + "/"):
                    return host + text[len(target) :]
            return text

        port = ports[name]
        local_env = {}
        for key, value in env.items():
            value = paths(urls(value))
            if key.endswith("_HOST") and value == "0.0.0.0":
                value = LOOPBACK
            if re.fullmatch(r"JEV_[A-Z]+_PORT", key) and port is not None and value == str(container_ports[name]):
                value = str(port)
            local_env[key] = value
        argv = []
        previous = None
        for arg in command:
            arg = paths(urls(arg))
            if previous == "--host" and arg == "0.0.0.0":
                arg = LOOPBACK
            if previous == "--port" and port is not None:
                arg = str(port)
            argv.append(arg)
            previous = arg
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        local_env.update(overrides.get(name, {}))
        health_url = urls(health) if health else None
        if health_url and port is not None:
            health_url = re.sub(r"^(https?://[^/:]+):\d+", rf"\g<1>:{port}", health_url)
        deps = [d for d in depends_of(svc) if d in raw]
        plan.append(LocalService(name, argv, local_env, port, health_url, deps))
    return _ordered(plan)


def internal_token(state_dir: str | os.PathLike = STATE_DIR) -> str | None:
    """The token a tool sends a worker of this machine's stack directly: JEV_INTERNAL_TOKENS' first, else the one
    `make up` generated (docker-compose.yml's JEV_INTERNAL_TOKEN_FILE, in the jev-secrets folder), else None."""
    listed = [t.strip() for t in os.environ.get("JEV_INTERNAL_TOKENS", "").split(",") if t.strip()]
    if listed:
        return listed[0]
    path = Path(state_dir) / "jev-secrets" / "internal-token"
    if not path.is_file():
        return None
    return next((t.strip() for line in path.read_text().splitlines() for t in line.split(",") if t.strip()), None)


SECRET_NAME = re.compile(r"KEYS$|TOKENS?$|PASSWORD$")  # values `plan` does not print
URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:@/\s]*:)[^@/\s]+@")


def shown(key: str, value: str) -> str:
    """A variable's value as `plan` prints it: keys, tokens and passwords (also a password inside a URL) hidden."""
    if value and SECRET_NAME.search(key):
        return "(set, not shown)"
    return URL_PASSWORD.sub(r"\g<head>(not shown)@", value)


def shared_environ(environ: Mapping[str, str], plan: list[LocalService]) -> dict[str, str]:
    """What every process inherits from this shell: all of it but the variables the compose file gives some
    service, which reach just the services it gives them to (`JEV_API_KEYS=k make up`: the frontend's keys,
    not the worker's, as in compose)."""
    declared = {key for service in plan for key in service.env}
    return {key: value for key, value in environ.items() if key not in declared}


def _ordered(plan: list[LocalService]) -> list[LocalService]:
    by_name = {s.name: s for s in plan}
    order: list[LocalService] = []
    state: dict[str, int] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise ValueError(f"depends_on cycle: {' -> '.join(chain + (name,))}")
        state[name] = 1
        for dep in by_name[name].depends_on:
            visit(dep, chain + (name,))
        state[name] = 2
        order.append(by_name[name])

    for service in plan:
        visit(service.name, ())
    return order


class RunningStack(dict):
    """{service: url} of a started stack, plus its processes (supervisor's view)."""

    def __init__(self, urls: dict[str, str], processes: list[stack_run.Proc], run_dir: Path, log_dir: Path):
        super().__init__(urls)
        self.processes = processes
        self.run_dir = run_dir
        self.log_dir = log_dir  # this run's service logs (<state_dir>/logs/latest while it is the newest)

    def check(self) -> None:
        """Raise StackError when a process of the stack has exited."""
        stack_run.check_alive(self.processes)


@contextlib.contextmanager
def start_profile(
    profile: str,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    *,
    compose: dict | None = None,
    startup_timeout_s: float = 300.0,
    state_dir: str | os.PathLike = STATE_DIR,
    log=stack_run.say,
    start_redis: bool = False,
    redis_port: int | None = None,
    progress_s: float = stack_run.PROGRESS_S,
) -> Iterator[RunningStack]:
    """Start the profile's services as local processes; yields {service: "http://127.0.0.1:PORT"}.

    Before anything starts: one stack per state_dir (a second is refused, naming the first), and
    every port the services will listen on must be free. Each service starts after its dependencies
    answer their health URL (bounded by startup_timeout_s), with a progress line every progress_s; a
    service that exits or whose health says it gave up stops the launch at once (StackError with its
    last log lines). Redis (the compose `redis` service) is expected on the host, or with
    start_redis=True started for this stack in a per-run folder when none answers. On exit, also
    on a failed start, every process is stopped, last started first. Logs: one folder per run,
    <state_dir>/logs/<run>/<service>.log, and <state_dir>/logs/latest names this run's.
    """
    compose = load_compose() if compose is None else compose
    state_dir = Path(state_dir)
    external_ports = dict(EXTERNAL_PORTS, **({"redis": redis_port} if redis_port else {}))
    plan = plan_profile(profile, overrides, compose=compose, state_dir=state_dir, external_ports=external_ports)
    externals = {
        name: port
        for name, svc in profile_services(compose, profile).items()
        if "build" not in svc
        for prefix, port in external_ports.items()
        if str(svc.get("image", "")).startswith(prefix)
    }
    lock = stack_run.RunLock(state_dir)
    lock.acquire()
    processes: list[stack_run.Proc] = []
    run_dir = stack_run.new_run_dir(state_dir)
    log_dir = stack_run.new_log_dir(state_dir)
    try:
        stack_run.check_ports(
            {s.name: s.port for s in plan if s.port}, {s.name: s.port_var for s in plan if s.port_var}
        )
        for name, port in externals.items():
            if start_redis and name == "redis":
                proc = stack_run.start_redis(port, run_dir, REPO_ROOT, log)
                processes.extend([proc] if proc else [])
            elif not stack_run.reachable(port):
                raise stack_run.StackError(
                    f"{name} is expected on {LOOPBACK}:{port} and does not answer; "
                    f"start it first (bash tools/ensure_redis.sh)"
                )
        for service in plan:  # named volumes and bind mounts the services write to
            for key in ("JEV_ASSET_DIR",):
                if key in service.env and service.env[key].startswith(str(state_dir)):
                    Path(service.env[key]).mkdir(parents=True, exist_ok=True)
        base_env = shared_environ(os.environ, plan)
        base_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT / "services"), str(REPO_ROOT)]
            + ([base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else [])
        )
        info = {
            "pid": os.getpid(),
            "profile": profile,
            "started": time.time(),
            "run_dir": str(run_dir),
            "log_dir": str(log_dir),
            "urls": {},
            "processes": [],
        }

        def record() -> None:
            info["processes"] = [
                {"name": p.name, "pid": p.pid, "argv": p.argv, "log": str(p.log_path)} for p in processes
            ]
            lock.write(info)

        record()
        for service in plan:
            proc = stack_run.spawn(
                service.name,
                service.argv,
                {**base_env, **service.env},
                REPO_ROOT,
                log_dir / f"{service.name}.log",
                service.url,
            )
            processes.append(proc)
            record()
            log(f"local_stack: started {service.name} (pid {proc.pid}) on {service.url or '-'}; log {proc.log_path}")
            if service.health_url:
                stack_run.wait_healthy(
                    proc,
                    service.health_url,
                    others=processes[:-1],
                    timeout_s=startup_timeout_s,
                    log=log,
                    progress_s=progress_s,
                )
                log(f"local_stack: {service.name} healthy")
        urls = {service.name: service.url for service in plan if service.url}
        info["urls"] = urls
        record()
        yield RunningStack(urls, processes, run_dir, log_dir)
    except stack_run.StackError as exc:
        log(f"local_stack: {exc}")  # the cause first, then the lines saying what was stopped
        exc.reported = True
        raise
    finally:
        stack_run.stop_all(processes, log=log)
        shutil.rmtree(run_dir, ignore_errors=True)
        lock.release()


def _parse_sets(items: list[str]) -> dict[str, dict[str, str]]:
    overrides: dict[str, dict[str, str]] = {}
    for item in items:
        target, sep, value = item.partition("=")
        service, dot, key = target.partition(".")
        if not sep or not dot or not service or not key:
            raise argparse.ArgumentTypeError(f"--set wants SERVICE.KEY=VALUE, got {item!r}")
        overrides.setdefault(service, {})[key] = value
    return overrides


class Stopped(BaseException):
    """SIGINT/SIGTERM/SIGHUP reached the supervisor (a BaseException, like KeyboardInterrupt)."""


def _install_signal_handlers() -> None:
    """The first SIGINT/SIGTERM/SIGHUP stops the stack; more of them while it stops are ignored,
    so a second Ctrl-C cannot cut the cleanup short."""
    state = {"stopping": False}

    def handler(signum, _frame):
        if state["stopping"]:
            return
        state["stopping"] = True
        raise Stopped(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.local_stack", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        nargs="?",
        choices=("up", "down", "plan"),
        default="up",
        help="up (default): start and supervise until Ctrl-C; down: stop the stack another "
        "shell started; plan: print the processes, env and ports",
    )
    parser.add_argument("--profile", default=os.environ.get("PROFILE", "cpu"))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SERVICE.KEY=VALUE",
        help="env override for one service (repeatable)",
    )
    parser.add_argument("--plan", action="store_true", help="same as the plan command")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--state-dir", default=str(STATE_DIR), help="logs, lock and per-run folders")
    parser.add_argument("--compose", default=str(COMPOSE_FILE), help="the compose file to run")
    parser.add_argument("--redis-port", type=int, default=None, help="where the stack's Redis is (default 6379)")
    parser.add_argument(
        "--no-redis",
        dest="start_redis",
        action="store_false",
        help="do not start a Redis for the stack when none answers; fail instead",
    )
    args = parser.parse_args(argv)
    state_dir = Path(args.state_dir)
    if args.command == "down":
        if not stack_run.stop_running(state_dir):
            stack_run.say("local_stack: no local stack is running")
        return 0
    overrides = _parse_sets(args.set)
    if args.plan or args.command == "plan":
        for service in plan_profile(args.profile, overrides, compose=load_compose(args.compose)):
            print(f"{service.name}: {shlex.join(service.argv)}  (port {service.port}, health {service.health_url})")
            for key, value in sorted(service.env.items()):
                print(f"    {key}={shown(key, value)}")
        return 0
    _install_signal_handlers()
    try:
        with start_profile(
            args.profile,
            overrides,
            compose=load_compose(args.compose),
            startup_timeout_s=args.startup_timeout,
            state_dir=state_dir,
            start_redis=args.start_redis,
            redis_port=args.redis_port,
        ) as stack:
            stack_run.say(
                "local_stack: up — "
                + ", ".join(f"{k} {v}" for k, v in stack.items())
                + " (Ctrl-C or `make down` stops it)"
            )
            while True:
                stack.check()
                time.sleep(0.5)
    except Stopped as stop:
        if stack_run.down_requested(state_dir, os.getpid()):  # `make down`: a clean stop, not a failure
            stack_run.say("local_stack: stopped by `down`; every process of the stack is stopped")
            return 0
        stack_run.say(f"local_stack: {stop.args[0]} received; every process of the stack is stopped")
        return 128 + getattr(signal, str(stop.args[0])).value
    except (stack_run.StackError, KeyError, ValueError) as exc:
        if not getattr(exc, "reported", False):
            stack_run.say(f"local_stack: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
