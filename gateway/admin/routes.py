"""Starlette routes for operators: /healthz answers 200 once the node serves."""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ADMIN_PATHS = ("/healthz",)


def admin_app(ready: Callable[[], bool]) -> Starlette:
    async def healthz(request: Request) -> Response:
        if not ready():
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/healthz", healthz, methods=["GET", "HEAD"])])
