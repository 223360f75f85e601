#!/usr/bin/env bash
# Install the peers of benchmarks/peers.py into their own venv, benchmarks/peers/.venv (git-ignored),
# pinned by benchmarks/peers/requirements.txt. Idempotent: a venv whose stamp matches the pins is kept.
#
# llama-cpp-python is built from source WITHOUT native CPU detection and without AMX:
# a -DGGML_NATIVE=ON build crashes on these VMs with a general protection fault inside
# libggml-cpu (AMX tile code the hypervisor does not allow). The x86 extensions follow this CPU
# (cpu_flags.py: AVX-512 only where /proc/cpuinfo lists it, else an AVX2 EPYC dies with SIGILL);
# the stamp records them, so a checkout moved to another CPU kind rebuilds.
# The build takes ~8 minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
py="${PY:-python3}"
export CMAKE_ARGS="${CMAKE_ARGS:-$("$py" "$here/cpu_flags.py")}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
stamp="$venv/.installed"
want="$(cat "$here/requirements.txt"; echo "CMAKE_ARGS=$CMAKE_ARGS")"
if [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$want" ]]; then
  echo "peers venv up to date: $venv"; exit 0
fi
test -x "$venv/bin/python" || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# llama-cpp-python first and alone (the long build); --no-binary so a prebuilt native wheel is never used
"$venv/bin/python" -m pip install --no-binary llama-cpp-python \
  "$(grep -E '^llama-cpp-python==' "$here/requirements.txt")"
"$venv/bin/python" -m pip install -r "$here/requirements.txt"
"$venv/bin/python" -m pip freeze > "$here/requirements.lock"
printf '%s' "$want" > "$stamp"
echo "peers venv ready: $venv"
