"""The GCS store against fake-gcs-server (behind a proxy that counts and can fail requests), with
the contract the file and S3 stores keep, plus what only GCS has: generations, compose, tokens."""

from __future__ import annotations

import base64
import gzip
import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs

import anyio
import pytest

from gateway.stores import (
    ObjectInfo,
    ObjectNotFound,
    StoreAccessDenied,
    StoreUnavailable,
    UnsupportedKey,
    VersionChanged,
    WriteAttrs,
    open_store,
)
from gateway.stores.gcs import CHUNK_SIZE, GcsStore
from gateway.stores.gcs import writes as gcs_write
from tests.support.gcs_server import (
    FaultProxy,
    FlakyResumableGcs,
    GcsOrigin,
    GcsServer,
    TokenServer,
)
from tests.support.net import eventually_async, free_port
from tests.support.stores import (
    MOUNT_PREFIX,
    FakeClock,
    Stalls,
    every_call_is_unavailable,
    list_all,
    put_large,
    read_all,
)
from tests.support.writes import ATTRS, MIB, body, md5_etag, put, upload

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def proxy(gcs: GcsServer) -> Iterator[FaultProxy]:
    """Counts and can fail what the store sends (overrides the S3 one of conftest)."""
    p = FaultProxy(gcs.url)
    yield p
    p.stop()


@pytest.fixture
async def origin(gcs: GcsServer, proxy: FaultProxy) -> AsyncIterator[GcsOrigin]:
    """The GCS store, on the session's fake-gcs-server through the fault proxy."""
    o = GcsOrigin(gcs, proxy)
    proxy.reset()
    proxy.fail_next(0)
    yield o
    await o.store.close()
    o.close()


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def same_attrs(info: ObjectInfo, attrs: WriteAttrs) -> None:
    assert WriteAttrs.of(info) == replace(attrs, checksums=info.checksums)


def calls(proxy: FaultProxy) -> list[tuple[str, list[str]]]:
    return [(r.method, sorted(parse_qs(r.query, True))) for r in proxy.requests]


# -- reads -------------------------------------------------------------------------------------


async def test_stat_maps_resource_fields_md5_and_crc32c(origin: GcsOrigin) -> None:
    data = b'{"a": 1}'
    origin.put(
        "docs/readme.json",
        data,
        content_type="application/json",
        contentEncoding="identity",
        contentDisposition='attachment; filename="m.json"',
        contentLanguage="de",
        cacheControl="max-age=60",
        metadata={"owner": "team-a"},
    )
    info = await origin.store.stat("docs/readme.json")
    assert (info.key, info.size, info.etag) == ("docs/readme.json", len(data), md5_etag(data))
    assert info.last_modified.utcoffset() is not None
    assert info.last_modified.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert (info.content_type, info.content_encoding) == ("application/json", "identity")
    assert (info.content_disposition, info.content_language) == (
        'attachment; filename="m.json"',
        "de",
    )
    assert (info.cache_control, dict(info.metadata)) == ("max-age=60", {"owner": "team-a"})
    assert info.checksums == {"crc32c": origin.resource("docs/readme.json")["crc32c"]}


async def test_a_ranged_read_is_one_media_get_with_that_range(origin: GcsOrigin) -> None:
    origin.put("dir/obj", os.urandom(5000))
    proxy_requests = _proxy(origin)
    proxy_requests.reset()
    await read_all(origin.store, "dir/obj", 1000, 2000)
    await read_all(origin.store, "dir/obj")
    await read_all(origin.store, "dir/obj", 4000)
    path = f"/storage/v1/b/{origin.bucket}/o/pre%2Ffix%2Fdir%2Fobj"
    assert [(r.method, r.path, r.query, r.range) for r in proxy_requests.requests] == [
        ("GET", path, "alt=media", "bytes=1000-1999"),
        ("GET", path, "alt=media", None),
        ("GET", path, "alt=media", "bytes=4000-"),
    ]


def _proxy(o: GcsOrigin) -> FaultProxy:
    assert o.proxy is not None
    return o.proxy


