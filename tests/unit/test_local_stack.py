"""tools/local_stack.py: compose -> local process translation (no model), and a real start/stop cycle."""

from __future__ import annotations

import json
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tools import local_stack as ls

ROOT = Path(__file__).resolve().parents[2]


def test_interpolate_follows_compose_rules():
    env = {"SET": "x", "EMPTY": ""}
    assert ls.interpolate("${SET:-d}", env) == "x"
    assert ls.interpolate("${EMPTY:-d}", env) == "d"
    assert ls.interpolate("${EMPTY-d}", env) == ""
    assert ls.interpolate("${MISSING-d}", env) == "d"
    assert ls.interpolate("${MISSING:-${SET}/y}", env) == "x/y"
    assert ls.interpolate("$$HOME and $SET", env) == "$HOME and x"
    assert ls.interpolate("${SET:+alt}|${EMPTY:+alt}", env) == "alt|"
    with pytest.raises(ValueError, match="MISSING"):
        ls.interpolate("${MISSING:?set it}", env)


def test_cpu_profile_plan(tmp_path):
    plan = ls.plan_profile("cpu", environ={}, state_dir=tmp_path / "state")
    assert [s.name for s in plan] == ["worker-cpu", "frontend-cpu"]  # redis is expected on the host
    worker, frontend = plan
    assert worker.argv == [sys.executable, "-m", "jev_worker"]
    assert frontend.argv == [sys.executable, "-m", "jev_frontend"]
    assert worker.env["JEV_RECIPE"] == "smollm2-135m-cpu"
    assert worker.env["JEV_WORKER_HOST"] == "127.0.0.1" and frontend.env["JEV_FRONTEND_HOST"] == "127.0.0.1"
    assert worker.env["JEV_REDIS_URL"] == "redis://127.0.0.1:6379/0"
    assert frontend.env["JEV_BACKEND_URL"] == "http://127.0.0.1:8000"
    assert (worker.port, frontend.port) == (8000, 8080)
    assert worker.health_url == "http://127.0.0.1:8000/health"
    assert frontend.health_url == "http://127.0.0.1:8080/health"
    assert frontend.depends_on == ["worker-cpu"] and worker.depends_on == []  # redis dropped: not ours
    assert worker.env["JEV_ASSET_DIR"] == str(tmp_path / "state" / "jev-assets")
    assert worker.env["HF_HOME"] == str(ROOT / ".cache" / "huggingface")
    assert worker.env["JEV_DEADLINE_S"] == "300"


def test_env_paths_and_overrides(tmp_path):
    environ = {
        "JEV_MODELS_DIR": str(tmp_path / "models"),
        "JEV_HF_HOME": "/srv/hf",
        "JEV_DEADLINE_S": "7",
        "JEV_FRONTEND_PUBLISH": "9999",
    }
    plan = {
        s.name: s
        for s in ls.plan_profile(
            "jev-vl", {"worker-jev-vl": {"JEV_DEVICE": "cpu"}}, environ=environ, state_dir=tmp_path
        )
    }
    assert set(plan) == {"worker-jev-vl", "preencoder-jev-vl", "frontend-jev-vl"}
    assert list(plan).index("frontend-jev-vl") > list(plan).index("worker-jev-vl")
    worker = plan["worker-jev-vl"]
    assert worker.env["JEV_MODEL_PATH"] == str(tmp_path / "models" / "jev-27b-vl")
    assert worker.env["HF_HOME"] == "/srv/hf"
    assert worker.env["JEV_DEADLINE_S"] == "7"
    assert worker.env["JEV_DEVICE"] == "cpu"  # the override wins
    assert plan["preencoder-jev-vl"].port == 8090 and plan["preencoder-jev-vl"].env["JEV_DEVICE"] == "cuda"
    assert plan["frontend-jev-vl"].port == 9999  # the published host port
    assert plan["frontend-jev-vl"].env["JEV_FRONTEND_PORT"] == "9999"
    assert plan["frontend-jev-vl"].health_url == "http://127.0.0.1:9999/health"
    with pytest.raises(KeyError, match="not in profile"):
        ls.plan_profile("cpu", {"worker-jev-vl": {}}, environ={})
    with pytest.raises(KeyError, match="no service"):
        ls.plan_profile("no-such-profile", environ={})


def test_every_profile_plans():
    compose = ls.load_compose()
    profiles = sorted({p for s in compose["services"].values() for p in s.get("profiles") or []})
    for profile in profiles:
        plan = ls.plan_profile(profile, environ={})
        names = [s.name for s in plan]
        assert any(n.startswith("frontend-") for n in names), profile
        for service in plan:
            for value in list(service.env.values()) + service.argv:
                assert "0.0.0.0" not in value, (profile, service.name, value)
                for other in compose["services"]:
                    assert f"://{other}:" not in value, (profile, service.name, value)


