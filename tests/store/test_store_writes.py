"""The write half of the store contract: every under-store of test_store_contract (a temporary
folder, S3 on moto behind the counting proxy, Azure on Azurite, GCS on fake-gcs-server, HDFS on
the WebHDFS test server, each with a mount prefix) must write, copy, delete and join parts alike,
and a failed write must leave nothing visible."""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs

import anyio
import pytest
from botocore.exceptions import ClientError

from gateway.stores import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    IncompleteBody,
    InvalidPart,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    UnsupportedKey,
    UploadNotFound,
    VersionChanged,
    WriteAttrs,
    create_bucket,
    delete_bucket,
    open_store,
)
from gateway.stores.s3 import writes as s3_write
from tests.support.net import eventually_async
from tests.support.stores import (
    MOUNT_PREFIX,
    FileOrigin,
    Origin,
    S3Origin,
    Stalls,
    list_all,
    put_large,
    read_all,
    s3_options,
)
from tests.support.writes import (
    ATTRS,
    MIB,
    ClientGone,
    body,
    failing,
    md5_etag,
    put,
    same_attrs,
    upload,
)

if TYPE_CHECKING:
    from tests.support.azurite import AzureOrigin
    from tests.support.gcs_server import GcsOrigin
    from tests.support.webhdfs_server import HdfsOrigin

pytestmark = pytest.mark.anyio


def sha256_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


UPLOADS = ".s3gw-uploads/"


