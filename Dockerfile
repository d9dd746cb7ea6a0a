# One gateway node. The fleet (docker-compose.yml, docs/fleet.md) runs several of these on one
# PostgreSQL database, each with its own /data volume for the cache.

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the wheel is made of: pyproject.toml names README.md, and the wheel packs migrations/.
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY migrations ./migrations
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GATEWAY_DATA_DIR=/data
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin gateway \
    && mkdir -p /data && chown gateway:gateway /data
USER gateway
WORKDIR /data
# The cache, the node id and (on SQLite) the database: the node's identity lives with its data.
VOLUME ["/data"]
# 9000: the S3 API; 9001: the fleet's internal API (port + 1 unless GATEWAY_INTERNAL_PORT).
EXPOSE 9000 9001
# slim has no curl: the standard library asks /readyz, which answers 200 while the node serves
# and its database, cache folder and encryption key are usable (/healthz: it serves at all).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('GATEWAY_PORT', '9000') + '/readyz', timeout=4)"]
ENTRYPOINT ["gateway"]
CMD ["serve", "--host", "0.0.0.0"]