def test_port_collisions_are_resolved_and_urls_follow(tmp_path):
    compose = {
        "services": {
            "a": {
                "build": ".",
                "profiles": ["p"],
                "command": ["python", "-m", "x"],
                "environment": {"JEV_WORKER_PORT": "8000", "JEV_WORKER_HOST": "0.0.0.0"},
                "healthcheck": {"test": ["CMD", "h", "http://127.0.0.1:8000/health"]},
            },
            "b": {
                "build": ".",
                "profiles": ["p"],
                "command": ["srv", "--host", "0.0.0.0", "--port", "8000"],
                "healthcheck": {"test": ["CMD", "h", "http://127.0.0.1:8000/health"]},
                "depends_on": {"a": {"condition": "service_healthy"}},
            },
            "c": {
                "build": ".",
                "profiles": ["p"],
                "command": ["python", "-m", "y"],
                "environment": {
                    "JEV_FRONTEND_PORT": "8080",
                    "URL_A": "http://a:8000",
                    "URL_B": "http://b:8000/x",
                    "KEEP": "http://example.invalid:1/",
                },
                "ports": ["8080:8080"],
                "depends_on": ["b"],
            },
            "redis": {"image": "redis:7-alpine", "profiles": ["p"]},
        }
    }
    plan = {s.name: s for s in ls.plan_profile("p", compose=compose, environ={}, state_dir=tmp_path)}
    assert plan["a"].port == 8000 and plan["b"].port == 8001
    assert plan["b"].argv == ["srv", "--host", "127.0.0.1", "--port", "8001"]
    assert plan["b"].health_url == "http://127.0.0.1:8001/health"
    assert plan["c"].env["URL_A"] == "http://127.0.0.1:8000"
    assert plan["c"].env["URL_B"] == "http://127.0.0.1:8001/x"
    assert plan["c"].env["KEEP"] == "http://example.invalid:1/"
    assert [s.name for s in ls.plan_profile("p", compose=compose, environ={}, state_dir=tmp_path)] == ["a", "b", "c"]


def test_dependency_cycle_is_an_error(tmp_path):
    compose = {
        "services": {
            "a": {"build": ".", "profiles": ["p"], "depends_on": ["b"]},
            "b": {"build": ".", "profiles": ["p"], "depends_on": ["a"]},
        }
    }
    with pytest.raises(ValueError, match="cycle"):
        ls.plan_profile("p", compose=compose, environ={}, state_dir=tmp_path)


SERVER = textwrap.dedent("""
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            env = {k: v for k, v in os.environ.items() if k.startswith("T_")}
            body = json.dumps({"path": self.path, "env": env}).encode()
            self.send_response(200 if self.path in ("/health", "/env") else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    HTTPServer((os.environ["T_HOST"], int(os.environ["T_PORT"])), H).serve_forever()
""")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_start_profile_starts_in_order_waits_for_health_and_stops(tmp_path):
    pa, pb = _free_port(), _free_port()
    compose = {
        "services": {
            "api": {
                "build": ".",
                "profiles": ["t"],
                "command": ["python", "-c", SERVER],
                "environment": {"T_HOST": "0.0.0.0", "T_PORT": str(pa)},
                "healthcheck": {"test": ["CMD", "x", f"http://127.0.0.1:{pa}/health"]},
            },
            "edge": {
                "build": ".",
                "profiles": ["t"],
                "command": ["python", "-c", SERVER],
                "environment": {"T_HOST": "0.0.0.0", "T_PORT": str(pb), "T_BACKEND": f"http://api:{pa}"},
                "healthcheck": {"test": ["CMD", "x", f"http://127.0.0.1:{pb}/health"]},
                "depends_on": {"api": {"condition": "service_healthy"}},
            },
        }
    }
    with ls.start_profile(
        "t", {"edge": {"T_EXTRA": "1"}}, compose=compose, state_dir=tmp_path, startup_timeout_s=30, log=lambda *_: None
    ) as urls:
        assert urls == {"api": f"http://127.0.0.1:{pa}", "edge": f"http://127.0.0.1:{pb}"}
        with urllib.request.urlopen(urls["edge"] + "/env", timeout=5) as response:
            env = json.loads(response.read())["env"]
        assert env["T_BACKEND"] == f"http://127.0.0.1:{pa}" and env["T_EXTRA"] == "1"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{pb}/health", timeout=2)


def test_start_profile_reports_a_service_that_dies(tmp_path):
    compose = {
        "services": {
            "bad": {
                "build": ".",
                "profiles": ["t"],
                "command": ["python", "-c", "import sys; print('boom'); sys.exit(3)"],
                "healthcheck": {"test": ["CMD", "x", f"http://127.0.0.1:{_free_port()}/health"]},
            }
        }
    }
    with pytest.raises(RuntimeError, match="exited with 3") as info:
        with ls.start_profile("t", compose=compose, state_dir=tmp_path, startup_timeout_s=30, log=lambda *_: None):
            pass
    assert "boom" in str(info.value)