async def test_reads_arrive_in_bounded_chunks(origin: GcsOrigin) -> None:
    data = os.urandom(3 * MIB + 1)
    origin.put("big.bin", data)
    async with aclosing(origin.store.read("big.bin")) as stream:
        chunks = [c async for c in stream]
    assert b"".join(chunks) == data and max(len(c) for c in chunks) <= CHUNK_SIZE


async def test_gzip_objects_are_read_as_stored(origin: GcsOrigin) -> None:
    packed = gzip.compress(b"hello " * 1000)
    origin.put("text.gz", packed, content_type="text/plain", contentEncoding="gzip")
    assert await read_all(origin.store, "text.gz") == packed
    assert await read_all(origin.store, "text.gz", 2, 12) == packed[2:12]


async def test_if_match_reads_pin_the_generation(origin: GcsOrigin) -> None:
    origin.put("obj", b"version one")
    old = (await origin.store.stat("obj")).etag
    generation = origin.resource("obj")["generation"]
    proxy = _proxy(origin)
    proxy.reset()
    assert await read_all(origin.store, "obj", 0, 7, if_match=old) == b"version"
    media = [r for r in proxy.requests if "alt=media" in r.query]
    assert [parse_qs(r.query)["generation"] for r in media] == [[generation]]
    assert parse_qs(media[0].query)["ifGenerationMatch"] == [generation]
    with pytest.raises(VersionChanged):
        await read_all(origin.store, "obj", if_match='"0123-45"')
    origin.put("obj", b"version two, longer")
    with pytest.raises(VersionChanged):
        await read_all(origin.store, "obj", 0, 4, if_match=old)


async def test_listing_asks_gcs_for_the_mount_prefix(origin: GcsOrigin) -> None:
    origin.put("k", b"x")
    proxy = _proxy(origin)
    proxy.reset()
    page = await origin.store.list_page("k", "/", start_after="a")
    assert [o.key for o in page.objects] == ["k"] and page.next_token is None
    (request,) = proxy.requests
    query = parse_qs(request.query)
    assert (query["prefix"], query["delimiter"], query["startOffset"]) == (
        ["pre/fix/k"],
        ["/"],
        ["pre/fix/a"],
    )


async def test_missing_bucket_is_unavailable(gcs: GcsServer) -> None:
    store = open_store("gs://no-such-bucket-here/x", {"endpoint": gcs.url})
    try:
        await every_call_is_unavailable(store)
    finally:
        await store.close()


# -- put: what test_store_writes does not show -------------------------------------------------


async def test_a_put_reports_the_crc32c_gcs_took(origin: GcsOrigin) -> None:
    data = os.urandom(MIB + 17)
    sha = b64(hashlib.sha256(data).digest())
    attrs = replace(ATTRS, checksums={"sha256": sha})
    written = await put(origin, "docs/a b/ü.json", data, attrs)
    info = await origin.store.stat("docs/a b/ü.json")
    same_attrs(info, attrs)
    crc = origin.resource("docs/a b/ü.json")["crc32c"]
    assert info.checksums == written.checksums == {"sha256": sha, "crc32c": crc}


async def test_small_put_is_one_multipart_upload(origin: GcsOrigin) -> None:
    await put(origin, "small", os.urandom(3 * MIB))
    assert calls(_proxy(origin)) == [("POST", ["uploadType"])]


async def test_metadata_keys_cannot_forge_internal_ones(origin: GcsOrigin) -> None:
    meta = {"s3gw-etag": '"forged"', "s3gw-checksum-sha256": "forged"}
    written = await put(origin, "k", b"data", WriteAttrs(metadata=meta))
    info = await origin.store.stat("k")
    assert (written.etag, info.etag, dict(info.metadata)) == (md5_etag(b"data"),) * 2 + (meta,)
    assert "sha256" not in info.checksums


async def test_conditional_puts_map_to_generations(origin: GcsOrigin) -> None:
    first = await put(origin, "obj", b"one", if_none_match=True)
    proxy = _proxy(origin)
    proxy.reset()
    generation = origin.resource("obj")["generation"]
    await put(origin, "obj", b"two", if_match=first.etag)
    (upload,) = [r for r in proxy.requests if r.method == "POST"]
    assert parse_qs(upload.query)["ifGenerationMatch"] == [generation]
    assert await read_all(origin.store, "obj") == b"two"


