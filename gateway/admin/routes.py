"""Starlette routes for operators: /healthz (200 once the node serves) and /metrics."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin import metrics as node_metrics

ADMIN_PATHS = ("/healthz", "/metrics")


def admin_app(ready: Callable[[], bool]) -> Starlette:
    async def healthz(request: Request) -> Response:
        if not ready():
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(node_metrics.scrape()), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET", "HEAD"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )
