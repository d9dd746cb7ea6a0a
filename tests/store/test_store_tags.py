"""The tags half of the store contract: S3's object tags, kept by every under-store in its own
way (S3's object tagging, Azure's blob index tags, GCS custom metadata under a reserved
prefix, the meta xattr of file and HDFS), on each store's real server."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from gateway.stores import ObjectNotFound, WriteAttrs
from tests.support.stores import Origin, read_all
from tests.support.writes import ATTRS, MIB, md5_etag, put, same_attrs, upload

pytestmark = pytest.mark.anyio

TAGS = {"team": "vision", "stage": "raw data", "path": "a/b:c=d+e-f.g_h"}


async def test_tags_round_trip_without_touching_the_object(origin: Origin) -> None:
    data = os.urandom(1000)
    await put(origin, "t/plain.bin", data)
    assert await origin.store.get_tags("t/plain.bin") == {}
    before = await origin.store.stat("t/plain.bin")

    await origin.store.put_tags("t/plain.bin", TAGS)
    assert await origin.store.get_tags("t/plain.bin") == TAGS
    after = await origin.store.stat("t/plain.bin")
    assert (after.etag, after.size, after.tag_count) == (before.etag, len(data), 3)
    same_attrs(after, ATTRS)
    assert await read_all(origin.store, "t/plain.bin") == data

    await origin.store.put_tags("t/plain.bin", {"only": "one"})  # replaces, not merges
    assert await origin.store.get_tags("t/plain.bin") == {"only": "one"}
    await origin.store.put_tags("t/plain.bin", {})
    assert await origin.store.get_tags("t/plain.bin") == {}
    assert (await origin.store.stat("t/plain.bin")).tag_count == 0


async def test_tags_of_a_missing_key_are_not_found(origin: Origin) -> None:
    with pytest.raises(ObjectNotFound):
        await origin.store.get_tags("t/none")
    with pytest.raises(ObjectNotFound):
        await origin.store.put_tags("t/none", TAGS)


async def test_tags_written_with_the_object_and_gone_with_an_overwrite(origin: Origin) -> None:
    await put(origin, "t/w", b"one", replace(ATTRS, tags=TAGS))
    assert await origin.store.get_tags("t/w") == TAGS
    assert (await origin.store.stat("t/w")).tag_count == 3
    await put(origin, "t/w", b"two")
    assert await origin.store.get_tags("t/w") == {}


async def test_copy_keeps_or_replaces_tags(origin: Origin) -> None:
    src = await put(origin, "t/src", b"source bytes", replace(ATTRS, tags=TAGS))
    kept = await origin.store.copy("t/src", "t/kept", None)
    assert kept.etag == src.etag
    assert await origin.store.get_tags("t/kept") == TAGS
    await origin.store.copy("t/src", "t/new", WriteAttrs(tags={"new": "1"}))
    assert await origin.store.get_tags("t/new") == {"new": "1"}
    await origin.store.copy("t/src", "t/none", WriteAttrs(content_type="text/plain"))
    assert await origin.store.get_tags("t/none") == {}
    assert await origin.store.get_tags("t/src") == TAGS


async def test_multipart_keeps_the_tags_of_its_creation(origin: Origin) -> None:
    attrs = replace(ATTRS, tags={"mp": "yes"})
    upload_id = await origin.store.create_multipart("t/mp", attrs)
    parts = [await upload(origin, "t/mp", upload_id, 1, b"x" * (5 * MIB))]
    parts.append(await upload(origin, "t/mp", upload_id, 2, b"end"))
    await origin.store.complete_multipart("t/mp", upload_id, parts, attrs)
    assert await origin.store.get_tags("t/mp") == {"mp": "yes"}
    info = await origin.store.stat("t/mp")
    assert info.tag_count == 1 and info.etag != md5_etag(b"")


@pytest.mark.parametrize("origin", ["file", "s3", "hdfs"], indirect=True)
async def test_part_sizes_of_a_multipart_object(origin: Origin) -> None:
    """partNumber's ground: the stores that can tell the sizes of an object's parts."""
    sizes = [5 * MIB, 5 * MIB + 3, 10]
    upload_id = await origin.store.create_multipart("t/parts", ATTRS)
    parts = [
        await upload(origin, "t/parts", upload_id, n, os.urandom(size))
        for n, size in enumerate(sizes, 1)
    ]
    done = await origin.store.complete_multipart("t/parts", upload_id, parts, ATTRS)
    assert await origin.store.part_sizes("t/parts", done.etag) == sizes
    await put(origin, "t/single", b"x")
    single = await origin.store.stat("t/single")
    if origin.kind != "s3":  # an S3 origin says a single PUT is one part
        assert await origin.store.part_sizes("t/single", single.etag) is None
