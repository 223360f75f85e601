# Stand-in for nvidia/cuda:<CUDA_VERSION>-runtime-<UBUNTU>, for machines with no registry (tools/container_ci.sh
# tags it localhost/jev-cuda-runtime:<CUDA_TOOLKIT>): the stand-in Debian python base with CUDA's runtime
# library from PyPI (`nvidia-cuda-runtime`, via `cuda-toolkit[cudart]`) at /usr/local/cuda/lib on the loader's
# path, as the real runtime base has it. The driver (libcuda) comes from the host at run time, as with the real
# base. Not used where the registry answers.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ARG CUDA_TOOLKIT=13.0.3
ARG CUDA_MAJOR=13
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN set -eux; \
    python3 -m pip install --target /opt/cuda-pypi "cuda-toolkit[cudart]==${CUDA_TOOLKIT}"; \
    ln -s "/opt/cuda-pypi/nvidia/cu${CUDA_MAJOR}" /usr/local/cuda; \
    echo /usr/local/cuda/lib > /etc/ld.so.conf.d/cuda.conf; ldconfig
ENV CUDA_VERSION=${CUDA_TOOLKIT} NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