async def test_a_cancelled_put_leaves_nothing(origin: GcsOrigin) -> None:
    await put(origin, "k", b"old")
    stalls = Stalls()
    first = b"n" * (9 * MIB)  # a first resumable chunk goes out
    async with anyio.create_task_group() as tg:
        tg.start_soon(origin.store.put, "k", stalls.body(first), 20 * MIB, ATTRS)
        tg.start_soon(origin.store.put, "new", stalls.body(first), 20 * MIB, ATTRS)
        await eventually_async(lambda: stalls.sent == 2)  # both have sent a first chunk
        assert (await list_all(origin.store))[0] == ["k"]
        tg.cancel_scope.cancel()
    assert origin.raw_keys() == ["k"] and await read_all(origin.store, "k") == b"old"


async def test_a_100_mib_put_streams_in_bounded_memory(origin: GcsOrigin) -> None:
    size = 100 * MIB
    await put(origin, "warm-up", os.urandom(9 * MIB))  # sessions and code paths are warm
    proxy = _proxy(origin)
    proxy.reset()
    rss_before = _rss()
    sent = await put_large(origin.store, "huge.bin", size)
    grown = _rss() - rss_before
    # One 8 MiB chunk is gathered while none is in flight: far below the body.
    assert sent.peak < 24 * MIB, f"{sent.peak_text()} for 100 MiB"
    assert grown < 48 * MIB, f"RSS grew {grown / MIB:.1f} MiB"
    assert sent.info.etag == sent.etag  # a put's ETag is its MD5, whatever its size
    chunk = ("PUT", ["name", "uploadType", "upload_id"])
    assert calls(proxy) == [("POST", ["name", "uploadType"])] + [chunk] * 13  # 8 MiB chunks
    assert (await origin.store.stat("huge.bin")).size == size
    assert await read_all(origin.store, "huge.bin", size - 4) == sent.last_four


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# -- multipart ---------------------------------------------------------------------------------


def uploads(o: GcsOrigin) -> list[str]:
    return sorted({k.split("/")[1] for k in o.raw_keys() if k.startswith(".s3gw-uploads/")})


async def test_parts_are_hidden_objects_no_key_can_reach(origin: GcsOrigin) -> None:
    upload_id = await origin.store.create_multipart("mp", ATTRS)
    part = await upload(origin, "mp", upload_id, 1, b"part")
    assert uploads(origin) == [upload_id]
    with pytest.raises(ObjectNotFound):
        await origin.store.stat(f".s3gw-uploads/{upload_id}/00001")
    with pytest.raises(UnsupportedKey):
        await put(origin, f".s3gw-uploads/{upload_id}/00001", b"forged part")
    await origin.store.complete_multipart("mp", upload_id, [part], ATTRS)
    assert origin.raw_keys() == ["mp"]  # parts and marker deleted


