# Stand-in for nvidia/cuda:<CUDA_VERSION>-devel-<UBUNTU>, for machines with no registry (tools/container_ci.sh
# tags it localhost/jev-cuda-devel:<CUDA_TOOLKIT>): the stand-in Debian python base with CUDA's compiler,
# runtime, headers and CCCL from PyPI (`cuda-toolkit[nvcc,cudart,cccl,crt]`, NVIDIA's own wheels: nvcc,
# ptxas, nvvm, crt/, libcudart, cub/thrust/cuda::std) laid out as a CUDA_HOME at /usr/local/cuda. Compiling
# needs no GPU. images/cuda.Dockerfile builds on it with `--build-arg DEVEL_BASE=...` and the Debian python
# (`--build-arg PYTHON=python3.11`). Not used where the registry answers.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
# the toolkit release whose nvcc matches the torch wheel's CUDA (torch 2.13.0 on PyPI: cuda-toolkit==13.0.3)
ARG CUDA_TOOLKIT=13.0.3
ARG CUDA_MAJOR=13
ENV CUDA_HOME=/usr/local/cuda PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN set -eux; \
    python3 -m pip install --target /opt/cuda-pypi "cuda-toolkit[nvcc,cudart,cccl,crt]==${CUDA_TOOLKIT}"; \
    ln -s "/opt/cuda-pypi/nvidia/cu${CUDA_MAJOR}" "${CUDA_HOME}"; \
    ln -s lib "${CUDA_HOME}/lib64"; \
    ln -s "libcudart.so.${CUDA_MAJOR}" "${CUDA_HOME}/lib/libcudart.so"; \
    echo "${CUDA_HOME}/lib" > /etc/ld.so.conf.d/cuda.conf; ldconfig; \
    "${CUDA_HOME}/bin/nvcc" --version
ENV PATH=/usr/local/cuda/bin:$PATH CUDA_VERSION=${CUDA_TOOLKIT}
