# syntax=docker/dockerfile:1
# Signalbox server image: one image, one entrypoint (`signalbox-server`); the
# command picks the part (api, worker, beat, smtp, flower, db upgrade). The
# `signalbox` client CLI (clients/python) is in it too, for jobs and debugging:
#   docker run --rm --entrypoint signalbox IMAGE --help
# docker-compose.yml runs every part against PostgreSQL 16 and Redis 7;
# deploy/kubernetes runs it with a read-only root filesystem (writes go to
# /data and /tmp only) as user 10001.
FROM python:3.11-slim

ARG UV_VERSION=0.13.9

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    PATH="/app/.venv/bin:${PATH}" \
    SIGNALBOX_DATA_DIR=/data

RUN pip install --no-cache-dir "uv==${UV_VERSION}"

WORKDIR /app

# Dependencies first, in their own layer: it is rebuilt only when the lock
# changes. --all-packages: the server and the workspace's client (`signalbox`).
COPY pyproject.toml uv.lock README.md ./
COPY clients/python/pyproject.toml clients/python/README.md clients/python/
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --all-packages --no-install-project --no-install-workspace

COPY alembic.ini ./
COPY config ./config
COPY migrations ./migrations
COPY workers ./workers
COPY app ./app
COPY clients/python/src clients/python/src
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --all-packages

# Non-root; /data holds what the processes write (beat's schedule file,
# heartbeats, metric files).
RUN useradd --create-home --uid 10001 --user-group signalbox \
    && mkdir -p /data \
    && chown signalbox:signalbox /data
USER signalbox

EXPOSE 8040 2525 5555 9100
ENTRYPOINT ["signalbox-server"]
CMD ["api"]
