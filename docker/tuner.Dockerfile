# syntax=docker/dockerfile:1
# fa2tune tuner worker: compiles kernels with nvcc and times them on the GPU it is given.
# Run one container per GPU (see docker/compose.yaml); results go to FA2TUNE_DB_URL.
#
#   docker build -f docker/tuner.Dockerfile -t fa2tune-tuner .
#   docker build -f docker/tuner.Dockerfile --build-arg CUDA_VERSION=13.0.1 -t fa2tune-tuner .
#   docker run --gpus '"device=0"' -e FA2TUNE_DB_URL=... fa2tune-tuner --d 128
ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=24.04
# devel, not runtime: the tuner runs nvcc (and ptxas) for every config it builds.
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/cuda/bin:${PATH}

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /app
COPY pyproject.toml README.md ./
COPY fa2tune ./fa2tune
COPY core ./core
COPY codegen ./codegen
COPY measure ./measure
COPY tuner ./tuner
COPY db ./db
COPY service ./service

# gpu extra: torch (reference and SDPA yardstick) and cuda-bindings (cubin loader);
# postgres extra: psycopg, so workers on several GPUs can share one database.
RUN pip install ".[gpu,postgres]" \
    && useradd --system --create-home --uid 10001 --user-group fa2tune \
    && mkdir -p /cache && chown fa2tune:fa2tune /cache

USER fa2tune

# Build cache (rendered sources, cubins) in a volume so a restarted worker does not recompile.
ENV FA2TUNE_CACHE_DIR=/cache
VOLUME ["/cache"]

ENTRYPOINT ["fa2tune", "tune"]
