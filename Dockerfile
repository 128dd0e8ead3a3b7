# syntax=docker/dockerfile:1
# Signalbox server image: one image, one entrypoint (`signalbox-server`); the
# command picks the part (api, worker, beat, smtp, flower, db upgrade).
# docker-compose.yml runs every part against PostgreSQL 16 and Redis 7.
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
# changes. The workspace member's pyproject must be present for uv to read the
# workspace, even though the client (a dev dependency) is not installed.
COPY pyproject.toml uv.lock README.md ./
COPY clients/python/pyproject.toml clients/python/README.md clients/python/
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project --no-install-workspace

COPY alembic.ini ./
COPY config ./config
COPY migrations ./migrations
COPY workers ./workers
COPY app ./app
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev

# Non-root; /data holds what the processes write (beat's schedule file).
RUN useradd --create-home --uid 10001 --user-group signalbox \
    && mkdir -p /data \
    && chown signalbox:signalbox /data
USER signalbox

EXPOSE 8040 2525 5555
ENTRYPOINT ["signalbox-server"]
CMD ["api"]