def raw_keys(o: Origin) -> list[str]:
    """What the under-store itself holds under the mount, temp files too (but not the stores'
    open uploads: `open_uploads`)."""
    if isinstance(o, FileOrigin):
        found = (str(p.relative_to(o.root)) for p in o.root.rglob("*") if not p.is_dir())
        return sorted(k for k in found if not k.startswith(UPLOADS))
    if isinstance(o, S3Origin):
        page = o.s3.list_objects_v2(Bucket=o.bucket, Prefix=f"{MOUNT_PREFIX}/")
        return sorted(c["Key"][len(MOUNT_PREFIX) + 1 :] for c in page.get("Contents", []))
    if o.kind == "azure":
        return cast("AzureOrigin", o).raw_keys()  # committed blobs only
    if o.kind == "gcs":
        return [k for k in cast("GcsOrigin", o).raw_keys() if not k.startswith(UPLOADS)]
    base = cast("HdfsOrigin", o).base
    found = (str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
    return sorted(k for k in found if not k.startswith(UPLOADS))


def open_uploads(o: Origin) -> list[str]:
    """What of unfinished uploads the under-store holds: upload folders or ids, or Azure's
    uncommitted blocks."""
    if isinstance(o, FileOrigin | S3Origin) or o.kind == "hdfs":
        if isinstance(o, S3Origin):
            page = o.s3.list_multipart_uploads(Bucket=o.bucket, Prefix=f"{MOUNT_PREFIX}/")
            return [u["UploadId"] for u in page.get("Uploads", [])]
        uploads = (o.root if isinstance(o, FileOrigin) else cast("HdfsOrigin", o).base) / UPLOADS
        return sorted(p.name for p in uploads.iterdir()) if uploads.exists() else []
    if o.kind == "gcs":
        keys = cast("GcsOrigin", o).raw_keys()
        return sorted({k.split("/")[1] for k in keys if k.startswith(UPLOADS)})
    blobs = cast("AzureOrigin", o).blobs
    found = blobs.list_blobs(name_starts_with=f"{MOUNT_PREFIX}/", include=["uncommittedblobs"])
    blocks: list[str] = []
    for blob in found:
        _, uncommitted = blobs.get_blob_client(blob.name).get_block_list("uncommitted")
        blocks += [b.id for b in uncommitted]
    return blocks


# -- put -------------------------------------------------------------------------------------


async def test_put_round_trips_bytes_attributes_metadata_and_checksum(origin: Origin) -> None:
    data = os.urandom(MIB + 17)
    attrs = replace(ATTRS, checksums={"sha256": sha256_b64(data)})
    written = await put(origin, "docs/a b/ü.json", data, attrs)
    assert written.etag == md5_etag(data)  # a single PUT's ETag is the MD5, as S3 gives
    info = await origin.store.stat("docs/a b/ü.json")
    assert (info.size, info.etag) == (len(data), md5_etag(data))
    same_attrs(info, attrs)
    assert info.checksums.get("sha256") == sha256_b64(data)
    assert written.checksums.get("sha256") == sha256_b64(data)
    assert await read_all(origin.store, "docs/a b/ü.json") == data
    (listed,) = (await origin.store.list_page("docs/")).objects
    assert (listed.key, listed.etag, listed.size) == ("docs/a b/ü.json", info.etag, len(data))


async def test_checksums_known_only_after_the_body_are_reported(origin: Origin) -> None:
    """A trailer's checksum is verified, and so known, only once the last byte is in."""
    data = os.urandom(300_000)
    sums: dict[str, str] = {}

    async def trailed() -> AsyncIterator[bytes]:
        async for chunk in body(data):
            yield chunk
        sums["sha256"] = sha256_b64(data)

    attrs = WriteAttrs(content_type="application/x-test", checksums=sums)
    written = await origin.store.put("trailed", trailed(), len(data), attrs)
    assert written.checksums.get("sha256") == sha256_b64(data)
    if origin.kind == "file":  # kept with the file; S3 keeps only what its headers carried
        assert (await origin.store.stat("trailed")).checksums.get("sha256") == sha256_b64(data)


async def test_zero_length_put(origin: Origin) -> None:
    written = await put(origin, "empty", b"", WriteAttrs(content_type="text/plain"))
    info = await origin.store.stat("empty")
    assert (info.size, info.etag, written.etag) == (0, md5_etag(b""), md5_etag(b""))
    assert info.content_type == "text/plain"
    assert await read_all(origin.store, "empty") == b""


async def test_overwrite_replaces_bytes_and_attributes(origin: Origin) -> None:
    await put(origin, "k.txt", b"version one", ATTRS)
    await put(origin, "k.txt", b"version two!", WriteAttrs(content_type="text/plain"))
    info = await origin.store.stat("k.txt")
    assert (info.etag, info.content_type, dict(info.metadata)) == (
        md5_etag(b"version two!"),
        "text/plain",
        {},
    )
    assert await read_all(origin.store, "k.txt") == b"version two!"
    assert raw_keys(origin) == ["k.txt"]


async def test_if_none_match_creates_only_new_keys(origin: Origin) -> None:
    await put(origin, "new", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await put(origin, "new", b"second", if_none_match=True)
    assert await read_all(origin.store, "new") == b"first"


async def test_if_none_match_lets_one_of_two_racing_creators_win(origin: Origin) -> None:
    gate = anyio.Event()
    outcomes: list[str] = []
    streaming: list[bytes] = []

    async def gated(data: bytes) -> AsyncIterator[bytes]:
        yield data[:3]
        streaming.append(data)
        await gate.wait()
        yield data[3:]

    async def create(data: bytes) -> None:
        try:
            await origin.store.put("race", gated(data), len(data), ATTRS, if_none_match=True)
            outcomes.append(data.decode())
        except PreconditionFailed:
            outcomes.append("refused")

    async with anyio.create_task_group() as tg:
        tg.start_soon(create, b"writer-a")
        tg.start_soon(create, b"writer-b")
        await eventually_async(lambda: len(streaming) == 2)  # both past the early check
        gate.set()
    assert sorted(outcomes)[0] == "refused" and len(outcomes) == 2
    winner = next(o for o in outcomes if o != "refused")
    assert await read_all(origin.store, "race") == winner.encode()
    assert raw_keys(origin) == ["race"]  # the loser left no temp file


async def test_if_match_guards_the_version_written_over(origin: Origin) -> None:
    first = await put(origin, "obj", b"one")
    with pytest.raises(PreconditionFailed):
        await put(origin, "obj", b"two", if_match='"0123456789abcdef0123456789abcdef"')
    with pytest.raises(PreconditionFailed):
        await put(origin, "missing", b"two", if_match=first.etag)
    assert await read_all(origin.store, "obj") == b"one"
    await put(origin, "obj", b"two", if_match=first.etag)
    assert await read_all(origin.store, "obj") == b"two"
    assert raw_keys(origin) == ["obj"]


@pytest.mark.parametrize("size", [3 * MIB, 20 * MIB], ids=["one-request", "chunked"])
@pytest.mark.parametrize("where", ["midway", "after-last-byte"])
async def test_body_that_raises_leaves_nothing_and_the_old_version(
    origin: Origin, size: int, where: str
) -> None:
    """Both ways a store sends a body: one request, or parts/blocks/resumable chunks."""
    data = os.urandom(size)
    fail_at = size if where == "after-last-byte" else size * 2 // 3
    with pytest.raises(ClientGone):
        await origin.store.put("fresh", failing(data, fail_at), len(data), ATTRS)
    with pytest.raises(ObjectNotFound):
        await origin.store.stat("fresh")
    await put(origin, "kept", b"old bytes")
    with pytest.raises(ClientGone):
        await origin.store.put("kept", failing(data, fail_at), len(data), ATTRS)
    assert await read_all(origin.store, "kept") == b"old bytes"
    assert raw_keys(origin) == ["kept"]  # no temp file left, no object committed


async def test_body_that_raises_in_a_multipart_sized_put_is_aborted(origin: Origin) -> None:
    data = os.urandom(20 * MIB)  # above the S3 store's multipart threshold
    with pytest.raises(ClientGone):
        await origin.store.put("big", failing(data, 19 * MIB, MIB), len(data), ATTRS)
    with pytest.raises(ObjectNotFound):
        await origin.store.stat("big")
    assert raw_keys(origin) == [] and (await list_all(origin.store))[0] == []
    if origin.kind != "azure":  # Azure cannot drop a blob's uncommitted blocks; they expire
        assert open_uploads(origin) == []


@pytest.mark.parametrize("sent", [0, 10, 12], ids=["empty", "short", "long"])
async def test_body_of_another_size_is_refused(origin: Origin, sent: int) -> None:
    await put(origin, "k", b"previous")
    with pytest.raises(IncompleteBody):
        await origin.store.put("k", body(b"x" * sent, 4), 11, ATTRS)
    with pytest.raises(IncompleteBody):
        await origin.store.put("other", body(b"x" * sent, 4), 11, ATTRS)
    assert await read_all(origin.store, "k") == b"previous"
    assert raw_keys(origin) == ["k"]


async def test_a_chunked_body_that_ends_short_is_refused(origin: Origin) -> None:
    with pytest.raises(IncompleteBody):
        await origin.store.put("big", body(b"x" * (9 * MIB), MIB), 10 * MIB, ATTRS)
    with pytest.raises(ObjectNotFound):
        await origin.store.stat("big")
    assert raw_keys(origin) == []


async def test_a_put_in_progress_is_invisible_and_a_cancelled_one_leaves_nothing(
    origin: Origin,
) -> None:
    await put(origin, "k", b"old")
    stalls = Stalls()
    async with anyio.create_task_group() as tg:
        tg.start_soon(origin.store.put, "k", stalls.body(b"n" * MIB), 2 * MIB, ATTRS)
        tg.start_soon(origin.store.put, "new", stalls.body(b"n" * MIB), 2 * MIB, ATTRS)
        await eventually_async(lambda: stalls.sent == 2)  # both have sent their first MiB
        entries, _ = await list_all(origin.store)
        assert entries == ["k"]
        with pytest.raises(ObjectNotFound):
            await origin.store.stat("new")
        assert await read_all(origin.store, "k") == b"old"
        tg.cancel_scope.cancel()
    # What the cut uploads began goes once the origin sees the connections cut.
    await eventually_async(lambda: raw_keys(origin) == ["k"])
    assert await read_all(origin.store, "k") == b"old"


async def test_put_streams_a_large_body_in_bounded_memory(origin: Origin) -> None:
    size = 64 * MIB
    await put(origin, "warm-up", b"x")  # the client and its models are loaded before
    sent = await put_large(origin.store, "huge.bin", size)
    assert sent.peak < 20 * MIB, f"{sent.peak_text()} for a 64 MiB put"
    assert (await origin.store.stat("huge.bin")).size == size
    if origin.kind == "s3":
        assert sent.info.etag.endswith('-8"')  # 8 MiB parts: the multipart form, fine for S3
    else:  # the others keep the MD5 they took on the way, whatever the size
        assert sent.info.etag == sent.etag
    assert await read_all(origin.store, "huge.bin", size - 4) == sent.last_four


# -- delete ----------------------------------------------------------------------------------


async def test_delete_removes_the_key_and_a_missing_key_is_fine(origin: Origin) -> None:
    await put(origin, "a/b/c/d.txt", b"x")
    await put(origin, "a/keep", b"y")
    await origin.store.delete("a/b/c/d.txt")
    with pytest.raises(ObjectNotFound):
        await origin.store.stat("a/b/c/d.txt")
    await origin.store.delete("a/b/c/d.txt")
    await origin.store.delete("never/was")
    entries, _ = await list_all(origin.store, "", "/")
    assert entries == ["a/"]
    assert raw_keys(origin) == ["a/keep"]
    if isinstance(origin, FileOrigin) or origin.kind == "hdfs":
        # Object stores have no folders: the ones the delete emptied go, the one in use stays.
        root = origin.root if isinstance(origin, FileOrigin) else cast("HdfsOrigin", origin).base
        assert not (root / "a" / "b").exists() and (root / "a").is_dir()


async def test_siblings_deleted_at_once_all_succeed_and_leave_nothing(origin: Origin) -> None:
    # On a file system each delete prunes the folders it empties, racing its siblings' own
    # pruning of the same folders: neither may fail for the folder the other removed.
    keys = ["boo/bar", "boo/baz/xyzzy", "cquux/thud", "cquux/bla", "cquux/d/e", "cquux/d/f"]
    for _ in range(10):
        for key in keys:
            await put(origin, key, b"x")
        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(origin.store.delete, key)
        assert raw_keys(origin) == []
    if isinstance(origin, FileOrigin):
        assert [n for n in os.listdir(origin.root) if not n.startswith(".")] == []


# -- copy ------------------------------------------------------------------------------------


async def test_copy_keeps_or_replaces_attributes(origin: Origin) -> None:
    data = os.urandom(100_000)
    src = await put(origin, "src dir/ünï cöde.json", data, ATTRS)
    kept = await origin.store.copy("src dir/ünï cöde.json", "dst dir/kopie 1.json", None)
    info = await origin.store.stat("dst dir/kopie 1.json")
    same_attrs(info, ATTRS)
    assert (info.etag, kept.etag, info.size) == (src.etag, src.etag, len(data))
    assert await read_all(origin.store, "dst dir/kopie 1.json") == data

    new = WriteAttrs(content_type="text/x-new", metadata={"fresh": "yes"})
    await origin.store.copy("src dir/ünï cöde.json", "dst dir/kopie 2", new)
    info = await origin.store.stat("dst dir/kopie 2")
    assert (info.content_type, dict(info.metadata), info.cache_control, info.etag) == (
        "text/x-new",
        {"fresh": "yes"},
        None,
        src.etag,
    )
    assert await read_all(origin.store, "dst dir/kopie 2") == data
    same_attrs(await origin.store.stat("src dir/ünï cöde.json"), ATTRS)


async def test_copy_onto_itself_replaces_attributes_only(origin: Origin) -> None:
    written = await put(origin, "self", b"bytes stay")
    await origin.store.copy("self", "self", WriteAttrs(content_type="text/plain"))
    info = await origin.store.stat("self")
    assert (info.content_type, dict(info.metadata), info.etag) == ("text/plain", {}, written.etag)
    assert await read_all(origin.store, "self") == b"bytes stay"


async def test_copy_if_match_guards_the_source_version(origin: Origin) -> None:
    first = await put(origin, "src", b"one")
    await put(origin, "src", b"two")
    with pytest.raises(VersionChanged):
        await origin.store.copy("src", "dst", None, if_match=first.etag)
    with pytest.raises(ObjectNotFound):
        await origin.store.copy("nothing-here", "dst", None)
    assert raw_keys(origin) == ["src"]
    current = (await origin.store.stat("src")).etag
    await origin.store.copy("src", "dst", None, if_match=current)
    assert await read_all(origin.store, "dst") == b"two"


async def test_s3_copy_beyond_the_single_copy_limit_goes_part_by_part(
    s3_origin: S3Origin, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin = s3_origin
    monkeypatch.setattr(s3_write, "COPY_LIMIT", 6 * MIB)
    monkeypatch.setattr(s3_write, "COPY_PART_SIZE", 5 * MIB)
    data = os.urandom(11 * MIB)
    await put(origin, "large", data, ATTRS)
    copied = await origin.store.copy("large", "large copy", None)
    assert copied.etag.endswith('-3"')
    same_attrs(await origin.store.stat("large copy"), ATTRS)
    assert await read_all(origin.store, "large copy") == data


# -- multipart -------------------------------------------------------------------------------


async def test_multipart_joins_parts_with_the_s3_etag(origin: Origin) -> None:
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), b"!"]
    key = "mp/ünï file.bin"
    upload_id = await origin.store.create_multipart(key, ATTRS)
    infos = [await upload(origin, key, upload_id, n, d) for n, d in enumerate(parts, 1)]
    assert [i.etag for i in infos] == [md5_etag(d) for d in parts]
    parts[1] = os.urandom(5 * MIB)  # uploading a number again replaces that part
    infos[1] = await upload(origin, key, upload_id, 2, parts[1])
    assert infos[1] == PartInfo(2, md5_etag(parts[1]), 5 * MIB)
    with pytest.raises(ObjectNotFound):
        await origin.store.stat(key)  # nothing visible before the completion
    assert (await list_all(origin.store))[0] == [] == (await list_all(origin.store, "", "/"))[0]

    done = await origin.store.complete_multipart(key, upload_id, infos, ATTRS)
    digests = b"".join(hashlib.md5(d).digest() for d in parts)
    expected = f'"{hashlib.md5(digests).hexdigest()}-3"'
    info = await origin.store.stat(key)
    assert (done.etag, info.etag, info.size) == (expected, expected, 10 * MIB + 1)
    same_attrs(info, ATTRS)
    assert (await origin.store.list_page("mp/")).objects[0].etag == expected
    assert await read_all(origin.store, key) == b"".join(parts)
    assert raw_keys(origin) == [key] and open_uploads(origin) == []
    with pytest.raises(UploadNotFound):
        await upload(origin, key, upload_id, 4, b"late")


async def test_complete_honours_if_none_match_and_if_match(origin: Origin) -> None:
    key = "mp/conditional"

    async def complete(data: bytes, **cond: Any) -> str:
        upload_id = await origin.store.create_multipart(key, ATTRS)
        part = await upload(origin, key, upload_id, 1, data)
        try:
            return (
                await origin.store.complete_multipart(key, upload_id, [part], ATTRS, **cond)
            ).etag
        finally:
            await origin.store.abort_multipart(key, upload_id)

    with pytest.raises(PreconditionFailed):
        await complete(b"no key yet", if_match=md5_etag(b"x"))
    first = await complete(b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await complete(b"second", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await complete(b"second", if_match=md5_etag(b"x"))
    assert await read_all(origin.store, key) == b"first"
    await complete(b"third", if_match=first)
    assert await read_all(origin.store, key) == b"third"


async def test_complete_with_a_wrong_part_etag_makes_nothing(origin: Origin) -> None:
    upload_id = await origin.store.create_multipart("mp", ATTRS)
    one = await upload(origin, "mp", upload_id, 1, os.urandom(5 * MIB))
    two = await upload(origin, "mp", upload_id, 2, b"tail")
    wrongs = [
        [one, PartInfo(2, md5_etag(b"something else"), 4)],
        [one, PartInfo(3, two.etag, 4)],
        [one, PartInfo(2, '"not-an-md5"', 4)],
        [two, one],
    ]
    if origin.kind != "s3":  # S3 answers an empty list MalformedXML; the edge refuses it first
        wrongs.append([])
    for wrong in wrongs:
        with pytest.raises(InvalidPart):
            await origin.store.complete_multipart("mp", upload_id, wrong, ATTRS)
    with pytest.raises(ObjectNotFound):
        await origin.store.stat("mp")
    assert raw_keys(origin) == []
    # The upload is still there, and a right part list completes it.
    await origin.store.complete_multipart("mp", upload_id, [one, two], ATTRS)
    assert (await origin.store.stat("mp")).size == 5 * MIB + 4


async def test_abort_drops_the_upload_and_its_parts(origin: Origin) -> None:
    upload_id = await origin.store.create_multipart("mp", ATTRS)
    part = await upload(origin, "mp", upload_id, 1, b"part")
    assert open_uploads(origin) != []
    await origin.store.abort_multipart("mp", upload_id)
    assert raw_keys(origin) == []
    if origin.kind != "azure":  # Azure cannot drop a blob's uncommitted blocks; they expire
        assert open_uploads(origin) == []
    with pytest.raises(UploadNotFound):
        await upload(origin, "mp", upload_id, 2, b"more")
    with pytest.raises(UploadNotFound):
        await origin.store.complete_multipart("mp", upload_id, [part], ATTRS)
    await origin.store.abort_multipart("mp", upload_id)  # again: not an error
    with pytest.raises(ObjectNotFound):
        await origin.store.stat("mp")


async def test_unknown_uploads_are_not_found(origin: Origin) -> None:
    real = await origin.store.create_multipart("mp", ATTRS)
    for fake in ("A" * 32, "0" * 32, "not-hex", "../../x", real[:-2]):
        with pytest.raises(UploadNotFound):
            await upload(origin, "mp", fake, 1, b"x")
        with pytest.raises(UploadNotFound):
            await origin.store.complete_multipart(
                "mp", fake, [PartInfo(1, md5_etag(b"x"), 1)], ATTRS
            )
        await origin.store.abort_multipart("mp", fake)
    if origin.kind != "s3":  # moto takes parts for any key; S3 and the other stores do not
        with pytest.raises(UploadNotFound):
            await upload(origin, "other-key", real, 1, b"x")
        await origin.store.abort_multipart("other-key", real)  # not that key's: kept
        assert len(open_uploads(origin)) == 1
    await origin.store.abort_multipart("mp", real)


async def test_a_part_body_that_raises_keeps_the_previous_part(origin: Origin) -> None:
    upload_id = await origin.store.create_multipart("mp", ATTRS)
    good = await upload(origin, "mp", upload_id, 1, b"good part")
    data = os.urandom(2 * MIB)
    with pytest.raises(ClientGone):
        await origin.store.upload_part("mp", upload_id, 1, failing(data, MIB), len(data))
    with pytest.raises(IncompleteBody):
        await origin.store.upload_part("mp", upload_id, 1, body(b"short"), 9)
    await origin.store.complete_multipart("mp", upload_id, [good], ATTRS)
    assert await read_all(origin.store, "mp") == b"good part"
    assert raw_keys(origin) == ["mp"]


# -- buckets ---------------------------------------------------------------------------------


def bucket_case(o: Origin, tmp_path: Path) -> tuple[str, dict[str, str], Callable[[], bool]]:
    """A fresh container's URI for `o`'s kind, the options to reach it, and whether the
    under-store still holds it."""
    name = f"fresh-{uuid.uuid4().hex[:8]}"
    if isinstance(o, FileOrigin):
        path = tmp_path / "buckets" / name
        return path.as_uri(), {}, path.exists
    if isinstance(o, S3Origin):

        def s3_has() -> bool:
            try:
                o.s3.head_bucket(Bucket=f"{o.bucket}-new")
            except ClientError:
                return False
            return True

        return f"s3://{o.bucket}-new", s3_options(o.proxy.url), s3_has
    if o.kind == "azure":
        from tests.support.azurite import ACCOUNT, sdk_client, store_options

        azurite = cast("AzureOrigin", o).server
        container = sdk_client(azurite).get_container_client(name)
        return f"az://{ACCOUNT}/{name}", store_options(azurite), container.exists
    if o.kind == "gcs":
        gcs = cast("GcsOrigin", o)
        options = {"endpoint": gcs.server.url, "project": "test"}
        return f"gs://{gcs.bucket}-new", options, lambda: gcs_has(gcs, f"{gcs.bucket}-new")
    server = cast("HdfsOrigin", o).server
    return (
        f"{server.url}/buckets/{name}",
        {"user": "tester"},
        (server.root / "buckets" / name).exists,
    )


def gcs_has(o: GcsOrigin, bucket: str) -> bool:
    status = o.http.get(f"/storage/v1/b/{bucket}").status_code
    assert status in (200, 404)
    return status == 200


async def test_create_and_delete_buckets(origin: Origin, tmp_path: Path) -> None:
    uri, options, exists = bucket_case(origin, tmp_path)
    await create_bucket(uri, options)
    assert exists()
    with pytest.raises(ContainerExists):
        await create_bucket(uri, options)
    store = open_store(uri, options)
    try:
        await store.put("k/in it", body(b"x"), 1, WriteAttrs())
        with pytest.raises(ContainerNotEmpty):
            await delete_bucket(uri, options)
        await store.delete("k/in it")
        if origin.kind != "s3":
            # An unfinished upload is no object, though the store keeps it in the container.
            await store.create_multipart("later", WriteAttrs())
        if origin.kind == "hdfs":  # nor is a folder with no file in it
            root = cast("HdfsOrigin", origin).server.root
            (root / uri.split("/", 3)[3] / "empty" / "dir").mkdir(parents=True)
        await delete_bucket(uri, options)
    finally:
        await store.close()
    assert not exists()
    with pytest.raises(ContainerNotFound):
        await delete_bucket(uri, options)


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/with-prefix",
        "file:///",
        "az://devstoreaccount1/container/with-prefix",
        "gs://bucket/with-prefix",
        "hdfs://127.0.0.1:9870/",
    ],
)
async def test_bucket_uris_name_whole_containers(uri: str) -> None:
    with pytest.raises(ValueError):
        await create_bucket(uri, {})


# -- file store only -------------------------------------------------------------------------


async def test_file_keys_that_cannot_be_files_are_refused(tmp_path: Path) -> None:
    o = FileOrigin(tmp_path)
    await put(o, "a/b", b"x")
    for key in ("a//b", "../escape", ".s3gw-uploads/x", "x/.k.s3gw-1.tmp", "/", "a/.s3gw-self"):
        with pytest.raises(UnsupportedKey):
            await put(o, key, b"y")
    assert raw_keys(o) == ["a/b"]  # (`a`, `a/b/c` and `a/`: test_store_markers)


async def test_file_attributes_fall_back_when_the_file_changes_behind_us(tmp_path: Path) -> None:
    o = FileOrigin(tmp_path)
    await put(o, "notes.txt", b"written by the gateway", WriteAttrs(content_type="x/custom"))
    assert (await o.store.stat("notes.txt")).content_type == "x/custom"
    (tmp_path / "notes.txt").write_bytes(b"rewritten in place by someone else")
    info = await o.store.stat("notes.txt")
    assert "-" in info.etag and info.content_type == "text/plain"  # synthetic, guessed
    (listed,) = (await o.store.list_page()).objects
    assert listed.etag == info.etag
    assert await read_all(o.store, "notes.txt", if_match=info.etag) == (
        b"rewritten in place by someone else"
    )


async def test_file_read_if_match_takes_the_recorded_etag(tmp_path: Path) -> None:
    o = FileOrigin(tmp_path)
    written = await put(o, "k", b"data")
    assert await read_all(o.store, "k", if_match=written.etag) == b"data"
    with pytest.raises(VersionChanged):
        await read_all(o.store, "k", if_match='"0-0"')


async def test_file_internals_never_show(tmp_path: Path) -> None:
    o = FileOrigin(tmp_path)
    await o.store.create_multipart("k", ATTRS)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".k.s3gw-abc.tmp").write_bytes(b"left by a crash")
    assert await list_all(o.store) == ([], 1)
    assert await list_all(o.store, "", "/") == ([], 1)
    for key in (".s3gw-uploads", "d/.k.s3gw-abc.tmp"):
        with pytest.raises(ObjectNotFound):
            await o.store.stat(key)


