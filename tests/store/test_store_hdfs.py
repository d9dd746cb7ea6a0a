"""The hdfs:// store against the WebHDFS test server (tests/support/webhdfs_server.py): the
behaviours the store contract checks for file:// and s3://, and what reaches the NameNode and
the DataNode on the wire (redirects, offset/length, two-step CREATE, RENAME, CONCAT)."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gateway.stores import (
    ObjectNotFound,
    StoreAccessDenied,
    StoreUnavailable,
    UnsupportedKey,
    VersionChanged,
    WriteAttrs,
    open_store,
)
from gateway.stores.hdfs import CHUNK_SIZE, HdfsStore, open_hdfs
from tests.support.stores import (
    MOUNT_PREFIX,
    FakeClock,
    every_call_is_unavailable,
    put_large,
    range_cases,
    read_all,
    utf8,
)
from tests.support.webhdfs_server import HdfsOrigin, WebHdfsServer
from tests.support.writes import ATTRS, MIB, body, md5_etag, put, same_attrs, upload

pytestmark = pytest.mark.anyio

MOUNT = f"/{MOUNT_PREFIX}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[WebHdfsServer]:
    # Two entries per LISTSTATUS_BATCH answer: every listing pages through startAfter.
    s = WebHdfsServer(tmp_path / "hdfs", batch_size=2)
    yield s
    s.stop()


@pytest.fixture
async def origin(server: WebHdfsServer) -> AsyncIterator[HdfsOrigin]:
    o = HdfsOrigin(server)
    yield o
    await o.store.close()


def raw_keys(o: HdfsOrigin) -> list[str]:
    """Every file under the mount folder, the store's temp files included, uploads not."""
    found = (str(p.relative_to(o.base)) for p in o.base.rglob("*") if p.is_file())
    return sorted(k for k in found if not k.startswith(".s3gw-uploads/"))


def open_uploads(o: HdfsOrigin) -> list[str]:
    uploads = o.base / ".s3gw-uploads"
    return sorted(p.name for p in uploads.iterdir()) if uploads.exists() else []


# -- reads -------------------------------------------------------------------------------------


async def test_stat_reports_size_etag_mtime_and_a_guessed_type(origin: HdfsOrigin) -> None:
    origin.put("docs/readme.txt", b"hello world")
    info = await origin.store.stat("docs/readme.txt")
    assert (info.key, info.size, info.content_type) == ("docs/readme.txt", 11, "text/plain")
    # HDFS has no cheap MD5: a synthetic ETag that no client takes for one.
    assert info.etag.startswith('"') and info.etag.count("-") == 2 and len(info.etag) != 34
    assert info.last_modified.utcoffset() is not None
    assert abs(info.last_modified.timestamp() - time.time()) < 60


async def test_missing_keys_and_directories_are_not_objects(origin: HdfsOrigin) -> None:
    origin.put("dir/inner", b"x")
    for key in ("not-there", "dir", "dir/", "", "dir/inner/deeper", "a:b", ".s3gw-tmp"):
        with pytest.raises(ObjectNotFound):
            await origin.store.stat(key)
        with pytest.raises(ObjectNotFound):
            await read_all(origin.store, key)


async def test_ranges_are_one_open_redirected_to_the_datanode(
    origin: HdfsOrigin, server: WebHdfsServer
) -> None:
    data = os.urandom(3 * MIB + 123)
    n = len(data)
    origin.put("big.bin", data)
    for start, end in range_cases(n):
        assert await read_all(origin.store, "big.bin", start, end) == data[start:end], (start, end)
    path = f"{MOUNT}/big.bin"
    for start, end, query in [(1000, 2000, {"offset": "1000", "length": "1000"}),
                              (0, None, {}), (4000, None, {"offset": "4000"})]:  # fmt: skip
        server.reset()
        await read_all(origin.store, "big.bin", start, end)
        assert server.requests == [
            (server.port, "GET", "OPEN", path),
            (server.datanode_port, "GET", "OPEN", path),
        ]
        for params in server.queries:
            assert {k: params[k] for k in ("offset", "length") if k in params} == query
        assert server.queries[1]["user.name"] == "tester"


async def test_reads_arrive_in_bounded_chunks_and_early_stops_release(origin: HdfsOrigin) -> None:
    data = os.urandom(3 * MIB + 1)
    origin.put("big.bin", data)
    async with aclosing(origin.store.read("big.bin")) as stream:
        chunks = [c async for c in stream]
    assert b"".join(chunks) == data and max(map(len, chunks)) <= CHUNK_SIZE
    for _ in range(5):
        async with aclosing(origin.store.read("big.bin")) as stream:
            async for _chunk in stream:
                break
    assert await read_all(origin.store, "big.bin", 10, 20) == data[10:20]


