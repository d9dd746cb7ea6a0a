"""The Azure Blob store against Azurite: the behaviours test_store_contract and test_store_writes
prove for s3://, checked on a container with decoys beside the mount prefix, with blobs put
and inspected through Microsoft's own SDK; plus what is Azure's own (URL forms, Shared Key and
SAS, block ids, metadata names) and the faults: a killed server, a throttling one."""

from __future__ import annotations

import base64
import hashlib
import os
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import pytest

from gateway.stores import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    IncompleteBody,
    InvalidPart,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    StoreAccessDenied,
    StoreUnavailable,
    UnsupportedKey,
    UploadNotFound,
    VersionChanged,
    WriteAttrs,
    create_bucket,
    delete_bucket,
    open_store,
)
from gateway.stores.azure import CHUNK_SIZE, AzureStore, open_azure
from gateway.stores.azure_auth import string_to_sign
from tests.support.azurite import (
    ACCOUNT,
    AzureOrigin,
    AzuriteServer,
    FlakyFront,
    sdk_client,
    store_options,
)
from tests.support.net import free_port
from tests.support.origin import CountingProxy
from tests.test_store_contract import MOUNT_PREFIX, TREE, list_all, oracle, read_all, utf8

pytestmark = pytest.mark.anyio

MIB = 1 << 20
ATTRS = WriteAttrs(
    content_type="application/json",
    content_encoding="identity",
    content_disposition='attachment; filename="a.json"',
    content_language="de",
    cache_control="max-age=60",
    expires="Wed, 21 Oct 2037 07:28:00 GMT",
    metadata={"owner": "team-a", "build": "42"},
)


class ClientGone(Exception):
    """What a body iterator raises when the client's upload fails (disconnect, bad checksum)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    server = AzuriteServer(tmp_path_factory.mktemp("azurite"))
    yield server
    server.stop()


@pytest.fixture
async def az(azurite: AzuriteServer) -> AsyncIterator[AzureOrigin]:
    o = AzureOrigin(azurite)
    yield o
    await o.store.close()


@pytest.fixture
async def proxied(azurite: AzuriteServer) -> AsyncIterator[tuple[AzureOrigin, CountingProxy]]:
    """An origin whose store goes through a counting proxy: what reached Azurite, on the wire."""
    proxy = CountingProxy(azurite.url.rsplit("/", 1)[0])
    o = AzureOrigin(azurite)
    await o.store.close()
    o.store = open_store(
        f"az://{ACCOUNT}/{o.container}/{MOUNT_PREFIX}",
        store_options(azurite, endpoint=f"{proxy.url}/{ACCOUNT}"),
    )
    yield o, proxy
    await o.store.close()
    proxy.stop()


async def body(data: bytes, step: int = 256 * 1024) -> AsyncIterator[bytes]:
    for at in range(0, len(data), step):
        yield data[at : at + step]


async def failing(data: bytes, fail_at: int, step: int = 256 * 1024) -> AsyncIterator[bytes]:
    async for chunk in body(data[:fail_at], step):
        yield chunk
    raise ClientGone("the client went away")


async def put(
    o: AzureOrigin, key: str, data: bytes, attrs: WriteAttrs = ATTRS, **kw: Any
) -> ObjectInfo:
    return await o.store.put(key, body(data), len(data), attrs, **kw)


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def same_attrs(info: ObjectInfo, attrs: WriteAttrs) -> None:
    got = WriteAttrs.of(info)
    for name in ("content_type", "content_encoding", "content_disposition", "content_language",
                 "cache_control", "expires"):  # fmt: skip
        assert getattr(got, name) == getattr(attrs, name), name
    assert dict(got.metadata) == dict(attrs.metadata)


def open_uploads(o: AzureOrigin, key: str) -> list[str]:
    """Uncommitted block names on a blob, as Azure lists them."""
    blob = o.blobs.get_blob_client(f"{MOUNT_PREFIX}/{key}")
    try:
        _, uncommitted = blob.get_block_list("uncommitted")
    except Exception:  # the SDK's ResourceNotFoundError: no blocks at all
        return []
    return [b.id for b in uncommitted]


# -- read half: the contract of test_store_contract -------------------------------------------


async def test_stat_reports_size_md5_etag_mtime_type_and_metadata(az: AzureOrigin) -> None:
    from azure.storage.blob import ContentSettings

    settings = ContentSettings(
        content_type="application/json", content_encoding="identity", content_language="de",
        content_disposition='attachment; filename="m.json"', cache_control="max-age=60",
    )  # fmt: skip
    az.put("docs/readme.txt", b"hello world", content_type="text/plain")
    az.blobs.upload_blob(f"{MOUNT_PREFIX}/meta.json", b"{}", content_settings=settings,
                         metadata={"owner": "team-a", "Build": "42"})  # fmt: skip
    info = await az.store.stat("docs/readme.txt")
    assert (info.key, info.size, info.content_type) == ("docs/readme.txt", 11, "text/plain")
    assert info.etag == md5_etag(b"hello world")  # Azure's base64 Content-MD5, as S3's hex
    assert info.last_modified.utcoffset() is not None
    assert info.last_modified.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    meta = await az.store.stat("meta.json")
    assert (meta.content_type, meta.content_encoding) == ("application/json", "identity")
    assert meta.content_disposition == 'attachment; filename="m.json"'
    assert (meta.content_language, meta.cache_control) == ("de", "max-age=60")
    assert dict(meta.metadata) == {"owner": "team-a", "build": "42"}


async def test_stat_and_read_of_missing_or_directory_keys_are_not_found(az: AzureOrigin) -> None:
    az.put("dir/inner", b"x")
    for key in ("not-there", "dir", "dir/", "", "dir/../dir/inner", "dir\\inner"):
        with pytest.raises(ObjectNotFound):
            await az.store.stat(key)
        with pytest.raises(ObjectNotFound):
            await read_all(az.store, key)


async def test_ranges_return_exactly_the_requested_bytes(
    proxied: tuple[AzureOrigin, CountingProxy],
) -> None:
    az, proxy = proxied
    data = os.urandom(3 * MIB + 123)
    n = len(data)
    az.put("big.bin", data)
    cases = [(0, 10), (1000, 2000), (MIB - 1, 2 * MIB + 1), (n - 10, n), (n - 10, None)]
    cases += [(0, None), (5, n + 100), (n, None), (n + 5, n + 10), (7, 7)]
    for start, end in cases:
        assert await read_all(az.store, "big.bin", start, end) == data[start:end], (start, end)
    sent: list[str | None] = []

    async def record(request: Any) -> None:
        sent.append(request.headers.get("x-ms-range"))  # as it goes out

    az.store.http._http().event_hooks["request"] = [record]  # type: ignore[attr-defined]
    proxy.reset()
    await read_all(az.store, "big.bin", 1000, 2000)
    await read_all(az.store, "big.bin")
    await read_all(az.store, "big.bin", 4000)
    assert sent == ["bytes=1000-1999", None, "bytes=4000-"]
    path = f"/{ACCOUNT}/{az.container}/{MOUNT_PREFIX}/big.bin"
    assert [(r.method, r.path) for r in proxy.requests] == [("GET", path)] * 3  # one GET each


async def test_reads_arrive_in_bounded_chunks_and_stop_early(az: AzureOrigin) -> None:
    data = os.urandom(4 * MIB + 1)
    az.put("big.bin", data)
    chunks = [c async for c in az.store.read("big.bin")]
    assert b"".join(chunks) == data and max(len(c) for c in chunks) <= CHUNK_SIZE
    for _ in range(5):
        stream = az.store.read("big.bin")
        async for _chunk in stream:
            break
        await stream.aclose()
    assert await read_all(az.store, "big.bin", 10, 20) == data[10:20]


async def test_zero_length_object(az: AzureOrigin) -> None:
    az.put("empty", b"")
    assert (await az.store.stat("empty")).size == 0
    for args in ((), (0, 10), (5,)):
        assert await read_all(az.store, "empty", *args) == b""


async def test_if_match_takes_our_etag_in_one_request(
    proxied: tuple[AzureOrigin, CountingProxy],
) -> None:
    az, proxy = proxied
    az.put("obj", b"version one")
    old = (await az.store.stat("obj")).etag
    proxy.reset()
    assert await read_all(az.store, "obj", if_match=old) == b"version one"
    assert await read_all(az.store, "obj", 0, 7, if_match=old) == b"version"
    assert proxy.count() == 2  # checked on the GET's own answer, no HEAD first
    with pytest.raises(VersionChanged):
        await read_all(az.store, "obj", if_match='"0123-45"')
    az.put("obj", b"version two, longer")
    with pytest.raises(VersionChanged):
        await read_all(az.store, "obj", 0, 4, if_match=old)
    with pytest.raises(VersionChanged):
        await read_all(az.store, "obj", 100, 104, if_match=old)  # past the end, still checked


async def test_odd_keys_round_trip(az: AzureOrigin) -> None:
    for i, key in enumerate(TREE):
        az.put(key, f"body {i}".encode())
    for i, key in enumerate(TREE):
        assert (await az.store.stat(key)).size == len(f"body {i}")
        assert await read_all(az.store, key) == f"body {i}".encode()


@pytest.fixture
async def tree(az: AzureOrigin) -> AzureOrigin:
    for key in TREE:
        az.put(key, b"x")
    return az


async def test_listing_without_delimiter_matches_sorted_keys(tree: AzureOrigin) -> None:
    for prefix in ("", "a", "a/", "a/b", "café/", "nothing"):
        entries, _ = await list_all(tree.store, prefix)
        assert entries == oracle(TREE, prefix, None, ""), prefix
    entries, pages = await list_all(tree.store, max_keys=4)
    assert entries == sorted(TREE, key=utf8) and pages > 2
    for listed in (await tree.store.list_page("a/")).objects:
        stat = await tree.store.stat(listed.key)
        assert (listed.etag, listed.size) == (stat.etag, stat.size)  # one version, one ETag


async def test_listing_with_delimiter_rolls_up_prefixes(tree: AzureOrigin) -> None:
    combos = [("", "/"), ("a", "/"), ("a/", "/"), ("a/x/", "/"), ("a/b", "/"), ("", "-")]
    combos += [("a/", "b"), ("", "y/"), ("zz", "/"), ("nothing/", "/")]
    for prefix, delimiter in combos:
        for max_keys in (1, 2, 1000):
            entries, _ = await list_all(tree.store, prefix, delimiter, max_keys=max_keys)
            assert entries == oracle(TREE, prefix, delimiter, ""), (prefix, delimiter, max_keys)
    page = await tree.store.list_page("", "/")
    assert "a/" in page.common_prefixes and "a0" in [o.key for o in page.objects]
    assert page.next_token is None


async def test_start_after_skips_everything_up_to_it(tree: AzureOrigin) -> None:
    cases = [("", None, "a/b"), ("", "/", "a/b"), ("", "/", "a/"), ("a/", "/", "a/x/y")]
    cases += [("", None, "zzzz"), ("", "/", "\U0010ffff"), ("", None, "")]
    for prefix, delimiter, after in cases:
        for max_keys in (2, 1000):
            entries, _ = await list_all(tree.store, prefix, delimiter, after, max_keys)
            assert entries == oracle(TREE, prefix, delimiter, after), (prefix, delimiter, after)


async def test_missing_container_is_unavailable(azurite: AzuriteServer) -> None:
    store = open_store(f"az://{ACCOUNT}/no-such-container/x", store_options(azurite))
    try:
        with pytest.raises(StoreUnavailable):
            await store.stat("k")
        with pytest.raises(StoreUnavailable):
            await read_all(store, "k")
        with pytest.raises(StoreUnavailable):
            await store.list_page()
        with pytest.raises(StoreUnavailable):
            await store.put("k", body(b"x"), 1, WriteAttrs())
    finally:
        await store.close()


# -- write half: the contract of test_store_writes ---------------------------------------------


async def test_put_round_trips_bytes_attributes_metadata_and_checksum(az: AzureOrigin) -> None:
    data = os.urandom(MIB + 17)
    sha = base64.b64encode(hashlib.sha256(data).digest()).decode()
    attrs = WriteAttrs(**{**_fields(ATTRS), "checksums": {"sha256": sha}})
    written = await put(az, "docs/a b/ü.json", data, attrs)
    assert written.etag == md5_etag(data)
    info = await az.store.stat("docs/a b/ü.json")
    assert (info.size, info.etag, info.checksums) == (len(data), md5_etag(data), {"sha256": sha})
    same_attrs(info, attrs)
    assert await read_all(az.store, "docs/a b/ü.json") == data
    (listed,) = (await az.store.list_page("docs/")).objects
    assert (listed.key, listed.etag, listed.size) == ("docs/a b/ü.json", info.etag, len(data))
    props = az.blobs.get_blob_client(f"{MOUNT_PREFIX}/docs/a b/ü.json").get_blob_properties()
    assert props.content_settings.content_type == "application/json"  # a real Azure property


def _fields(attrs: WriteAttrs) -> dict[str, Any]:
    return {f: getattr(attrs, f) for f in WriteAttrs.__dataclass_fields__}


async def test_metadata_names_azure_refuses_are_kept_encoded(az: AzureOrigin) -> None:
    odd = {"x-team": "a", "Build_1": "b", "a1": "c", "a_b": "d", "s3gw_etag": "mine", "9lives": "e"}
    odd |= {"note": "grüße, 世界", "padded": "  spaced  ", "empty": ""}
    written = await put(az, "meta", b"x", WriteAttrs(metadata=odd))
    expected = {k.lower(): v for k, v in odd.items()}
    assert dict(written.metadata) == expected
    assert dict((await az.store.stat("meta")).metadata) == expected
    raw = az.blobs.get_blob_client(f"{MOUNT_PREFIX}/meta").get_blob_properties().metadata
    assert {"build_1", "a1", "a_b"} <= set(raw) and "x-team" not in raw


async def test_checksums_known_only_after_the_body_are_reported(az: AzureOrigin) -> None:
    data = os.urandom(300_000)
    sums: dict[str, str] = {}

    async def trailed() -> AsyncIterator[bytes]:
        async for chunk in body(data):
            yield chunk
        sums["sha256"] = base64.b64encode(hashlib.sha256(data).digest()).decode()

    written = await az.store.put("trailed", trailed(), len(data), WriteAttrs(checksums=sums))
    assert written.checksums == sums and sums


async def test_zero_length_put_and_overwrite(az: AzureOrigin) -> None:
    written = await put(az, "k.txt", b"", WriteAttrs(content_type="text/plain"))
    info = await az.store.stat("k.txt")
    assert (info.size, info.etag, written.etag, info.content_type) == (
        0, md5_etag(b""), md5_etag(b""), "text/plain",
    )  # fmt: skip
    await put(az, "k.txt", b"version two!", WriteAttrs(content_type="text/x"))
    info = await az.store.stat("k.txt")
    assert (info.etag, info.content_type, dict(info.metadata)) == (
        md5_etag(b"version two!"), "text/x", {},
    )  # fmt: skip
    assert az.raw_keys() == ["k.txt"]


async def test_conditional_writes(az: AzureOrigin) -> None:
    first = await put(az, "obj", b"one", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await put(az, "obj", b"two", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await put(az, "obj", b"two", if_match='"0123456789abcdef0123456789abcdef"')
    with pytest.raises(PreconditionFailed):
        await put(az, "missing", b"two", if_match=first.etag)
    with pytest.raises(PreconditionFailed):  # the block path checks before sending blocks
        await put(az, "obj", os.urandom(17 * MIB), if_none_match=True)
    assert await read_all(az.store, "obj") == b"one"
    second = await put(az, "obj", b"two", if_match=first.etag)
    big = await put(az, "obj", os.urandom(17 * MIB), if_match=second.etag)
    assert (await az.store.stat("obj")).etag == big.etag
    assert az.raw_keys() == ["obj"]


async def test_if_none_match_lets_one_of_two_racing_creators_win(az: AzureOrigin) -> None:
    gate = anyio.Event()
    outcomes: list[str] = []

    async def gated(data: bytes) -> AsyncIterator[bytes]:
        yield data[:3]
        await gate.wait()
        yield data[3:]

    async def create(data: bytes) -> None:
        try:
            await az.store.put("race", gated(data), len(data), ATTRS, if_none_match=True)
            outcomes.append(data.decode())
        except PreconditionFailed:
            outcomes.append("refused")

    async with anyio.create_task_group() as tg:
        tg.start_soon(create, b"writer-a")
        tg.start_soon(create, b"writer-b")
        await anyio.sleep(0.3)
        gate.set()
    assert sorted(outcomes)[0] == "refused" and len(outcomes) == 2
    winner = next(o for o in outcomes if o != "refused")
    assert await read_all(az.store, "race") == winner.encode()


@pytest.mark.parametrize("size", [3 * MIB, 20 * MIB], ids=["one-put", "blocks"])
@pytest.mark.parametrize("where", ["midway", "after-last-byte"])
async def test_body_that_raises_leaves_nothing_and_the_old_version(
    az: AzureOrigin, size: int, where: str
) -> None:
    data = os.urandom(size)
    fail_at = size if where == "after-last-byte" else size // 2
    with pytest.raises(ClientGone):
        await az.store.put("fresh", failing(data, fail_at), len(data), ATTRS)
    with pytest.raises(ObjectNotFound):
        await az.store.stat("fresh")
    await put(az, "kept", b"old bytes")
    with pytest.raises(ClientGone):
        await az.store.put("kept", failing(data, fail_at), len(data), ATTRS)
    assert await read_all(az.store, "kept") == b"old bytes"
    assert az.raw_keys() == ["kept"]


@pytest.mark.parametrize("sent", [0, 10, 12], ids=["empty", "short", "long"])
async def test_body_of_another_size_is_refused(az: AzureOrigin, sent: int) -> None:
    await put(az, "k", b"previous")
    for key in ("k", "other"):
        with pytest.raises(IncompleteBody):
            await az.store.put(key, body(b"x" * sent, 4), 11, ATTRS)
    assert await read_all(az.store, "k") == b"previous" and az.raw_keys() == ["k"]


async def test_a_put_in_progress_is_invisible_and_a_cancelled_one_leaves_nothing(
    az: AzureOrigin,
) -> None:
    await put(az, "k", b"old")
    started = anyio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b"n" * MIB
        started.set()
        await anyio.sleep_forever()
        yield b""

    async with anyio.create_task_group() as tg:
        tg.start_soon(az.store.put, "k", stalled(), 2 * MIB, ATTRS)
        tg.start_soon(az.store.put, "new", stalled(), 2 * MIB, ATTRS)
        await started.wait()
        await anyio.sleep(0.2)
        assert (await list_all(az.store))[0] == ["k"]
        with pytest.raises(ObjectNotFound):
            await az.store.stat("new")
        tg.cancel_scope.cancel()
    await anyio.sleep(0.2)
    assert az.raw_keys() == ["k"] and await read_all(az.store, "k") == b"old"


async def test_a_100_mib_put_streams_blocks_in_bounded_memory(
    proxied: tuple[AzureOrigin, CountingProxy],
) -> None:
    az, proxy = proxied
    size = 100 * MIB
    md5 = hashlib.md5()

    async def generated() -> AsyncIterator[bytes]:
        for i in range(size // MIB):
            chunk = i.to_bytes(4, "big") * (MIB // 4)
            md5.update(chunk)
            yield chunk

    await put(az, "warm-up", b"x")  # the client and its pools exist before
    proxy.reset()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        info = await az.store.put("huge.bin", generated(), size, WriteAttrs())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"100 MiB put: peak {(peak - before) / MIB:.1f} MiB traced")
    assert peak - before < 24 * MIB, f"peak {(peak - before) / MIB:.1f} MiB for a 100 MiB put"
    calls = [(r.method, sorted(parse_qs(r.query))) for r in proxy.requests]
    assert calls == [("PUT", ["blockid", "comp"])] * 13 + [("PUT", ["comp"])]
    assert info.etag == f'"{md5.hexdigest()}"'  # our MD5, kept as Content-MD5: not '-13'
    assert (await az.store.stat("huge.bin")).etag == info.etag
    tail = await read_all(az.store, "huge.bin", size - 4)
    assert tail == (size // MIB - 1).to_bytes(4, "big")


async def test_delete_removes_the_key_and_a_missing_key_is_fine(az: AzureOrigin) -> None:
    await put(az, "a/b/c/d.txt", b"x")
    await put(az, "a/keep", b"y")
    await az.store.delete("a/b/c/d.txt")
    with pytest.raises(ObjectNotFound):
        await az.store.stat("a/b/c/d.txt")
    for key in ("a/b/c/d.txt", "never/was", "a/../escape"):
        await az.store.delete(key)
    assert (await list_all(az.store, "", "/"))[0] == ["a/"] and az.raw_keys() == ["a/keep"]


async def test_keys_that_could_leave_the_prefix_are_refused(az: AzureOrigin) -> None:
    for key in ("../escape", "a/./b", "a/..", "a\\b", ""):
        with pytest.raises(UnsupportedKey):
            await put(az, key, b"x")
    assert az.raw_keys() == []


async def test_copy_keeps_or_replaces_attributes(
    proxied: tuple[AzureOrigin, CountingProxy],
) -> None:
    az, proxy = proxied
    data = os.urandom(100_000)
    src = await put(az, "src dir/ünï cöde.json", data, ATTRS)
    proxy.reset()
    kept = await az.store.copy("src dir/ünï cöde.json", "dst dir/kopie 1.json", None)
    assert proxy.count("GET") == 0  # Copy Blob: the bytes stay in Azure
    info = await az.store.stat("dst dir/kopie 1.json")
    same_attrs(info, ATTRS)
    assert (info.etag, kept.etag, info.size) == (src.etag, src.etag, len(data))
    relabelled = WriteAttrs(**{**_fields(ATTRS), "metadata": {"fresh": "yes"}})
    await az.store.copy("src dir/ünï cöde.json", "dst dir/kopie 2", relabelled)
    same_attrs(await az.store.stat("dst dir/kopie 2"), relabelled)
    new = WriteAttrs(content_type="text/x-new", metadata={"fresh": "yes"})
    await az.store.copy("src dir/ünï cöde.json", "dst dir/kopie 3", new)
    info = await az.store.stat("dst dir/kopie 3")
    assert (info.content_type, dict(info.metadata), info.cache_control) == (
        "text/x-new", {"fresh": "yes"}, None,
    )  # fmt: skip
    for key in ("dst dir/kopie 1.json", "dst dir/kopie 2", "dst dir/kopie 3"):
        assert await read_all(az.store, key) == data
    same_attrs(await az.store.stat("src dir/ünï cöde.json"), ATTRS)


async def test_copy_onto_itself_replaces_attributes_only(az: AzureOrigin) -> None:
    await put(az, "self", b"bytes stay")
    await az.store.copy("self", "self", WriteAttrs(content_type="text/plain"))
    info = await az.store.stat("self")
    assert (info.content_type, dict(info.metadata)) == ("text/plain", {})
    assert await read_all(az.store, "self") == b"bytes stay"


async def test_copy_if_match_guards_the_source_version(az: AzureOrigin) -> None:
    first = await put(az, "src", b"one")
    await put(az, "src", b"two")
    with pytest.raises(VersionChanged):
        await az.store.copy("src", "dst", None, if_match=first.etag)
    with pytest.raises(ObjectNotFound):
        await az.store.copy("nothing-here", "dst", None)
    assert az.raw_keys() == ["src"]
    await az.store.copy("src", "dst", None, if_match=(await az.store.stat("src")).etag)
    assert await read_all(az.store, "dst") == b"two"


# -- multipart as uncommitted blocks -----------------------------------------------------------


async def upload(o: AzureOrigin, key: str, upload_id: str, number: int, data: bytes) -> PartInfo:
    return await o.store.upload_part(key, upload_id, number, body(data, MIB), len(data))


async def test_multipart_joins_parts_with_the_s3_etag(az: AzureOrigin) -> None:
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), b"!"]
    key = "mp/ünï file.bin"
    upload_id = await az.store.create_multipart(key, ATTRS)
    infos = [await upload(az, key, upload_id, n, d) for n, d in enumerate(parts, 1)]
    assert [i.etag for i in infos] == [md5_etag(d) for d in parts]
    parts[1] = os.urandom(5 * MIB)  # uploading a number again replaces that part
    infos[1] = await upload(az, key, upload_id, 2, parts[1])
    assert infos[1] == PartInfo(2, md5_etag(parts[1]), 5 * MIB)
    with pytest.raises(ObjectNotFound):
        await az.store.stat(key)  # uncommitted blocks are no blob
    assert await list_all(az.store) == ([], 1)

    done = await az.store.complete_multipart(key, upload_id, infos, ATTRS)
    digests = b"".join(hashlib.md5(d).digest() for d in parts)
    expected = f'"{hashlib.md5(digests).hexdigest()}-3"'
    info = await az.store.stat(key)
    assert (done.etag, info.etag, info.size) == (expected, expected, 10 * MIB + 1)
    same_attrs(info, ATTRS)
    assert (await az.store.list_page("mp/")).objects[0].etag == expected
    assert await read_all(az.store, key) == b"".join(parts)
    assert az.raw_keys() == [key] and open_uploads(az, key) == []  # the commit dropped the rest
    with pytest.raises(UploadNotFound):
        await upload(az, key, upload_id, 4, b"late")


async def test_complete_with_a_wrong_part_makes_nothing(az: AzureOrigin) -> None:
    upload_id = await az.store.create_multipart("mp", ATTRS)
    one = await upload(az, "mp", upload_id, 1, os.urandom(5 * MIB))
    two = await upload(az, "mp", upload_id, 2, b"tail")
    for wrong in (
        [one, PartInfo(2, md5_etag(b"something else"), 4)],
        [one, PartInfo(3, two.etag, 4)],
        [one, PartInfo(2, two.etag, 5)],
        [two, one],
        [],
    ):
        with pytest.raises(InvalidPart):
            await az.store.complete_multipart("mp", upload_id, wrong, ATTRS)
    with pytest.raises(ObjectNotFound):
        await az.store.stat("mp")
    await az.store.complete_multipart("mp", upload_id, [one, two], ATTRS)
    assert (await az.store.stat("mp")).size == 5 * MIB + 4


async def test_abort_leaves_nothing_committed_and_the_upload_gone(az: AzureOrigin) -> None:
    upload_id = await az.store.create_multipart("mp", ATTRS)
    part = await upload(az, "mp", upload_id, 1, b"part")
    assert len(open_uploads(az, "mp")) == 3  # marker, part bytes, part record
    await az.store.abort_multipart("mp", upload_id)
    assert az.raw_keys() == []
    with pytest.raises(UploadNotFound):
        await upload(az, "mp", upload_id, 2, b"more")
    with pytest.raises(UploadNotFound):
        await az.store.complete_multipart("mp", upload_id, [part], ATTRS)
    await az.store.abort_multipart("mp", upload_id)  # again: not an error
    with pytest.raises(ObjectNotFound):
        await az.store.stat("mp")


async def test_unknown_uploads_are_not_found(az: AzureOrigin) -> None:
    real = await az.store.create_multipart("mp", ATTRS)
    for fake in ("A" * 32, "not-hex", real[:-2]):
        with pytest.raises(UploadNotFound):
            await upload(az, "mp", fake, 1, b"x")
        with pytest.raises(UploadNotFound):
            await az.store.complete_multipart("mp", fake, [PartInfo(1, md5_etag(b"x"), 1)], ATTRS)
        await az.store.abort_multipart("mp", fake)
    with pytest.raises(UploadNotFound):  # an upload belongs to the blob it was made for
        await upload(az, "other-key", real, 1, b"x")
    await az.store.abort_multipart("mp", real)


async def test_a_part_body_that_raises_keeps_the_previous_part(az: AzureOrigin) -> None:
    upload_id = await az.store.create_multipart("mp", ATTRS)
    good = await upload(az, "mp", upload_id, 1, b"good part")
    data = os.urandom(2 * MIB)
    with pytest.raises(ClientGone):
        await az.store.upload_part("mp", upload_id, 1, failing(data, MIB), len(data))
    with pytest.raises(IncompleteBody):
        await az.store.upload_part("mp", upload_id, 1, body(b"short"), 9)
    await az.store.complete_multipart("mp", upload_id, [good], ATTRS)
    assert await read_all(az.store, "mp") == b"good part"


# -- containers --------------------------------------------------------------------------------


async def test_create_and_delete_containers(azurite: AzuriteServer) -> None:
    uri, options = f"az://{ACCOUNT}/fresh-container", store_options(azurite)
    await create_bucket(uri, options)
    with pytest.raises(ContainerExists):
        await create_bucket(uri, options)
    store = open_store(uri, options)
    try:
        await store.put("k/in it", body(b"x"), 1, WriteAttrs())
        with pytest.raises(ContainerNotEmpty):
            await delete_bucket(uri, options)
        await store.delete("k/in it")
        await store.create_multipart("later", WriteAttrs())  # an open upload is no object
        await delete_bucket(uri, options)
    finally:
        await store.close()
    assert not sdk_client(azurite).get_container_client("fresh-container").exists()
    with pytest.raises(ContainerNotFound):
        await delete_bucket(uri, options)
    with pytest.raises(ValueError):
        await create_bucket(f"{uri}/with-prefix", options)


# -- URLs, options, authorization ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "account", "container", "prefix", "origin"),
    [
        ("az://acct1/cont/pre/fix", "acct1", "cont", "pre/fix/", "https://acct1.blob.core.windows.net"),
        ("az://acct1/cont", "acct1", "cont", "", "https://acct1.blob.core.windows.net"),
        ("abfs://cont@acct1.dfs.core.windows.net/a/b", "acct1", "cont", "a/b/", "https://acct1.blob.core.windows.net"),
        ("abfss://cont@acct1.dfs.core.chinacloudapi.cn/", "acct1", "cont", "", "https://acct1.blob.core.chinacloudapi.cn"),
        ("wasb://cont@acct1.blob.core.windows.net/p%20q", "acct1", "cont", "p q/", "https://acct1.blob.core.windows.net"),
        ("wasbs://cont@acct1.blob.core.windows.net", "acct1", "cont", "", "https://acct1.blob.core.windows.net"),
    ],
)  # fmt: skip
def test_url_forms_parse(uri: str, account: str, container: str, prefix: str, origin: str) -> None:
    store = open_azure(urlsplit(uri), {})
    assert (store.account, store.container, store.prefix) == (account, container, prefix)
    assert store.http.origin == origin


@pytest.mark.parametrize(
    "uri",
    ["az://acct1", "az://acct1/", "az://acct1/UPPER", "az://a/cont", "az://cont@acct1/x",
     "abfss://acct1.dfs.core.windows.net/x", "wasbs://c@acct1.blob.core.windows.net/x",
     "abfs://cont@somewhere.example.com/x", "abfs://cont:pw@acct1.dfs.core.windows.net/x"],
)  # fmt: skip
def test_malformed_urls_are_refused(uri: str) -> None:
    with pytest.raises(ValueError):
        open_azure(urlsplit(uri), {})


def test_options_are_checked() -> None:
    parts = urlsplit("az://acct1/cont")
    for bad in ({"endpoint_url": "x"}, {"account_key": "a2V5", "sas_token": "sv=1"},
                {"max_attempts": "0"}, {"read_timeout": "soon"}, {"account_key": "not base64!"},
                {"endpoint": "ftp://x"}):  # fmt: skip
        with pytest.raises(ValueError):
            open_azure(parts, bad)
    assert isinstance(open_store("az://acct1/cont", {"sas_token": "?sv=1&sig=x"}), AzureStore)


def test_string_to_sign_follows_microsofts_rules() -> None:
    headers = {"x-ms-meta-a1": "x", "x-ms-meta-a_b": "y", "x-ms-date": "D", "content-length": "0",
               "x-ms-version": "V", "x-ms-meta-b": " two   words "}  # fmt: skip
    text = string_to_sign("put", "acct", "/acct/c/k%20y", "comp=block&blockid=QQ%3D%3D", headers)
    assert text.split("\n") == (
        ["PUT"] + [""] * 11
        + ["x-ms-date:D", "x-ms-meta-a_b:y", "x-ms-meta-a1:x", "x-ms-meta-b:two words",
           "x-ms-version:V", "/acct/acct/c/k%20y", "blockid:QQ==", "comp:block"]
    )  # fmt: skip


async def test_sas_token_and_anonymous_access(az: AzureOrigin, azurite: AzuriteServer) -> None:
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    az.put("k", b"via sas")
    allowed = ContainerSasPermissions(read=True, write=True, list=True, delete=True)
    expiry = datetime.now(UTC) + timedelta(hours=1)
    sas = generate_container_sas(
        ACCOUNT, az.container, account_key=azurite.key, expiry=expiry, permission=allowed
    )
    uri = f"az://{ACCOUNT}/{az.container}/{MOUNT_PREFIX}"
    store = open_store(uri, {"endpoint": azurite.url, "sas_token": sas})
    anonymous = open_store(uri, {"endpoint": azurite.url})
    try:
        assert await read_all(store, "k") == b"via sas"
        await store.put("new", body(b"n"), 1, WriteAttrs())
        await store.copy("new", "copied", None)
        assert (await list_all(store))[0] == ["copied", "k", "new"]
        with pytest.raises(StoreAccessDenied):
            await anonymous.stat("k")
        with pytest.raises(StoreAccessDenied):
            await anonymous.put("k", body(b"x"), 1, WriteAttrs())
    finally:
        await store.close()
        await anonymous.close()


# -- faults ------------------------------------------------------------------------------------


async def _drain(stream: AsyncIterator[bytes]) -> None:
    async for _chunk in stream:
        pass


@pytest.fixture
def own_azurite(tmp_path: Path) -> Iterator[AzuriteServer]:
    """A server of this test's own, which it may kill."""
    server = AzuriteServer(tmp_path / "azurite")
    yield server
    server.stop()


