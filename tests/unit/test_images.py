"""images/: the Dockerfiles say what docs/deploy.md promises, the causal-conv1d patch computes the right
flags, and the Prometheus example names services that exist in docker-compose.yml."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CPU = (ROOT / "images" / "cpu.Dockerfile").read_text()
CUDA = (ROOT / "images" / "cuda.Dockerfile").read_text()
REQUIREMENTS = (ROOT / "requirements.txt").read_text()


def _stages(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^FROM\s+(\S+)\s+AS\s+(\S+)\s*$", text, re.M | re.I)


def _last_user(text: str, stage: str) -> str:
    body = re.split(r"^FROM .+$", text, flags=re.M)
    names = [s for _, s in _stages(text)]
    users = re.findall(r"^USER\s+(\S+)", body[names.index(stage) + 1], re.M)
    return users[-1] if users else "root"


def test_torch_is_pinned_once_and_the_images_read_the_pin():
    assert re.search(r"^torch==2\.13\.0$", REQUIREMENTS, re.M)
    for text in (CPU, CUDA):
        assert "grep -E '^torch==' /tmp/req/requirements.txt" in text
        assert "pip install --no-deps -r /tmp/req/requirements-model.txt" in text


def test_cpu_image_is_multistage_slim_nonroot_with_healthcheck():
    stages = _stages(CPU)
    assert [s for _, s in stages] == ["builder", "runtime", "clm"]
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in CPU
    assert "https://download.pytorch.org/whl/cpu" in CPU
    assert _last_user(CPU, "runtime") == "jev" and _last_user(CPU, "clm") == "jev"
    assert "COPY --from=builder /opt/venv /opt/venv" in CPU
    for folder in ("services", "recipes", "tools"):
        assert f"COPY {folder}/ /app/{folder}/" in CPU
    assert "PYTHONPATH=/app/services:/app" in CPU
    assert re.search(r"^HEALTHCHECK .*tools\.healthcheck", CPU, re.M)
    assert "contrastive-lm==${CLM_VERSION}" in CPU and "ARG CLM_VERSION=0.1.0" in CPU


def test_cuda_image_devel_builder_runtime_final_and_pins():
    stages = _stages(CUDA)
    # builder, the compiled wheel alone (a build output), and the serving stage last (a plain build's target)
    assert [s for _, s in stages] == ["builder", "wheels", "runtime"]
    version = re.search(r"^ARG CUDA_VERSION=(\S+)$", CUDA, re.M).group(1)
    assert re.fullmatch(r"1[23]\.\d+\.\d+", version)
    assert stages[0][0] == "${DEVEL_BASE}" and stages[1][0] == "scratch" and stages[2][0] == "${RUNTIME_BASE}"
    assert "ARG DEVEL_BASE=nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU}" in CUDA
    assert "ARG RUNTIME_BASE=nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}" in CUDA
    assert 'ARG CUDA_ARCH=9.0' in CUDA and "TORCH_CUDA_ARCH_LIST=${CUDA_ARCH}" in CUDA
    assert re.search(r"^ARG CAUSAL_CONV1D_VERSION=\d+\.\d+\.\d+$", CUDA, re.M)
    build = (ROOT / "images" / "build_causal_conv1d.sh").read_text()  # the one build of causal-conv1d
    assert "build_causal_conv1d.sh" in CUDA and "causal_conv1d_arch.py" in CUDA
    assert "pip wheel --no-build-isolation" in build and "CAUSAL_CONV1D_FORCE_BUILD=TRUE" in build
    assert "causal_conv1d_arch.py" in build
    # TORCH_CUDA empty by default: derived from CUDA_VERSION (cu + major + minor) in the builder
    assert re.search(r"^ARG TORCH_CUDA=$", CUDA, re.M)
    assert 'torch_cuda="${TORCH_CUDA:-cu$(echo "${cuda_mm}" | tr -d .)}"' in CUDA
    assert _last_user(CUDA, "runtime") == "jev"
    assert "PYTHONPATH=/app/services:/app" in CUDA
    assert re.search(r"^HEALTHCHECK .*tools\.healthcheck", CUDA, re.M)


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
    assert _flags("9.0+PTX") == ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90,code=compute_90"]
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