async def test_if_match_read_sees_a_file_replaced_between_stat_and_open(
    origin: HdfsOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin.put("obj", b"version one")
    etag = (await origin.store.stat("obj")).etag
    real_open = HdfsStore._open

    async def replaced_first(self: HdfsStore, key: str, start: int, end: int | None) -> Any:
        (origin.base / "new").write_bytes(b"version two")
        os.replace(origin.base / "new", origin.base / "obj")  # a new file, as a rename makes
        return await real_open(self, key, start, end)

    monkeypatch.setattr(HdfsStore, "_open", replaced_first)
    with pytest.raises(VersionChanged):
        await read_all(origin.store, "obj", if_match=etag)


async def test_listing_pages_batches_and_sorts_what_hdfs_sorts_signed(
    origin: HdfsOrigin, server: WebHdfsServer
) -> None:
    names = ["z", "é", "a", "ü-x", "b", "ä", "zz"]
    for name in names:
        origin.put(f"d/{name}", b"x")
    server.reset()
    page = await origin.store.list_page("d/")
    batches = [q for (_, _, op, path), q in zip(server.requests, server.queries, strict=True)
               if op == "LISTSTATUS_BATCH" and path == f"{MOUNT}/d"]  # fmt: skip
    # 7 entries, 2 a batch, in HDFS's signed-byte order: ä é | ü-x a | b z | zz
    assert [q.get("startafter") for q in batches] == [None, "é", "a", "z"]
    assert [o.key for o in page.objects] == sorted((f"d/{n}" for n in names), key=utf8)


async def test_missing_mount_folder_is_unavailable(server: WebHdfsServer) -> None:
    store = open_store(f"{server.url}/no/such/folder", {})
    try:
        await every_call_is_unavailable(store, writes=True)
        assert not (server.root / "no").exists()
    finally:
        await store.close()


# -- put: what test_store_writes does not show -------------------------------------------------


async def test_a_put_keeps_its_md5_and_attributes_in_an_xattr(origin: HdfsOrigin) -> None:
    data = os.urandom(MIB + 17)
    written = await put(origin, "docs/a b/ü.json", data)
    assert written.etag == md5_etag(data)
    same_attrs(await origin.store.stat("docs/a b/ü.json"), ATTRS)
    assert b'"etag"' in os.getxattr(origin.base / "docs" / "a b" / "ü.json", "user.s3gw.meta")


async def test_put_creates_in_two_steps_then_renames_into_place(
    origin: HdfsOrigin, server: WebHdfsServer
) -> None:
    server.reset()
    await put(origin, "k", b"data")
    ops = [(port == server.datanode_port, method, op) for port, method, op, _ in server.requests]
    creates = [r for r in server.requests if r[2] == "CREATE"]
    assert ops[-3:] == [
        (False, "PUT", "SETXATTR"),
        (False, "PUT", "MKDIRS"),
        (False, "PUT", "RENAME"),
    ]
    assert [(r[0], r[3]) for r in creates] == [
        (server.port, creates[0][3]),
        (server.datanode_port, creates[0][3]),
    ]
    assert creates[0][3].startswith(f"{MOUNT}/.s3gw-tmp/.s3gw-")
    rename = server.queries[-1]
    assert (rename["destination"], rename["renameoptions"]) == (f"{MOUNT}/k", "OVERWRITE")
    assert raw_keys(origin) == ["k"]


async def test_put_streams_100_mib_in_bounded_memory(origin: HdfsOrigin) -> None:
    size = 100 * MIB
    await put(origin, "warm-up", b"x")
    sent = await put_large(origin.store, "huge.bin", size)
    # Measured: ~5 MiB above the start, test server included (it runs in this process).
    assert sent.peak < 16 * MIB, f"{sent.peak_text()} for a 100 MiB put"
    assert sent.info.etag == sent.etag
    assert (origin.base / "huge.bin").stat().st_size == size


# -- keys HDFS cannot hold, delete, copy -------------------------------------------------------


async def test_keys_hdfs_cannot_hold_are_refused(origin: HdfsOrigin) -> None:
    await put(origin, "a/b", b"x")
    for key in ("a", "a/b/c", "dir/", "a//b", "../escape", "x:y", ".s3gw-uploads/x", ""):
        with pytest.raises(UnsupportedKey):
            await put(origin, key, b"y")
    with pytest.raises(UnsupportedKey):
        await origin.store.create_multipart("a", ATTRS)
    for key in ("a", "x:y"):  # a folder or a key HDFS cannot hold is no object to delete
        await origin.store.delete(key)
    assert raw_keys(origin) == ["a/b"]


async def test_a_copy_of_a_foreign_file_takes_its_md5(origin: HdfsOrigin) -> None:
    data = os.urandom(100_000)
    origin.put("foreign", data)  # not written by the gateway: no recorded ETag
    assert (await origin.store.copy("foreign", "copied", None)).etag == md5_etag(data)
    await origin.store.copy("copied", "copied", WriteAttrs(content_type="text/plain"))
    assert (await origin.store.stat("copied")).content_type == "text/plain"
    assert await read_all(origin.store, "copied") == data


# -- multipart ---------------------------------------------------------------------------------


async def test_multipart_is_joined_in_place_by_the_namenode(
    origin: HdfsOrigin, server: WebHdfsServer
) -> None:
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), b"!"]
    upload_id = await origin.store.create_multipart("mp", ATTRS)
    infos = [await upload(origin, "mp", upload_id, n, d) for n, d in enumerate(parts, 1)]
    server.reset()
    await origin.store.complete_multipart("mp", upload_id, infos, ATTRS)
    during = list(zip(server.requests, server.queries, strict=True))
    # No byte of the parts passes through the gateway.
    assert all(port == server.port for (port, *_), _ in during)
    (concat,) = [query for (_, _, op, _), query in during if op == "CONCAT"]
    assert len(concat["sources"].split(",")) == 2
    assert await read_all(origin.store, "mp") == b"".join(parts)
    assert raw_keys(origin) == ["mp"] and open_uploads(origin) == []


