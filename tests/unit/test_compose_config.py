"""docker-compose.yml, profile by profile: `docker compose config` when the CLI works, and structural checks.

The structural checks always run (PyYAML, merge keys resolved): image/build, healthchecks on /health
at the listening port, the env CONTRACTS.md names, depends_on inside the profile and on health (or, for
a one-shot job, on its successful completion), GPU reservations, the frontend on 8080 pointing at that
profile's backend, every JEV_RECIPE existing; and the security defaults: only the frontend published
beyond loopback, Redis behind a password that every service gets, Prometheus scraping every service.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from jev_common.recipe import load_recipe
from tools.local_stack import interpolate, profile_services

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
CONTRACTS = (ROOT / "docs" / "CONTRACTS.md").read_text()

DATA = yaml.safe_load(COMPOSE.read_text())
SERVICES = DATA["services"]
PROFILES = sorted({p for svc in SERVICES.values() for p in svc.get("profiles") or []})
ENV = {}  # interpolate with defaults only, as a fresh shell would
PROMETHEUS = yaml.safe_load((ROOT / "images" / "prometheus.yml").read_text())

REQUIRED_ENV = {
    "jev_worker": [
        "JEV_WORKER_HOST",
        "JEV_WORKER_PORT",
        "JEV_RECIPE",
        "JEV_DEVICE",
        "JEV_REDIS_URL",
        "JEV_ASSET_DIR",
        "JEV_WORKER_ID",
    ],
    "jev_frontend": ["JEV_FRONTEND_HOST", "JEV_FRONTEND_PORT", "JEV_BACKEND_URL", "JEV_FRONTEND_TIMEOUT_S"],
    "jev_preencoder": [
        "JEV_PREENCODER_HOST",
        "JEV_PREENCODER_PORT",
        "JEV_RECIPE",
        "JEV_DEVICE",
        "JEV_ASSET_DIR",
        "JEV_REDIS_URL",
    ],
}
# profiles that run a recipe in another shape than its own profile: profile -> the recipe's profile
REPLICA_PROFILES = {"cpu-replicas": "cpu"}
LISTEN_ENV = {
    "jev_worker": "JEV_WORKER_PORT",
    "jev_frontend": "JEV_FRONTEND_PORT",
    "jev_preencoder": "JEV_PREENCODER_PORT",
}


def _env(svc: dict) -> dict[str, str]:
    return {k: interpolate(str(v), ENV) for k, v in (svc.get("environment") or {}).items()}


def _module(svc: dict) -> str | None:
    command = svc.get("command") or []
    if len(command) >= 3 and command[:2] == ["python", "-m"]:
        return command[2]
    return None


def _listen_port(svc: dict) -> int:
    module = _module(svc)
    if module in LISTEN_ENV:
        return int(_env(svc)[LISTEN_ENV[module]])
    command = [interpolate(str(c), ENV) for c in svc.get("command") or []]
    return int(command[command.index("--port") + 1])


def _one_shot(svc: dict) -> bool:
    return str(svc.get("restart", "no")) == "no" and (svc.get("healthcheck") or {}).get("disable") is True


def _waits_for(services: dict, name: str, target: str, seen: frozenset = frozenset()) -> bool:
    """name depends on target, directly or through its dependencies."""
    deps = services[name].get("depends_on") or {}
    return target in deps or any(d not in seen and _waits_for(services, d, target, seen | {name}) for d in deps)


def _reserves_gpu(svc: dict) -> bool:
    devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
    return any(
        d.get("driver") == "nvidia" and d.get("count") == 1 and "gpu" in (d.get("capabilities") or []) for d in devices
    )


def test_contract_names_every_required_env_var():
    for names in REQUIRED_ENV.values():
        for name in names:
            assert name in CONTRACTS, f"{name} is not in docs/CONTRACTS.md"


def test_anchors_avoid_repetition():
    text = COMPOSE.read_text()
    for anchor in ("x-worker-cpu: &worker-cpu", "x-worker-gpu: &worker-gpu", "x-frontend: &frontend"):
        assert anchor in text
    assert text.count("<<: *worker-gpu") >= 5 and text.count("<<: *worker-cpu") >= 2


def test_profiles_cover_every_recipe_and_the_two_required_ones():
    from jev_common.recipe import all_recipes

    recipe_profiles = {r.compose_profile for r in all_recipes()}
    assert {"cpu", "jev-vl"} <= set(PROFILES)
    assert recipe_profiles | set(REPLICA_PROFILES) == set(PROFILES)


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_structure(profile):
    services = profile_services(DATA, profile)
    assert services
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), f"{name}: no image or build"
        if _one_shot(svc):  # a job: dependents wait for it to exit 0
            dependents = [n for n, s in services.items() if name in (s.get("depends_on") or {})]
            assert dependents, f"{name}: a one-shot job nothing waits for"
            assert svc.get("x-local-stack") == "skip", f"{name}: tools/local_stack would run a job as a service"
            continue
        test = (svc.get("healthcheck") or {}).get("test")
        assert test, f"{name}: no healthcheck"
        if "build" in svc:
            build = svc["build"]
            dockerfile = ROOT / build.get("context", ".") / build["dockerfile"]
            assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
            if build.get("target"):
                assert re.search(
                    rf"^FROM .+ AS {re.escape(build['target'])}\s*$", dockerfile.read_text(), re.M | re.I
                ), f"{name}: no stage {build['target']} in {dockerfile.name}"
            url = next(t for t in test if str(t).startswith("http"))
            assert url == f"http://127.0.0.1:{_listen_port(svc)}/health", f"{name}: healthcheck {url}"
        deps = svc.get("depends_on") or {}
        for dep, condition in deps.items():
            assert dep in services, f"{name} depends on {dep}, which is not in profile {profile}"
            wanted = "service_completed_successfully" if _one_shot(services[dep]) else "service_healthy"
            assert condition == {"condition": wanted}, f"{name} -> {dep}: {condition}"
        module = _module(svc)
        env = _env(svc)
        for key in REQUIRED_ENV.get(module, []):
            assert env.get(key), f"{name}: {key} not set"
        if env.get("JEV_REDIS_URL"):
            host = re.match(r"redis://(?:[^@/]*@)?([^:/]+)", env["JEV_REDIS_URL"]).group(1)
            assert host in services and services[host]["image"].startswith("redis:"), f"{name}: redis {host}"
            assert _waits_for(services, name, host), f"{name} uses redis but does not wait for it"
        if env.get("JEV_RECIPE"):
            recipe = load_recipe(env["JEV_RECIPE"])
            assert recipe.name == env["JEV_RECIPE"]
            assert recipe.compose_profile == REPLICA_PROFILES.get(profile, profile), (
                f"{name}: recipe {recipe.name} belongs to {recipe.compose_profile}"
            )
        if env.get("JEV_DEVICE") == "cuda":
            assert _reserves_gpu(svc), f"{name}: JEV_DEVICE=cuda without a GPU reservation"
            assert "cuda.Dockerfile" in svc["build"]["dockerfile"], f"{name}: GPU service on the CPU image"
        if module in ("jev_worker", "jev_preencoder"):
            volumes = [interpolate(v, ENV) for v in svc.get("volumes") or []]
            assert any(v.endswith(":/data/hf:ro") for v in volumes), f"{name}: no read-only HF cache mount"
            assert env.get("HF_HOME") == "/data/hf" and env.get("HF_HUB_OFFLINE") == "1"
            assert any(v.startswith("jev-assets:") and v.split(":")[1] == env["JEV_ASSET_DIR"] for v in volumes)


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_frontend_on_8080_points_at_its_backend(profile):
    services = profile_services(DATA, profile)
    frontends = {n: s for n, s in services.items() if _module(s) == "jev_frontend"}
    assert len(frontends) == 1, f"{profile}: frontends {sorted(frontends)}"
    ((name, frontend),) = frontends.items()
    ports = [interpolate(p, ENV) for p in frontend.get("ports") or []]
    assert ports == ["8080:8080"]
    publishers = [
        n for n, s in services.items() if any(interpolate(p, ENV).startswith("8080:") for p in s.get("ports") or [])
    ]
    assert publishers == [name]
    backend = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", _env(frontend)["JEV_BACKEND_URL"])
    assert backend, _env(frontend)["JEV_BACKEND_URL"]
    host, port = backend.group(1), int(backend.group(2))
    assert host in services and host in (frontend.get("depends_on") or {})
    assert _listen_port(services[host]) == port


@pytest.mark.parametrize("profile", PROFILES)
def test_the_frontend_is_the_preencoders_only_way_in(profile):
    """A profile's serving preencoder is not published: its frontend names it in JEV_PREENCODER_URL (and answers
    POST /v1/preencode by passing it on); a profile without one leaves the route unserved."""
    services = profile_services(DATA, profile)
    (frontend,) = (s for s in services.values() if _module(s) == "jev_frontend")
    serving = {n: s for n, s in services.items() if _module(s) == "jev_preencoder" and not _one_shot(s)}
    for name, svc in serving.items():
        assert not svc.get("ports"), f"{name} is published: callers reach it through the frontend"
    url = _env(frontend).get("JEV_PREENCODER_URL")
    if not serving:
        assert not url, f"{profile}: JEV_PREENCODER_URL {url} without a preencoder"
        return
    ((name, preencoder),) = serving.items()
    assert url == f"http://{name}:{_listen_port(preencoder)}", url


@pytest.mark.parametrize("profile", PROFILES)
def test_gpu_recipes_get_a_gpu_and_cpu_recipes_do_not(profile):
    services = profile_services(DATA, profile)
    for name, svc in services.items():
        recipe_name = _env(svc).get("JEV_RECIPE")
        if not recipe_name or _module(svc) != "jev_worker":
            continue
        recipe = load_recipe(recipe_name)
        assert _reserves_gpu(svc) == recipe.gpu, f"{name}: recipe gpu={recipe.gpu}"
        reads_images = recipe.model.modality == "vision-language"
        has_preencoder = any(
            _module(s) == "jev_preencoder" and _env(s)["JEV_RECIPE"] == recipe_name for s in services.values()
        )
        assert has_preencoder == reads_images, f"{profile}: a preencoder iff the readout reads images"


def test_cpu_profile_is_the_embedded_default():
    services = profile_services(DATA, "cpu")
    assert set(services) == {"redis", "prometheus", "worker-cpu", "frontend-cpu"}
    assert _env(services["worker-cpu"])["JEV_RECIPE"] == "smollm2-135m-cpu"
    assert _env(services["worker-cpu"])["JEV_DEVICE"] == "cpu"
    assert not _reserves_gpu(services["worker-cpu"])


def test_jev_vl_profile_shape():
    services = profile_services(DATA, "jev-vl")
    assert set(services) == {
        "redis",
        "prometheus",
        "preencode-jev-vl",
        "worker-jev-vl",
        "preencoder-jev-vl",
        "frontend-jev-vl",
    }
    for name in ("preencode-jev-vl", "worker-jev-vl", "preencoder-jev-vl"):
        assert _reserves_gpu(services[name]), name
    # the worker starts only once the one-shot preencode of the manifest has exited 0
    assert services["worker-jev-vl"]["depends_on"]["preencode-jev-vl"] == {
        "condition": "service_completed_successfully"
    }
    command = [interpolate(c, ENV) for c in services["preencode-jev-vl"]["command"]]
    assert command[:4] == ["python", "-m", "jev_preencoder", "encode"] and "--manifest" in command
    # the job and the service encode alike (one identity); only the service listens, and takes the internal token
    serving_only = {"JEV_PREENCODER_HOST", "JEV_PREENCODER_PORT", "JEV_INTERNAL_TOKENS", "JEV_INTERNAL_TOKEN_FILE"}
    job, service = _env(services["preencode-jev-vl"]), _env(services["preencoder-jev-vl"])
    assert {k: v for k, v in job.items() if k not in serving_only} == {
        k: v for k, v in service.items() if k not in serving_only
    }


def _published(svc: dict) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each published port, defaults interpolated."""
    out = []
    for item in svc.get("ports") or []:
        pieces = interpolate(str(item), ENV).split(":")
        out.append(("0.0.0.0",) + tuple(pieces) if len(pieces) == 2 else tuple(pieces))
    return out


