# syntax=docker/dockerfile:1
# One image for everything kvtier runs in a cluster:
#   kvtier run         the operator (the Helm chart's Deployment)
#   kvtier probe       the demand-curve sidecar of every engine pod (RenderOptions.probe_image)
#   kvtier sim serve   kvsim, a simulated vLLM + LMCache engine (`kvtier sim pod` in simulated pods: kind, demos)
# Build: docker build -t ghcr.io/kvtier/kvtier-operator:0.1.0 .

FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install /wheels/*.whl \
    && groupadd --gid 10001 kvtier \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kvtier \
    && kvtier --version
# Non-root; the chart also runs it with a read-only root filesystem (only /tmp is writable).
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 8081 9400
CMD ["kvtier", "run"]
