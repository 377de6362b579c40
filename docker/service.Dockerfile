# syntax=docker/dockerfile:1
# fa2tune HTTP service: /v1/best, /v1/results, /v1/export/header. No GPU and no CUDA toolkit
# needed — the service only reads the results database and renders headers as text.
#
#   docker build -f docker/service.Dockerfile -t fa2tune-service .
#   docker run -p 8000:8000 -e FA2TUNE_DB_URL=postgresql+psycopg://... fa2tune-service
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Metadata first so the dependency layer is reused when only the sources change.
COPY pyproject.toml README.md ./
COPY fa2tune ./fa2tune
COPY core ./core
COPY codegen ./codegen
COPY measure ./measure
COPY tuner ./tuner
COPY db ./db
COPY service ./service

# Without the gpu extra (no torch, no cuda-bindings); psycopg for PostgreSQL; uvicorn's
# standard extra brings uvloop and httptools, which roughly double the request rate.
RUN pip install ".[postgres]" "uvicorn[standard]" \
    && useradd --system --create-home --uid 10001 --user-group fa2tune \
    && mkdir -p /data && chown fa2tune:fa2tune /data

USER fa2tune

# SQLite in a volume by default; compose points this at PostgreSQL.
ENV FA2TUNE_DB_URL=sqlite:////data/fa2tune.db \
    FA2TUNE_PORT=8000
VOLUME ["/data"]
EXPOSE 8000

# Python's urllib, because the slim image has neither curl nor wget.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('FA2TUNE_PORT', '8000') + '/healthz', timeout=4)"]

ENTRYPOINT ["fa2tune"]
CMD ["serve", "--host", "0.0.0.0"]