async def test_multipart_skips_empty_parts_hdfs_cannot_concat(origin: HdfsOrigin) -> None:
    upload_id = await origin.store.create_multipart("mp", ATTRS)
    infos = [await upload(origin, "mp", upload_id, n, d) for n, d in enumerate([b"ab", b""], 1)]
    await origin.store.complete_multipart("mp", upload_id, infos, ATTRS)
    assert await read_all(origin.store, "mp") == b"ab"
    upload_id = await origin.store.create_multipart("none", ATTRS)
    part = await upload(origin, "none", upload_id, 1, b"")
    await origin.store.complete_multipart("none", upload_id, [part], ATTRS)
    assert (await origin.store.stat("none")).size == 0


# -- buckets, options, auth, errors ------------------------------------------------------------


def test_uris_and_options() -> None:
    store = open_hdfs(urlsplit("webhdfs://nn.example/data/"), {"https": "true"})
    assert isinstance(store, HdfsStore) and repr(store) == "HdfsStore(https://nn.example:9871/data)"
    assert repr(open_store("hdfs://nn:50070", {})) == "HdfsStore(http://nn:50070/)"
    for options in ({"endpoint": "x"}, {"https": "yes"}, {"max_attempts": "many"}):
        with pytest.raises(ValueError):
            open_store("hdfs://nn:9870/x", options)
    for uri in ("hdfs:///path", "hdfs://nn:port/x", "hdfs://nn/a/../b"):
        with pytest.raises(ValueError):
            open_store(uri, {})


async def test_user_name_or_delegation_token_go_with_every_request(tmp_path: Path) -> None:
    server = WebHdfsServer(tmp_path / "hdfs", tokens={"tok-123": "alice"})
    try:
        for options, expected in (({"user": "bob"}, {"user.name": "bob"}),
                                  ({"delegation_token": "tok-123", "user": "bob"},
                                   {"delegation": "tok-123"})):  # fmt: skip
            o = HdfsOrigin(server, options)
            server.reset()
            await put(o, "k", b"data")
            assert await read_all(o.store, "k") == b"data"
            assert {r[0] for r in server.requests} == {server.port, server.datanode_port}
            for query in server.queries:
                assert {k: v for k, v in query.items() if k in ("user.name", "delegation")} == (
                    expected
                )
            await o.store.close()
    finally:
        server.stop()


