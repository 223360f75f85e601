#!/usr/bin/env bash
# Compile causal-conv1d into a wheel against the torch of a given Python, here on a machine with no GPU
# (compiling needs none): for a GPU machine that has its own torch (the lent H100/H200 has torch 2.11.0+cu130
# on Python 3.12) and to which torch itself is too large to carry. nvcc, headers and libcudart come from
# PyPI's cuda-toolkit wheels (the release matching that torch's CUDA), laid out as a CUDA_HOME here; the
# build itself is images/build_causal_conv1d.sh, the same steps as images/cuda.Dockerfile.
#
#   bash tools/causal_conv1d_wheel.sh PYTHON OUT_DIR [CUDA_ARCH]
#   e.g.  python3.12 -m venv /tmp/t && /tmp/t/bin/pip install torch==2.11.0 packaging wheel setuptools ninja
#         bash tools/causal_conv1d_wheel.sh /tmp/t/bin/python .cache/wheels/torch2.11.0-cu130 9.0
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
python="$1" out="$2" arch="${3:-9.0}"
version="$(sed -n 's/^ARG CAUSAL_CONV1D_VERSION=//p' "$ROOT/images/cuda.Dockerfile")"
cuda="$("$python" -c 'import torch; print(torch.version.cuda or "")')"
[ -n "$cuda" ] || { echo "$python: its torch is not a CUDA build" >&2; exit 2; }
major="${cuda%%.*}"
# the toolkit release of torch's own CUDA wheels (torch 2.11.0: cuda-toolkit 13.0.2), else the newest 13.0.x
toolkit="$("$python" -m pip show cuda-toolkit 2>/dev/null | sed -n 's/^Version: //p')"
toolkit="${toolkit:-$cuda.*}"
home="${JEV_CUDA_PYPI_DIR:-$ROOT/.cache/cuda-pypi}/$toolkit"
if [ ! -x "$home/nvidia/cu$major/bin/nvcc" ]; then
  rm -rf "$home"
  PIP_FIND_LINKS= "$python" -m pip install --quiet --disable-pip-version-check --target "$home" \
    "cuda-toolkit[nvcc,cudart,cccl,crt]==$toolkit"
  # cuda-toolkit 13.0.2's extras leave nvvm (cicc) unpinned: a newer nvvm writes PTX this ptxas refuses
  # ("Unsupported .version 9.5"); pin it to nvcc's own release
  nvcc_version="$(ls "$home" | sed -n 's/^nvidia_cuda_nvcc-\(.*\)\.dist-info$/\1/p')"
  nvvm_version="$(ls "$home" | sed -n 's/^nvidia_nvvm-\(.*\)\.dist-info$/\1/p')"
  if [ "$nvvm_version" != "$nvcc_version" ]; then
    echo "nvvm $nvvm_version != nvcc $nvcc_version: installing nvidia-nvvm==$nvcc_version"
    rm -rf "$home/nvidia_nvvm-$nvvm_version.dist-info" "$home/nvidia/cu$major/nvvm"
    PIP_FIND_LINKS= "$python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$home.nvvm" \
      "nvidia-nvvm==$nvcc_version"
    cp -a "$home.nvvm/." "$home/" && rm -rf "$home.nvvm"
  fi
  ln -sfn lib "$home/nvidia/cu$major/lib64"
  ln -sfn "libcudart.so.$major" "$home/nvidia/cu$major/lib/libcudart.so"
fi
export CUDA_HOME="$home/nvidia/cu$major" TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export PATH="$(dirname "$python"):$CUDA_HOME/bin:$PATH"
"$CUDA_HOME/bin/nvcc" --version | tail -1
echo "causal-conv1d $version for torch $("$python" -c 'import torch; print(torch.__version__)'), sm ${arch}"
bash "$ROOT/images/build_causal_conv1d.sh" "$version" "$out"
ls -l "$out"