@pytest.mark.parametrize("publish", ["", "127.0.0.1:18080"])
def test_only_the_frontend_is_published_beyond_loopback(publish):
    env = {"JEV_FRONTEND_PUBLISH": publish} if publish else {}
    for name, svc in SERVICES.items():
        for address, host_port, container_port in _published(svc):
            if _module(svc) == "jev_frontend":
                continue
            assert address == "127.0.0.1", f"{name} publishes {host_port}:{container_port} on {address}"
    frontend = SERVICES["frontend-cpu"]["ports"][0]
    assert interpolate(frontend, env) == (f"{publish}:8080" if publish else "8080:8080")


def test_redis_requires_the_password_every_service_gets():
    redis = SERVICES["redis"]
    command = redis["command"]
    secret = command[command.index("--requirepass") + 1]
    assert secret.startswith("${JEV_REDIS_PASSWORD"), secret
    assert (redis.get("environment") or {}).get("REDISCLI_AUTH") == secret  # the healthcheck authenticates
    assert "PONG" in " ".join(redis["healthcheck"]["test"])  # an unauthenticated ping answers NOAUTH, exit 0
    for name, svc in SERVICES.items():
        if _module(svc) in REQUIRED_ENV:
            url = (svc.get("environment") or {}).get("JEV_REDIS_URL")
            assert url == f"redis://default:{secret}@redis:6379/0", f"{name}: JEV_REDIS_URL {url}"
    password = interpolate(secret, {"JEV_REDIS_PASSWORD": "s3cret"})
    assert password == "s3cret"


