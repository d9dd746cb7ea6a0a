"""Starlette routes for operators: /healthz (liveness: 200 once the node serves), /readyz
(readiness: 200 while its database, cache folder and secrets' key are usable) and /metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin import metrics as node_metrics

ADMIN_PATHS = ("/healthz", "/readyz", "/metrics")

# Each check's answer: "ok", or the class of what is wrong (no addresses, paths or secrets:
# /readyz answers anyone; the log says the rest).
Checks = Callable[[], Awaitable[dict[str, str]]]


def admin_app(ready: Callable[[], bool], checks: Checks | None = None) -> Starlette:
    async def healthz(request: Request) -> Response:
        if not ready():
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if not ready():
            return JSONResponse({"status": "starting"}, status_code=503)
        found = await checks() if checks is not None else {}
        if all(answer == "ok" for answer in found.values()):
            return JSONResponse({"status": "ready", "checks": found})
        return JSONResponse({"status": "not ready", "checks": found}, status_code=503)

    async def metrics(request: Request) -> Response:
        await node_metrics.gather()  # every worker's figures published: exact at scrape time
        return Response(generate_latest(node_metrics.scrape()), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET", "HEAD"]),
            Route("/readyz", readyz, methods=["GET", "HEAD"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )
