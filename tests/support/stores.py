"""What the tests of every under-store share: where a test puts objects behind the store's back
(an `Origin` per store kind, the store mounted on a prefix with decoys beside it), reading and
listing through the store with each page's promises checked, a large put measured, a clock for
the retries, and a loopback HTTP server for the fakes that stand in for an origin."""

from __future__ import annotations

import hashlib
import http.server
import threading
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio.lowlevel
import boto3
import pytest

from gateway.stores import ObjectInfo, Store, StoreUnavailable, WriteAttrs, open_store
from tests.support.net import free_port
from tests.support.origin import CountingProxy, MotoServer
from tests.support.writes import MIB

MOUNT_PREFIX = "pre/fix"
# Objects next to the mount's prefix that must never show through it.
DECOYS = ["pre/fixture", "pre/fi", "pre/fix", "other/x"]
TREE = [
    "a-c",
    "a/b",
    "a/b c/d",
    "a/b-",
    "a/b.",
    "a/x/y/z.txt",
    "a/x/y2",
    "a0",
    "A",
    "b+plus",
    "café/ü.bin",
    "emoji😀.txt",
    "\uff5efullwidth",
    "space name.txt",
    "z/deep/er/file",
    "zz",
    "中文/文件",
    "q?x",
    "hash#1",
    "pct%20",
    "~tilde",
]


def range_cases(n: int) -> list[tuple[int, int | None]]:
    """(start, end) of the ranges read tests ask of an object of n bytes (a few MiB): edges,
    the whole, past the end, empty."""
    edges = [(0, 10), (1000, 2000), (MIB - 1, 2 * MIB + 1), (n - 10, n), (n - 10, None)]
    return [*edges, (0, None), (5, n + 100), (n, None), (n + 5, n + 10), (7, 7)]


class Stalls:
    """Bodies that send a first chunk, then never another (a client gone quiet mid-upload);
    `sent` counts those whose first chunk has been taken."""

    def __init__(self) -> None:
        self.sent = 0

    async def body(self, first: bytes) -> AsyncIterator[bytes]:
        yield first
        self.sent += 1
        await anyio.sleep_forever()
        yield b""


class FakeClock:
    """A clock for a store's retries that never waits: a sleep moves its time on at once.
    `pauses` are the waits asked for, in order; waits of calls made side by side add up."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        await anyio.lowlevel.checkpoint()


def s3_options(endpoint: str, **extra: str) -> dict[str, str]:
    return {"endpoint_url": endpoint, "access_key": "test", "secret_key": "test", **extra}


class Origin:
    """Where a test puts objects, and the store that must then see them."""

    kind: str
    store: Store
    # The local folder the mount lies in, for the stores that are file systems (file, HDFS):
    # where a test makes what only they have, such as empty directories.
    folder: Path | None = None

    def put(self, key: str, data: bytes, content_type: str | None = None) -> None:
        raise NotImplementedError


class FileOrigin(Origin):
    kind = "file"

    def __init__(self, root: Path) -> None:
        self.root = self.folder = root
        self.store = open_store(root.as_uri(), {})

    def put(self, key: str, data: bytes, content_type: str | None = None) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


class S3Origin(Origin):
    kind = "s3"

    def __init__(self, moto: MotoServer, proxy: CountingProxy) -> None:
        self.bucket = f"b-{uuid.uuid4().hex[:12]}"
        self.s3: Any = boto3.client("s3", region_name="us-east-1", **_boto_args(moto.url))
        self.s3.create_bucket(Bucket=self.bucket)
        for key in DECOYS:
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"decoy")
        self.proxy = proxy
        self.store = open_store(f"s3://{self.bucket}/{MOUNT_PREFIX}", s3_options(proxy.url))

    def put(self, key: str, data: bytes, content_type: str | None = None, **extra: Any) -> None:
        args = {"ContentType": content_type} if content_type else {}
        key = f"{MOUNT_PREFIX}/{key}"
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, **args, **extra)


def _boto_args(url: str) -> dict[str, str]:
    return {"endpoint_url": url, "aws_access_key_id": "test", "aws_secret_access_key": "test"}


async def read_all(store: Store, key: str, *args: Any, **kwargs: Any) -> bytes:
    async with aclosing(store.read(key, *args, **kwargs)) as chunks:  # type: ignore[type-var]
        return b"".join([c async for c in chunks])


def utf8(s: str) -> bytes:
    return s.encode("utf-8")


def oracle(keys: list[str], prefix: str, delimiter: str | None, after: str) -> list[str]:
    """S3's answer, straight from the definition: roll up, dedupe, sort by UTF-8, skip <= after."""
    entries = set()
    for key in keys:
        if key.startswith(prefix):
            at = key.find(delimiter, len(prefix)) if delimiter else -1
            entries.add(key if at < 0 else key[: at + len(delimiter or "")])
    return sorted((e for e in entries if e > after), key=utf8)


async def list_all(
    store: Store,
    prefix: str = "",
    delimiter: str | None = None,
    start_after: str | None = None,
    max_keys: int = 3,
) -> tuple[list[str], int]:
    """Every entry of a listing, page by page, checking each page's own promises."""
    entries: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        page = await store.list_page(prefix, delimiter, token, start_after, max_keys)
        pages += 1
        names = [o.key for o in page.objects] + page.common_prefixes
        assert len(names) <= max_keys
        assert [o.key for o in page.objects] == sorted((o.key for o in page.objects), key=utf8)
        for o in page.objects:
            assert o.etag.startswith('"') and o.etag.endswith('"')
            assert o.last_modified.tzinfo is not None
        entries += sorted(names, key=utf8)
        token = page.next_token
        if token is None:
            return entries, pages
        assert len(names) == max_keys, "a page with a next token is a full page"
        assert pages < 100


async def every_call_is_unavailable(store: Store, writes: bool = False) -> None:
    """A store whose place is missing or unreachable: every call raises StoreUnavailable."""
    with pytest.raises(StoreUnavailable):
        await store.stat("k")
    with pytest.raises(StoreUnavailable):
        await read_all(store, "k")
    with pytest.raises(StoreUnavailable):
        await store.list_page()
    if writes:
        with pytest.raises(StoreUnavailable):
            await store.put("k", _one_byte(), 1, WriteAttrs())


async def _one_byte() -> AsyncIterator[bytes]:
    yield b"x"


@dataclass(frozen=True, slots=True)
class LargePut:
    """What `put_large` sent and measured."""

    info: ObjectInfo  # as the store answered the put
    etag: str  # the MD5 ETag of the bytes sent
    peak: int  # the most memory traced above the start while the store took them
    last_four: bytes  # the object's last four bytes

    def peak_text(self) -> str:
        return f"peak {self.peak / MIB:.1f} MiB traced"


async def put_large(store: Store, key: str, size: int) -> LargePut:
    """Put `size` bytes (whole MiB), each MiB made as it is sent and holding its number over
    and over, tracing the memory the put takes beyond what was there before."""
    md5 = hashlib.md5()

    async def generated() -> AsyncIterator[bytes]:
        for i in range(size // MIB):
            chunk = i.to_bytes(4, "big") * (MIB // 4)
            md5.update(chunk)
            yield chunk

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        info = await store.put(key, generated(), size, WriteAttrs())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    last = (size // MIB - 1).to_bytes(4, "big")
    return LargePut(info, f'"{md5.hexdigest()}"', peak - before, last)


class ServerProcess(Protocol):
    """A test server run as a process of its own at `port`, logging to `log_path`."""

    port: int
    log_path: Path

    def start(self) -> None: ...

    def stop(self) -> None: ...


def start_at_a_free_port(server: ServerProcess, name: str) -> None:
    """Start `server` at a free port, trying three: another process may take the port between
    the probe and the server's bind. RuntimeError if none of them starts."""
    last: Exception | None = None
    for _ in range(3):
        server.port = free_port()
        try:
            server.start()
            return
        except RuntimeError as exc:
            last = exc
            server.stop()
    raise RuntimeError(f"{name} did not start (log: {server.log_path}): {last}")


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """The request handler of a fake origin: keep-alive, as an origin allows; no log lines."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass


class LoopbackServer:
    """An HTTP server on 127.0.0.1, at a port of its own, serving `handler` from a thread."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
