"""The fleet's internal HTTP API, on its own port (`internal_port`): peers read the blocks this
node owns, ask it to open the objects whose first block it owns, and tell it of writes. Every
request must carry the fleet secret's signature (stamps.py); anything else is refused with 403
and never reaches the cache. What answers is a BlockServer (the node's service), so that the
fleet does not depend on the service."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Protocol
from urllib.parse import parse_qs

from starlette.types import Receive, Scope, Send

from gateway import errors
from gateway.cluster.peers import ERROR_HEADER, PREFIX, Fleet, info_to_wire
from gateway.cluster.stamps import AUTH_HEADER, canonical
from gateway.stores import ObjectInfo, VersionChanged

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class BlockServer(Protocol):
    """What the peer API asks of its node: serve a block it owns, forget a key a peer wrote."""

    async def serve_block(
        self,
        mount_id: int,
        info: ObjectInfo,
        block_size: int,
        index: int,
        start: int,
        end: int,
        pinned: bool,
        sparse: bool = False,
        preload: bool = False,
    ) -> bytes | AsyncGenerator[bytes, None]:
        """Bytes [start, end) of block `index`; errors (S3 or VersionChanged) before any byte.
        `sparse`: the asking reader is not sequential (a small range may fill sub-blocks).
        `preload`: a preload job asks (its reads are counted apart from the clients')."""
        ...

    async def serve_open(
        self, mount_id: int, key: str, block_size: int, pinned: bool
    ) -> tuple[ObjectInfo, bytes | AsyncGenerator[bytes, None]]:
        """The current version of `key` and the bytes of its first block, opened here (one
        store request when the version is not known); errors before any byte."""
        ...

    def forget(self, mount_id: int, key: str) -> None: ...


class PeerApi:
    """The ASGI app on the fleet port: checks each request's signature, then asks `server`."""

    def __init__(self, server: BlockServer, fleet: Fleet, about: bytes = b"{}") -> None:
        self._server = server
        self._fleet = fleet
        self._about = about  # JSON: what clients are told of this node (its S3 URL)

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
            elif path == PREFIX + "open" and method == "GET":
                await self._open(params, send)
            elif path == PREFIX + "about" and method == "GET":
                await _answer(send, 200, self._about)
            elif path == PREFIX + "invalidate" and method == "POST":
                self._server.forget(int(params["m"]), params["k"])
                await _answer(send, 204, b"")
            else:
                await _answer(send, 404, b"no such internal route\n")
        except (KeyError, ValueError) as exc:
            await _answer(send, 400, f"bad internal request: {exc!r}\n".encode())

    async def _block(self, q: dict[str, str], send: Send) -> None:
        info = ObjectInfo(
            key=q["k"], size=int(q["s"]), etag=q["e"], last_modified=_EPOCH, version_id=q.get("v")
        )
        start, end = int(q["a"]), int(q["z"])
        try:
            body = await self._server.serve_block(
                int(q["m"]), info, int(q["b"]), int(q["i"]), start, end, q.get("p") == "1",
                q.get("r") == "1", q.get("j") == "1",
            )  # fmt: skip
        except (VersionChanged, errors.S3Error) as exc:
            await _refuse(send, exc)
            return
        await _stream(send, b"", body, end - start)

    async def _open(self, q: dict[str, str], send: Send) -> None:
        block_size = int(q["b"])
        try:
            info, body = await self._server.serve_open(
                int(q["m"]), q["k"], block_size, q.get("p") == "1"
            )
        except (VersionChanged, errors.S3Error) as exc:
            await _refuse(send, exc)
            return
        wire = info_to_wire(info)
        head = len(wire).to_bytes(4, "big") + wire
        await _stream(send, head, body, min(block_size, info.size))


async def _refuse(send: Send, exc: VersionChanged | errors.S3Error) -> None:
    if isinstance(exc, VersionChanged):
        await _answer(send, 409, b"", [(ERROR_HEADER.encode(), b"VersionChanged")])
    else:
        await _answer(send, exc.status, b"", [(ERROR_HEADER.encode(), exc.code.encode())])


async def _stream(
    send: Send, head: bytes, body: bytes | AsyncGenerator[bytes, None], length: int
) -> None:
    """`head`, then `length` bytes of `body`."""
    if isinstance(body, bytes):
        await _answer(send, 200, head + body)
        return
    async with aclosing(body) as chunks:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(head) + length).encode())],
            }
        )
        if head:
            await send({"type": "http.response.body", "body": head, "more_body": True})
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