async def test_killed_server_is_unavailable_within_the_deadline_then_back(
    own_azurite: AzuriteServer,
) -> None:
    o = AzureOrigin(own_azurite)
    await o.store.close()
    o.store = open_store(
        f"az://{ACCOUNT}/{o.container}/{MOUNT_PREFIX}",
        store_options(own_azurite, retry_deadline="3", max_attempts="10", connect_timeout="1"),
    )
    try:
        data = os.urandom(8 * MIB)
        o.put("big", data)
        stream = o.store.read("big")
        assert await anext(stream)
        own_azurite.stop(kill=True)
        timings = []
        calls = [_drain(stream), o.store.stat("big"), put(o, "new", b"x"), o.store.list_page()]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await call
            timings.append(time.monotonic() - started)
        print("killed Azurite: read, stat, put, list unavailable after", timings, "s")
        assert timings[0] < 1  # a body cut short is not retried
        assert max(timings) < 3 + 1  # the retry deadline, plus at most one connect timeout
        own_azurite.restart()
        # Azurite saves its blob index every 5 s, so a kill loses what came just before it.
        if not o.blobs.exists():
            o.blobs.create_container()
        await put(o, "new", b"back")  # the same store, on new connections
        own_azurite.restart()  # a clean stop saves the index: the blob outlives it
        assert await read_all(o.store, "new") == b"back"
    finally:
        await o.store.close()