def test_keys_on_the_frontends_and_the_internal_token_on_both_sides_never_a_default_one():
    """`JEV_API_KEYS=... docker compose up`: the keys reach the frontends only; frontends, workers and serving
    preencoders share an internal token, JEV_INTERNAL_TOKENS or one generated into the jev-secrets volume (no token is
    written in the file)."""
    keyed = {"JEV_API_KEYS": "k-1", "JEV_INTERNAL_TOKENS": "t-1"}
    for name, svc in SERVICES.items():
        module = _module(svc)
        if module not in ("jev_worker", "jev_frontend", "jev_preencoder") or _one_shot(svc):
            continue
        env = svc.get("environment") or {}
        assert interpolate(str(env["JEV_INTERNAL_TOKENS"]), ENV) == "", f"{name} ships a default token"
        assert interpolate(str(env["JEV_INTERNAL_TOKENS"]), keyed) == "t-1", name
        assert env["JEV_INTERNAL_TOKEN_FILE"] == "/var/lib/jev/secrets/internal-token", name
        assert "jev-secrets:/var/lib/jev/secrets" in (svc.get("volumes") or []), name
        if module == "jev_frontend":
            assert interpolate(str(env["JEV_API_KEYS"]), keyed) == "k-1", name
            assert interpolate(str(env["JEV_RATE_LIMITS"]), {"JEV_RATE_LIMITS": "default=5"}) == "default=5", name
            assert interpolate(str(env["JEV_RATE_LIMITS"]), ENV) == "", f"{name} ships a default limit"
        else:
            assert "JEV_API_KEYS" not in env, f"{name}: the callers' keys are the frontend's"
    assert "jev-secrets" in DATA["volumes"]
    for dockerfile in ("cpu", "cuda"):  # the volume starts as the image's folder: owned by the services' user
        text = (ROOT / "images" / f"{dockerfile}.Dockerfile").read_text()
        assert "/var/lib/jev/secrets" in text and "chmod 700 /var/lib/jev/secrets" in text, dockerfile


