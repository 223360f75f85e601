"""images/ besides the Dockerfiles (those are tests/unit/test_dockerfiles.py): the causal-conv1d patch computes
the right flags, .dockerignore lets in what the Dockerfiles copy, and the Prometheus example names services that
exist in docker-compose.yml."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CPU = (ROOT / "images" / "cpu.Dockerfile").read_text()
CUDA = (ROOT / "images" / "cuda.Dockerfile").read_text()


def _flags(arch_list: str | None) -> list[str]:
    """Run the patch snippet that images/causal_conv1d_arch.py inserts into causal-conv1d's setup.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cca", ROOT / "images" / "causal_conv1d_arch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = "cc_flag = ['-gencode', 'arch=compute_75,code=sm_75']\nif True:\n" + module.PATCH + "    pass\n"
    namespace = {"os": os, "HIP_BUILD": False, "print": lambda *a: None}
    old = os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
    try:
        if arch_list is not None:
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
        exec(compile(source, "setup.py", "exec"), namespace)  # noqa: S102 - our own snippet
    finally:
        os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        if old is not None:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old
    return namespace["cc_flag"]


def test_causal_conv1d_patch_flags():
    assert _flags("9.0") == ["-gencode", "arch=compute_90,code=sm_90"]
    assert _flags("8.0;9.0a") == ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90a,code=sm_90a"]
    assert _flags("9.0+PTX") == [
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-gencode",
        "arch=compute_90,code=compute_90",
    ]
    assert _flags(None) == ["-gencode", "arch=compute_75,code=sm_75"]  # unset: upstream's list stays


def test_causal_conv1d_patch_needs_its_anchor(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("cca", ROOT / "images" / "causal_conv1d_arch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = "cc_flag = []\n" + module.ANCHOR + "        pass\n"
    patched = module.patch(text)
    assert module.MARKER in patched and module.patch(patched) == patched  # idempotent
    with pytest.raises(SystemExit, match="anchor"):
        module.patch("cc_flag = []\n")


def test_dockerignore_keeps_the_context_small_but_complete():
    """An allowlist: everything out (`*`), then back in only what the Dockerfiles COPY."""
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"requirements*.txt", "services", "recipes", "tools", "images"}
    copied = set()
    for text in (CPU, CUDA):
        for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
            copied |= {s.rstrip("/").split("/")[0] for s in sources.split()}
    assert all(any(re.fullmatch(a.replace("*", ".*"), c) for a in allowed) for c in copied), copied


def test_prometheus_targets_are_compose_services():
    config = yaml.safe_load((ROOT / "images" / "prometheus.yml").read_text())
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    seen = 0
    for job in config["scrape_configs"]:
        assert job["metrics_path"] == "/metrics"
        for group in job["static_configs"]:
            for target in group["targets"]:
                host, port = target.rsplit(":", 1)
                if host != "127.0.0.1":
                    assert host in services, target
                    seen += 1
    assert seen >= 4


def test_the_images_carry_the_frontends_page():
    """Both images COPY services/ whole, and no .dockerignore exclusion drops the page's files
    (jev_frontend/static/, read when the frontend starts)."""
    from fnmatch import fnmatch

    from jev_frontend.page import FILES, STATIC_DIR

    for text in (CPU, CUDA):
        assert re.search(r"^COPY services/ /app/services/$", text, re.M)
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    excluded = [line.replace("**/", "*") for line in lines[1:] if not line.startswith("!")]
    for name in FILES:
        path = (STATIC_DIR / name).relative_to(ROOT).as_posix()
        assert path.startswith("services/") and (ROOT / path).is_file()
        assert not any(fnmatch(path, pattern) or fnmatch(name, pattern) for pattern in excluded), path
