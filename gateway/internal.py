"""The fleet's internal HTTP API, on its own port (`internal_port`): peers read the blocks this
node owns and tell it of writes. Every request must carry the fleet secret's signature
(gateway/service/fleet.py); anything else is refused with 403 and never reaches the cache."""

from __future__ import annotations

import logging
from contextlib import aclosing
from datetime import UTC, datetime
from urllib.parse import parse_qs

from gateway import errors
from gateway.s3.http import Receive, Scope, Send
from gateway.service.fleet import AUTH_HEADER, ERROR_HEADER, PREFIX, Fleet, canonical
from gateway.service.gateway import Gateway
from gateway.stores import ObjectInfo, VersionChanged

log = logging.getLogger("gateway.internal")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class InternalApp:
    def __init__(self, gateway: Gateway, fleet: Fleet) -> None:
        self._gateway = gateway
        self._fleet = fleet

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        query = scope["query_string"].decode("latin-1")
        method: str = scope["method"]
        auth = None
        for name, value in scope["headers"]:
            if name == AUTH_HEADER.encode():
                auth = value.decode("latin-1")
        if not self._fleet.authorized(method, canonical(path, query), auth):
            log.warning("internal request refused: bad or missing fleet signature")
            await _answer(send, 403, b"fleet signature missing or wrong\n")
            return
        params = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
        try:
            if path == PREFIX + "block" and method == "GET":
                await self._block(params, send)
            elif path == PREFIX + "invalidate" and method == "POST":
                self._gateway.forget(int(params["m"]), params["k"])
                await _answer(send, 204, b"")
            else:
                await _answer(send, 404, b"no such internal route\n")
        except (KeyError, ValueError) as exc:
            await _answer(send, 400, f"bad internal request: {exc!r}\n".encode())

    async def _block(self, q: dict[str, str], send: Send) -> None:
        info = ObjectInfo(key=q["k"], size=int(q["s"]), etag=q["e"], last_modified=_EPOCH)
        start, end = int(q["a"]), int(q["z"])
        try:
            body = await self._gateway.serve_block(
                int(q["m"]), info, int(q["b"]), int(q["i"]), start, end, q.get("p") == "1"
            )
        except VersionChanged:
            await _answer(send, 409, b"", [(ERROR_HEADER.encode(), b"VersionChanged")])
            return
        except errors.S3Error as exc:
            await _answer(send, exc.status, b"", [(ERROR_HEADER.encode(), exc.code.encode())])
            return
        if isinstance(body, bytes):
            await _answer(send, 200, body)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(end - start).encode())],
            }
        )
        async with aclosing(body) as chunks:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _answer(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-length", str(len(body)).encode()), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})