def test_make_up_gives_the_keys_to_the_frontend_only(tmp_path):
    """`JEV_API_KEYS=k make up` runs the profile as local processes: the shell's keys reach the frontend, not the
    worker (which would then refuse the frontend), and both read one token file in the stack's folder."""
    from tools.local_stack import plan_profile, shared_environ

    environ = {"JEV_API_KEYS": "k-1", "PATH": "/bin", "HF_HOME": "/x"}
    plan = {s.name: s for s in plan_profile("cpu", environ=environ, state_dir=tmp_path)}
    worker, frontend = plan["worker-cpu"], plan["frontend-cpu"]
    inherited = shared_environ(environ, list(plan.values()))
    assert "JEV_API_KEYS" not in {**inherited, **worker.env} and inherited["PATH"] == "/bin"
    assert {**inherited, **frontend.env}["JEV_API_KEYS"] == "k-1"
    token_file = str(tmp_path / "jev-secrets" / "internal-token")
    assert worker.env["JEV_INTERNAL_TOKEN_FILE"] == frontend.env["JEV_INTERNAL_TOKEN_FILE"] == token_file


def test_local_processes_drop_the_password_for_the_host_redis():
    """tools/local_stack runs the services against the host's Redis (no password, tools/ensure_redis.sh)."""
    from tools.local_stack import plan_profile

    plan = {s.name: s for s in plan_profile("cpu", environ={"JEV_REDIS_PASSWORD": "s3cret"})}
    assert set(plan) == {"worker-cpu", "frontend-cpu"}  # Prometheus is compose-only
    assert plan["worker-cpu"].env["JEV_REDIS_URL"] == "redis://127.0.0.1:6379/0"