async def test_server_busy_is_retried_then_unavailable(
    azurite: AzuriteServer, az: AzureOrigin
) -> None:
    az.put("k", b"value")
    uri = f"az://{ACCOUNT}/{az.container}/{MOUNT_PREFIX}"
    front = FlakyFront(azurite.url, failures=2)
    store = open_store(uri, store_options(azurite, endpoint=front.url, max_attempts="3"))
    try:
        assert await read_all(store, "k") == b"value"
        assert front.seen == [("GET", 503), ("GET", 503), ("GET", 200)]
        await store.put("w", body(b"written"), 7, WriteAttrs())
        front.failures = 3
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.stat("k")
        assert time.monotonic() - started < 2
        assert front.seen[-3:] == [("HEAD", 503)] * 3  # three tries, then given up
    finally:
        await store.close()
        front.stop()
    assert az.blobs.get_blob_client(f"{MOUNT_PREFIX}/w").download_blob().readall() == b"written"


async def test_unreachable_endpoint_is_unavailable() -> None:
    dead = f"http://127.0.0.1:{free_port()}/{ACCOUNT}"
    store = open_store(f"az://{ACCOUNT}/cont/p", {"endpoint": dead, "retry_deadline": "1"})
    try:
        for call in (store.stat("k"), read_all(store, "k"), store.list_page()):
            with pytest.raises(StoreUnavailable):
                await call
    finally:
        await store.close()