async def test_more_than_32_parts_compose_in_a_tree(
    origin: GcsOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = [os.urandom(1000) for _ in range(70)]
    upload_id = await origin.store.create_multipart("many", WriteAttrs())
    infos = [await upload(origin, "many", upload_id, n, d) for n, d in enumerate(parts, 1)]
    proxy = _proxy(origin)
    proxy.reset()
    done = await origin.store.complete_multipart("many", upload_id, infos, WriteAttrs())
    assert done.etag.endswith('-70"')
    composes = [r for r in proxy.requests if r.path.endswith("/compose")]
    assert len(composes) == 4  # 32 + 32 + 6 into three, then one
    assert await read_all(origin.store, "many") == b"".join(parts)
    assert origin.raw_keys() == ["many"]


# -- faults: retries, a dead emulator, credentials ---------------------------------------------


async def test_server_errors_are_retried_then_unavailable(origin: GcsOrigin) -> None:
    origin.put("k", b"data")
    proxy = _proxy(origin)
    proxy.reset()
    proxy.fail_next(2)
    assert (await origin.store.stat("k")).size == 4
    assert proxy.count("GET") == 3  # two 503s, then the answer
    proxy.reset()
    proxy.fail_next(2, status=429)
    assert await read_all(origin.store, "k", 1, 3) == b"at"
    assert proxy.count("GET") == 3
    store = open_store(f"gs://{origin.bucket}/x", {"endpoint": proxy.url, "max_attempts": "2"})
    try:
        proxy.reset()
        proxy.fail_next(5)
        with pytest.raises(StoreUnavailable):
            await store.stat("k")
        assert proxy.count("GET") == 2
    finally:
        proxy.fail_next(0)
        await store.close()


async def test_a_failed_chunk_is_resumed_from_what_the_session_holds() -> None:
    flaky = FlakyResumableGcs(fail_chunk=1, keep=256 << 10)
    store = open_store("gs://bucket/p", {"endpoint": flaky.url})
    data = os.urandom(20 * MIB)
    try:
        written = await store.put("k", body(data, MIB), len(data), WriteAttrs())
    finally:
        await store.close()
        flaky.stop()
    assert bytes(flaky.data) == data and written.etag == md5_etag(data)
    resumed = 8 * MIB + (256 << 10)
    assert flaky.ranges == [
        f"bytes 0-{8 * MIB - 1}/{20 * MIB}",
        f"bytes {8 * MIB}-{16 * MIB - 1}/{20 * MIB}",  # answered 503, a quarter MiB kept
        f"bytes */{20 * MIB}",
        f"bytes {resumed}-{16 * MIB - 1}/{20 * MIB}",  # only the rest is sent again
        f"bytes {16 * MIB}-{20 * MIB - 1}/{20 * MIB}",
    ]


async def test_refusals_are_access_denied(origin: GcsOrigin) -> None:
    proxy = _proxy(origin)
    for status in (401, 403):
        proxy.reset()
        proxy.fail_next(1, status=status)
        with pytest.raises(StoreAccessDenied):
            await origin.store.stat("k")
        assert proxy.count() == 1  # no retry: the same credentials get the same answer


async def test_a_dead_emulator_is_unavailable_within_the_deadline_then_back(
    tmp_path: Path,
) -> None:
    server = GcsServer(tmp_path)
    clock = FakeClock()
    options = {"max_attempts": "100", "retry_deadline": "1.5", "connect_timeout": "1"}
    o = GcsOrigin(server)
    await o.store.close()
    o.store = GcsStore(o.bucket, MOUNT_PREFIX, {"endpoint": server.url, **options}, clock=clock)
    try:
        await put(o, "k", b"before the crash")
        server.stop()
        for call in (
            lambda: o.store.stat("k"),
            lambda: read_all(o.store, "k"),
            lambda: o.store.list_page(),
            lambda: put(o, "k2", b"x"),
        ):
            started, waits = clock.now, len(clock.pauses)
            with pytest.raises(StoreUnavailable):
                await call()
            # Retried, then given up rather than wait past the deadline.
            assert len(clock.pauses) > waits and clock.now - started <= 1.5
        server.restart()
        assert await read_all(o.store, "k") == b"before the crash"
        await put(o, "k2", b"after the restart")
        assert o.raw_keys() == ["k", "k2"]
    finally:
        await o.store.close()
        o.close()
        server.stop()


async def test_an_unreachable_endpoint_is_unavailable() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    store = open_store("gs://bucket/p", {"endpoint": dead, "max_attempts": "2"})
    try:
        with pytest.raises(StoreUnavailable):
            await store.stat("k")
        with pytest.raises(StoreUnavailable):
            await store.list_page()
    finally:
        await store.close()


@pytest.fixture
def tokens() -> Iterator[TokenServer]:
    server = TokenServer()
    yield server
    server.stop()


async def test_service_account_tokens_are_signed_cached_and_sent(
    origin: GcsOrigin, tokens: TokenServer
) -> None:
    origin.put("k", b"x")
    options = {"endpoint": _proxy(origin).url, "credentials_json": tokens.credentials_json()}
    store = open_store(f"gs://{origin.bucket}/{MOUNT_PREFIX}", options)
    proxy = _proxy(origin)
    try:
        proxy.reset()
        for _ in range(3):
            await store.stat("k")
        assert proxy.seen_auth == ["Bearer token-1"] * 3  # one grant for all
        (claims,) = tokens.assertions
        assert (
            claims["iss"] == "gw@test.iam.gserviceaccount.com" and "devstorage" in claims["scope"]
        )
        assert claims["exp"] - claims["iat"] == 3600
        proxy.reset()
        proxy.fail_next(1, status=401)  # the token was revoked: one new grant, then on
        await store.stat("k")
        assert proxy.seen_auth == ["Bearer token-1", "Bearer token-2"]
        tokens.refuse = True
        proxy.fail_next(1, status=401)
        with pytest.raises(StoreAccessDenied):
            await store.stat("k")
    finally:
        await store.close()


async def test_tokens_are_renewed_before_they_expire(
    origin: GcsOrigin, tokens: TokenServer
) -> None:
    tokens.expires_in = 2  # renewed at half its life, here after a second
    clock = FakeClock()
    options = {"endpoint": _proxy(origin).url, "credentials_json": tokens.credentials_json()}
    store = GcsStore(origin.bucket, MOUNT_PREFIX, options, clock=clock)
    try:
        await store.list_page()
        await store.list_page()
        assert len(tokens.assertions) == 1
        clock.now += 0.9
        await store.list_page()
        assert len(tokens.assertions) == 1  # half its life is not over: the same token
        clock.now += 0.2
        await store.list_page()
        assert len(tokens.assertions) == 2  # renewed at half its life, before it expires
        assert _proxy(origin).seen_auth[-1] == "Bearer token-2"
    finally:
        await store.close()


async def test_credentials_from_a_file_and_a_given_token(
    origin: GcsOrigin, tokens: TokenServer, tmp_path: Path
) -> None:
    key_file = tmp_path / "key.json"
    key_file.write_text(tokens.credentials_json())
    proxy = _proxy(origin)
    for options, header in (
        ({"credentials_file": str(key_file)}, "Bearer token-1"),
        ({"access_token": "ya29.given"}, "Bearer ya29.given"),
        ({}, None),
    ):
        store = open_store(f"gs://{origin.bucket}", {"endpoint": proxy.url, **options})
        proxy.reset()
        try:
            await store.list_page()
        finally:
            await store.close()
        assert proxy.seen_auth == [header]
    store = open_store(f"gs://{origin.bucket}", {"credentials_file": str(tmp_path / "none.json")})
    with pytest.raises(StoreAccessDenied):
        await store.stat("k")
    await store.close()


# -- open_gcs ----------------------------------------------------------------------------------


def test_open_store_parses_gs_uris() -> None:
    store = open_store("gs://bkt/pre/fix/", {"endpoint": "http://127.0.0.1:1/"})
    assert isinstance(store, GcsStore)
    assert (store.bucket, store.prefix, store.endpoint) == ("bkt", "pre/fix/", "http://127.0.0.1:1")
    assert open_store("gs://bkt", {}).endpoint == "https://storage.googleapis.com"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "uri, options",
    [
        ("gs://", {}),
        ("gs:///prefix", {}),
        ("gs://bkt:1/x", {}),
        ("gs://bkt", {"endpoint_url": "http://x"}),
        ("gs://bkt", {"access_token": "a", "credentials_json": "{}"}),
        ("gs://bkt", {"credentials_json": '{"type": "authorized_user"}'}),
        ("gs://bkt", {"max_attempts": "many"}),
        ("gs://bkt", {"retry_deadline": "0"}),
        ("gs://bkt", {"endpoint": "ftp://127.0.0.1"}),
    ],
)
def test_open_store_rejects_bad_uris_and_options(uri: str, options: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        open_store(uri, options)


def test_chunk_sizes_suit_gcs() -> None:
    assert gcs_write.CHUNK % (256 * 1024) == 0  # GCS takes resumable chunks in 256 KiB units
    assert gcs_write.SIMPLE_LIMIT <= gcs_write.CHUNK  # a resumable upload has 2 chunks or more
