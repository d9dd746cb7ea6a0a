"""The Azure Blob store against Azurite: the behaviours test_store_contract and test_store_writes
prove for s3://, checked on a container with decoys beside the mount prefix, with blobs put
and inspected through Microsoft's own SDK; plus what is Azure's own (URL forms, Shared Key and
SAS, block ids, metadata names) and the faults: a killed server, a throttling one."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gateway.stores import (
    InvalidPart,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    StoreAccessDenied,
    StoreUnavailable,
    UnsupportedKey,
    VersionChanged,
    WriteAttrs,
    open_store,
)
from gateway.stores.azure import CHUNK_SIZE, AzureStore, open_azure
from gateway.stores.azure.wire import string_to_sign
from tests.support.azurite import (
    ACCOUNT,
    AzureOrigin,
    AzuriteServer,
    FlakyFront,
    store_options,
)
from tests.support.net import free_port
from tests.support.origin import CountingProxy
from tests.support.stores import (
    MOUNT_PREFIX,
    TREE,
    FakeClock,
    every_call_is_unavailable,
    list_all,
    oracle,
    put_large,
    range_cases,
    read_all,
)
from tests.support.writes import ATTRS, MIB, body, md5_etag, put, same_attrs, upload

pytestmark = pytest.mark.anyio


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
    for start, end in range_cases(n):
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


@pytest.fixture
async def tree(az: AzureOrigin) -> AzureOrigin:
    for key in TREE:
        az.put(key, b"x")
    return az


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
        await every_call_is_unavailable(store, writes=True)
    finally:
        await store.close()


# -- writes: what test_store_writes does not show ---------------------------------------------


async def test_content_type_is_the_blobs_own_property(az: AzureOrigin) -> None:
    await put(az, "docs/a b/ü.json", os.urandom(MIB + 17), ATTRS)
    props = az.blobs.get_blob_client(f"{MOUNT_PREFIX}/docs/a b/ü.json").get_blob_properties()
    assert props.content_settings.content_type == "application/json"  # a real Azure property


async def test_metadata_names_azure_refuses_are_kept_encoded(az: AzureOrigin) -> None:
    odd = {"x-team": "a", "Build_1": "b", "a1": "c", "a_b": "d", "s3gw_etag": "mine", "9lives": "e"}
    odd |= {"note": "grüße, 世界", "padded": "  spaced  ", "empty": ""}
    written = await put(az, "meta", b"x", WriteAttrs(metadata=odd))
    expected = {k.lower(): v for k, v in odd.items()}
    assert dict(written.metadata) == expected
    assert dict((await az.store.stat("meta")).metadata) == expected
    raw = az.blobs.get_blob_client(f"{MOUNT_PREFIX}/meta").get_blob_properties().metadata
    assert {"build_1", "a1", "a_b"} <= set(raw) and "x-team" not in raw


async def test_a_100_mib_put_streams_blocks_in_bounded_memory(
    proxied: tuple[AzureOrigin, CountingProxy],
) -> None:
    az, proxy = proxied
    size = 100 * MIB
    await put(az, "warm-up", b"x")  # the client and its pools exist before
    proxy.reset()
    sent = await put_large(az.store, "huge.bin", size)
    print(f"100 MiB put: {sent.peak_text()}")
    assert sent.peak < 24 * MIB, f"{sent.peak_text()} for a 100 MiB put"
    calls = [(r.method, sorted(parse_qs(r.query))) for r in proxy.requests]
    assert calls == [("PUT", ["blockid", "comp"])] * 13 + [("PUT", ["comp"])]
    assert sent.info.etag == sent.etag  # our MD5, kept as Content-MD5: not '-13'
    assert (await az.store.stat("huge.bin")).etag == sent.etag
    assert await read_all(az.store, "huge.bin", size - 4) == sent.last_four


async def test_conditional_writes_on_the_block_path(az: AzureOrigin) -> None:
    first = await put(az, "obj", b"one")
    with pytest.raises(PreconditionFailed):  # the block path checks before sending blocks
        await put(az, "obj", os.urandom(17 * MIB), if_none_match=True)
    assert await read_all(az.store, "obj") == b"one"
    big = await put(az, "obj", os.urandom(17 * MIB), if_match=first.etag)
    assert (await az.store.stat("obj")).etag == big.etag
    assert az.raw_keys() == ["obj"]


async def test_keys_that_could_leave_the_prefix_are_refused(az: AzureOrigin) -> None:
    for key in ("../escape", "a/./b", "a/..", "a\\b", ""):
        with pytest.raises(UnsupportedKey):
            await put(az, key, b"x")
    await az.store.delete("a/../escape")  # a key that cannot be is not there: no error
    assert az.raw_keys() == []


async def test_copy_stays_in_azure_and_can_relabel_metadata_only(
    proxied: tuple[AzureOrigin, CountingProxy],
) -> None:
    az, proxy = proxied
    data = os.urandom(100_000)
    src = await put(az, "src dir/ünï cöde.json", data, ATTRS)
    proxy.reset()
    kept = await az.store.copy("src dir/ünï cöde.json", "dst dir/kopie 1.json", None)
    assert proxy.count("GET") == 0  # Copy Blob: the bytes stay in Azure
    assert kept.etag == src.etag
    relabelled = replace(ATTRS, metadata={"fresh": "yes"})
    await az.store.copy("src dir/ünï cöde.json", "dst dir/kopie 2", relabelled)
    same_attrs(await az.store.stat("dst dir/kopie 2"), relabelled)
    assert await read_all(az.store, "dst dir/kopie 2") == data


# -- multipart as uncommitted blocks -----------------------------------------------------------


async def test_an_upload_is_uncommitted_blocks_checked_by_size_too(az: AzureOrigin) -> None:
    upload_id = await az.store.create_multipart("mp", ATTRS)
    one = await upload(az, "mp", upload_id, 1, os.urandom(5 * MIB))
    two = await upload(az, "mp", upload_id, 2, b"tail")
    assert len(open_uploads(az, "mp")) == 5  # marker, and per part its bytes and its record
    with pytest.raises(InvalidPart):
        await az.store.complete_multipart("mp", upload_id, [one, PartInfo(2, two.etag, 5)], ATTRS)
    await az.store.complete_multipart("mp", upload_id, [one, two], ATTRS)
    assert open_uploads(az, "mp") == [] and az.raw_keys() == ["mp"]


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


@pytest.mark.slow
async def test_killed_server_is_unavailable_within_the_deadline_then_back(
    own_azurite: AzuriteServer,
) -> None:
    o = AzureOrigin(own_azurite)
    await o.store.close()
    clock = FakeClock()
    uri = urlsplit(f"az://{ACCOUNT}/{o.container}/{MOUNT_PREFIX}")
    options = store_options(own_azurite, retry_deadline="3", max_attempts="10", connect_timeout="1")
    o.store = open_azure(uri, options, clock=clock)
    try:
        data = os.urandom(8 * MIB)
        o.put("big", data)
        stream = o.store.read("big")
        assert await anext(stream)
        own_azurite.stop(kill=True)
        with pytest.raises(StoreUnavailable):
            await _drain(stream)
        assert clock.pauses == []  # a body cut short is not retried
        for call in (o.store.stat("big"), put(o, "new", b"x"), o.store.list_page()):
            started, waits = clock.now, len(clock.pauses)
            with pytest.raises(StoreUnavailable):
                await call
            # Retried, then given up rather than wait past the retry deadline.
            assert len(clock.pauses) > waits and clock.now - started < 3
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
    clock = FakeClock()
    options = store_options(azurite, endpoint=front.url, max_attempts="3")
    store = open_azure(urlsplit(uri), options, clock=clock)
    try:
        assert await read_all(store, "k") == b"value"
        assert front.seen == [("GET", 503), ("GET", 503), ("GET", 200)]
        assert len(clock.pauses) == 2  # a wait before each try again
        await store.put("w", body(b"written"), 7, WriteAttrs())
        front.failures = 3
        with pytest.raises(StoreUnavailable):
            await store.stat("k")
        assert len(clock.pauses) == 4
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
