#!/usr/bin/env bash
# Compile causal-conv1d from its sdist (never its prebuilt-wheel download) into a wheel, for
# TORCH_CUDA_ARCH_LIST only, against the torch of the `python` on PATH. Used by images/cuda.Dockerfile
# and by tools/causal_conv1d_wheel.sh (a wheel for another torch, e.g. a GPU machine's own). Needs nvcc
# under CUDA_HOME matching torch's CUDA major.minor; needs no GPU.
#
#   build_causal_conv1d.sh VERSION OUT_DIR
set -euo pipefail
version="$1" out="$2"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
: "${TORCH_CUDA_ARCH_LIST:?set TORCH_CUDA_ARCH_LIST (e.g. 9.0)}"
# the sdist's setup.py imports torch to describe itself: no build isolation, no CUDA build while downloading
CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE python -m pip download --no-deps --no-binary :all: --no-build-isolation \
  -d "$work" "causal-conv1d==$version"
tar -xzf "$work/causal_conv1d-$version.tar.gz" -C "$work"
python "$here/causal_conv1d_arch.py" "$work/causal_conv1d-$version/setup.py"
mkdir -p "$out"
CAUSAL_CONV1D_FORCE_BUILD=TRUE python -m pip wheel --no-build-isolation --no-deps -w "$out" "$work/causal_conv1d-$version"