def test_prometheus_scrapes_every_service_of_every_profile():
    prometheus = SERVICES["prometheus"]
    assert set(prometheus["profiles"]) == set(PROFILES)
    assert "./images/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert prometheus.get("x-local-stack") == "skip"
    targets = {}
    for job in PROMETHEUS["scrape_configs"]:
        for group in job["static_configs"]:
            for target in group["targets"]:
                targets[target] = job["job_name"]
    for name, svc in SERVICES.items():
        module = _module(svc)
        if module in LISTEN_ENV and not _one_shot(svc):
            target = f"{name}:{_listen_port(svc)}"
            assert targets.get(target) == f"jev-{module.removeprefix('jev_')}", f"{target} not scraped"
    assert PROMETHEUS["global"]["scrape_interval"] in ("5s", "10s", "15s")


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30)
    return [docker, "compose"] if probe.returncode == 0 else None


@pytest.mark.parametrize("profile", PROFILES)
def test_docker_compose_config_accepts_profile(profile):
    cli = _compose_cli()
    if cli is None:
        pytest.skip("the docker compose CLI plugin is not installed here; structural checks above cover the file")
    result = subprocess.run(
        cli + ["-f", str(COMPOSE), "--profile", profile, "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def test_replica_profile_routes_one_frontend_over_two_workers():
    services = profile_services(DATA, "cpu-replicas")
    workers = {n: s for n, s in services.items() if _module(s) == "jev_worker"}
    assert len(workers) == 2
    ids = {_env(s)["JEV_WORKER_ID"] for s in workers.values()}
    assert len(ids) == 2  # each replica its own owner in the index
    for name, svc in workers.items():
        assert _env(svc)["JEV_WORKER_URL"] == f"http://{name}:8000"  # what the index tells a router
    (frontend,) = [s for s in services.values() if _module(s) == "jev_frontend"]
    backends = [item.split("=", 1) for item in _env(frontend)["JEV_BACKENDS"].split(",")]
    assert {url for _, url in backends} == {f"http://{name}:8000" for name in workers}
    assert {model for model, _ in backends} == {_env(frontend)["JEV_DEFAULT_MODEL"]} == {"smollm2-135m-cpu"}
    assert set(frontend["depends_on"]) == set(workers)