def test_plan_never_prints_a_key_a_token_or_a_password(capsys):
    overrides = [
        "frontend-cpu.JEV_API_KEYS=k-secret",
        "frontend-cpu.JEV_INTERNAL_TOKENS=t-secret",
        "frontend-cpu.JEV_REDIS_URL=redis://default:p-secret@10.0.0.1:6379/0",
    ]
    assert ls.main(["plan", "--profile", "cpu", *[arg for item in overrides for arg in ("--set", item)]]) == 0
    printed = capsys.readouterr().out
    assert "JEV_API_KEYS=(set, not shown)" in printed and "redis://default:(not shown)@10.0.0.1:6379/0" in printed
    assert not any(secret in printed for secret in ("k-secret", "t-secret", "p-secret"))


def _noisy_service(port: int, exit_code: int | None) -> dict:
    """A service that logs which run it is (T_RUN), prints a progress bar as a JSON-wrapped warning and a raw one,
    then serves (exit_code None) or exits."""
    program = textwrap.dedent(f"""
        import json, os, sys
        print(json.dumps({{"level": "info", "logger": "t", "msg": "run " + os.environ["T_RUN"]}}), flush=True)
        bar = "Converting and de-quantizing GGUF tensors...:  40%|####      | 109/272 [00:05<00:07, 21.3it/s]"
        print(json.dumps({{"level": "warning", "logger": "stderr", "msg": bar}}), flush=True)
        print("Loading weights: 100%|##########| 21/21 [00:00<00:00, 693.52it/s]", flush=True)
        print(json.dumps({{"level": "error", "logger": "t", "msg": "last words of run " + os.environ["T_RUN"]}}))
        sys.stdout.flush()
        if {exit_code!r} is not None:
            sys.exit({exit_code!r})
        os.environ.update(T_HOST="127.0.0.1", T_PORT="{port}")
        exec({SERVER!r})
    """)
    return {
        "build": ".",
        "profiles": ["t"],
        "command": ["python", "-c", program],
        "healthcheck": {"test": ["CMD", "x", f"http://127.0.0.1:{port}/health"]},
    }


def test_each_run_logs_to_its_own_folder_and_a_failure_shows_this_runs_lines_only(tmp_path, monkeypatch):
    """Issue 49: logs were appended across runs, so a failing service's dump could show an earlier run's lines
    and progress bars tagged `warning`."""
    port = _free_port()
    monkeypatch.setenv("T_RUN", "one")
    with ls.start_profile(
        "t",
        compose={"services": {"svc": _noisy_service(port, None)}},
        state_dir=tmp_path,
        startup_timeout_s=30,
        log=lambda *_: None,
    ) as stack:
        first = stack.log_dir
    assert (tmp_path / "logs" / "latest").resolve() == first.resolve()
    assert "run one" in (first / "svc.log").read_text()

    monkeypatch.setenv("T_RUN", "two")
    with (
        pytest.raises(RuntimeError, match="exited with 3") as info,
        ls.start_profile(
            "t",
            compose={"services": {"svc": _noisy_service(port, 3)}},
            state_dir=tmp_path,
            startup_timeout_s=30,
            log=lambda *_: None,
        ),
    ):
        pass
    second = (tmp_path / "logs" / "latest").resolve()
    assert second != first.resolve() and first.is_dir()  # the earlier run's log is kept, apart
    log = (second / "svc.log").read_text()
    assert "run two" in log and "run one" not in log
    dump = str(info.value)
    assert second.name in dump, dump  # the dump names this run's log file
    assert "run two" in dump and "last words of run two" in dump
    assert "run one" not in dump
    assert "it/s" not in dump and "%|" not in dump, dump  # progress bars are not log lines


def test_the_readmes_local_stack_args_move_the_ports_and_the_urls_follow():
    """README.md's `make up LOCAL_STACK_ARGS="--set ..."` (block `local-stack-args`), its arguments as written,
    given to the plan `make up` would start: the worker and the frontend on the ports it names, the frontend's
    backend URL on the worker's new port."""
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^```bash local-stack-args\n(.*?)^```", readme, re.M | re.S).group(1).strip()
    (command,) = block.splitlines()
    assert command.startswith('make up LOCAL_STACK_ARGS="')
    args = shlex.split(command.split("=", 1)[1])[0].split()
    overrides = ls._parse_sets([value for flag, value in zip(args, args[1:]) if flag == "--set"])
    plan = {s.name: s for s in ls.plan_profile("cpu", overrides, environ={})}
    assert plan["worker-cpu"].port == 8001 and plan["frontend-cpu"].port == 8081
    assert plan["frontend-cpu"].env["JEV_BACKEND_URL"] == "http://127.0.0.1:8001"