async def test_remote_exceptions_map_to_typed_errors(tmp_path: Path) -> None:
    server = WebHdfsServer(tmp_path / "hdfs", readers={"alice"}, writers={"alice"},
                           tokens={"good": "alice"})  # fmt: skip
    alice = HdfsOrigin(server, {"user": "alice"})
    try:
        await put(alice, "k", b"data")
        for options in ({"user": "bob"}, {"delegation_token": "forged"}):
            bob = HdfsOrigin(server, options).store
            with pytest.raises(StoreAccessDenied):  # AccessControlException, InvalidToken
                await bob.stat("k")
            with pytest.raises(StoreAccessDenied):
                await bob.list_page()
            await bob.close()
        server.readers = None
        bob = HdfsOrigin(server, {"user": "bob"}).store
        with pytest.raises(StoreAccessDenied):  # from the DataNode, after the redirect
            await bob.put("k2", body(b"x" * 1000), 1000, WriteAttrs())
        await bob.close()
        assert raw_keys(alice) == ["k"]
        server.secure = True  # Kerberos on: 401 without a token
        with pytest.raises(StoreAccessDenied):
            await alice.store.stat("k")
        server.secure = False
        # Only for the stat: the failed put's cleanup may still be retrying in the background.
        server.fail_next(1, 400, "IllegalArgumentException", op="GETFILESTATUS")
        with pytest.raises(Exception) as err:
            await alice.store.stat("k")
        assert not isinstance(err.value, (ObjectNotFound, StoreUnavailable))
    finally:
        await alice.store.close()
        server.stop()


async def test_without_xattrs_etags_stay_synthetic(tmp_path: Path) -> None:
    server = WebHdfsServer(tmp_path / "hdfs", xattrs=False)
    o = HdfsOrigin(server)
    try:
        written = await put(o, "plain.txt", b"no xattrs here", ATTRS)
        info = await o.store.stat("plain.txt")
        assert written.etag == info.etag and info.etag.count("-") == 2
        assert (info.content_type, dict(info.metadata)) == ("text/plain", {})
        upload_id = await o.store.create_multipart("mp", ATTRS)
        one = await upload(o, "mp", upload_id, 1, b"a" * MIB)
        await o.store.complete_multipart("mp", upload_id, [one], ATTRS)
        assert await read_all(o.store, "mp") == b"a" * MIB
    finally:
        await o.store.close()
        server.stop()


# -- faults ------------------------------------------------------------------------------------


async def test_server_errors_are_retried(origin: HdfsOrigin, server: WebHdfsServer) -> None:
    origin.put("k", b"data")
    server.reset()
    server.fail_next(2)  # 503, e.g. from a gateway in front of the NameNode
    assert await read_all(origin.store, "k") == b"data"
    assert server.ops() == ["OPEN"] * 4  # twice refused, then NameNode and DataNode
    server.fail_next(1, 403, "RetriableException")  # a NameNode still in safe mode
    await put(origin, "new", b"x")
    server.fail_next(2)  # not idempotent, but a 503 was never carried out
    await origin.store.copy("new", "copy", None)
    assert await read_all(origin.store, "copy") == b"x"


def _on_clock(o: HdfsOrigin, clock: FakeClock, **options: str) -> HdfsOrigin:
    """`o` with its store opened again, its retries timed by `clock`."""
    uri = urlsplit(f"{o.server.url}/{MOUNT_PREFIX}")
    o.store = open_hdfs(uri, {"user": "tester", **options}, clock=clock)
    return o


async def test_a_failing_server_is_unavailable_at_the_deadline(server: WebHdfsServer) -> None:
    clock = FakeClock()
    o = _on_clock(HdfsOrigin(server), clock, retry_deadline="1.5", max_attempts="100")
    o.put("k", b"data")
    try:
        server.reset()
        server.fail_next(10_000)
        with pytest.raises(StoreUnavailable):
            await o.store.stat("k")
        # Backed off and retried until the deadline, the last wait cut to end there (stat's
        # two calls retry side by side: the fake clock adds up their waits).
        assert clock.now == pytest.approx(1.5)
        assert len(clock.pauses) > 3 and len(server.requests) > len(clock.pauses)
        caps = [min(2.0, 0.1 * 2**i) for i in range(len(clock.pauses))]
        assert all(p <= cap for p, cap in zip(clock.pauses, caps, strict=True))  # full jitter
    finally:
        await o.store.close()


async def test_stopped_server_is_unavailable_then_restart_works(server: WebHdfsServer) -> None:
    clock = FakeClock()
    o = _on_clock(HdfsOrigin(server), clock, retry_deadline="1", max_attempts="100")
    try:
        await put(o, "k", b"before")
        server.stop()
        for attempt in (lambda: o.store.stat("k"), lambda: read_all(o.store, "k"),
                        lambda: put(o, "k", b"during")):  # fmt: skip
            started = clock.now
            with pytest.raises(StoreUnavailable):
                await attempt()
            assert clock.now - started == pytest.approx(1.0)  # refused until the deadline
        server.restart()
        assert await read_all(o.store, "k") == b"before"
        await put(o, "k", b"after")
        assert await read_all(o.store, "k") == b"after"
        assert raw_keys(o) == ["k"]
    finally:
        await o.store.close()