async def test_file_store_without_xattrs_falls_back_to_synthetic_etags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOTSUP, "Operation not supported")

    monkeypatch.setattr(os, "setxattr", refuse)
    o = FileOrigin(tmp_path)
    written = await put(o, "plain.txt", b"no xattrs here", ATTRS)
    info = await o.store.stat("plain.txt")
    assert written.etag == info.etag and "-" in info.etag  # what stat will keep saying
    assert (info.content_type, dict(info.metadata)) == ("text/plain", {})
    upload_id = await o.store.create_multipart("mp", ATTRS)
    one = await upload(o, "mp", upload_id, 1, b"a" * (5 * MIB))
    two = await upload(o, "mp", upload_id, 2, b"b")
    with pytest.raises(InvalidPart):  # the part's MD5 is taken again, and still checked
        await o.store.complete_multipart("mp", upload_id, [one, PartInfo(2, one.etag, 1)], ATTRS)
    await o.store.complete_multipart("mp", upload_id, [one, two], ATTRS)
    assert await read_all(o.store, "mp") == b"a" * (5 * MIB) + b"b"


# -- S3 store only: what reaches the origin --------------------------------------------------


async def test_s3_put_is_one_streamed_request_or_a_multipart_upload(s3_origin: S3Origin) -> None:
    proxy = s3_origin.proxy
    await put(s3_origin, "small", os.urandom(3 * MIB))
    assert [(r.method, r.query) for r in proxy.requests] == [("PUT", "")]
    proxy.reset()
    await put(s3_origin, "large", os.urandom(20 * MIB))
    calls = [(r.method, sorted(parse_qs(r.query, True))) for r in proxy.requests]
    part = ("PUT", ["partNumber", "uploadId"])
    assert calls == [("POST", ["uploads"]), part, part, part, ("POST", ["uploadId"])]
    head = s3_origin.s3.head_object(Bucket=s3_origin.bucket, Key=f"{MOUNT_PREFIX}/large")
    assert head["ContentLength"] == 20 * MIB and head["ContentType"] == ATTRS.content_type
