"""Every read of the S3 store (GET, HEAD, ranged GET, a version's GET and HEAD, and the errors
of each) goes through its one transport: one persistent connection to the origin carries them
all in turn, and a failure of each is the same typed error, whatever the request's kind."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest

from gateway.stores import (
    IsDeleteMarker,
    NoSuchVersion,
    ObjectNotFound,
    VersionChanged,
    open_store,
)
from gateway.stores.s3 import S3Store
from tests.support.origin import CountingProxy

pytestmark = pytest.mark.anyio

BUCKET = "origin-one-transport"


@pytest.fixture(scope="module")
def versioned(origin_s3: Any) -> str:
    origin_s3.create_bucket(Bucket=BUCKET)
    origin_s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    return BUCKET


@pytest.fixture
async def store(origin: CountingProxy, versioned: str) -> AsyncIterator[S3Store]:
    opts = {"endpoint_url": origin.url, "access_key": "ak", "secret_key": "sk"}
    made = open_store(f"s3://{versioned}", opts)
    assert isinstance(made, S3Store)
    await made.prepare()
    yield made
    await made.close()


async def joined(chunks: AsyncGenerator[bytes, None]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


def connections(origin: CountingProxy, key: str) -> set[Any]:
    """The connections (client addresses) the origin saw requests for `key` on."""
    return {r.peer for r in origin.requests if r.path.endswith("/" + key)}


async def test_get_head_ranged_and_versioned_reads_share_one_connection(
    store: S3Store, origin: CountingProxy, origin_s3: Any
) -> None:
    key = "one-pool/object"
    old = origin_s3.put_object(Bucket=BUCKET, Key=key, Body=b"old bytes")["VersionId"]
    origin_s3.put_object(Bucket=BUCKET, Key=key, Body=b"0123456789")
    before = len(origin.requests)
    assert await joined(store.read(key)) == b"0123456789"
    assert (await store.stat(key)).size == 10
    assert await joined(store.read(key, 2, 5)) == b"234"
    assert await joined(store.read_version(key, old, 0, 3)) == b"old"
    assert (await store.stat_version(key, old)).size == 9
    asked = [(r.method, r.range, "versionId" in r.query) for r in origin.requests[before:]]
    assert asked == [
        ("GET", None, False),
        ("HEAD", None, False),
        ("GET", "bytes=2-4", False),
        ("GET", "bytes=0-2", True),
        ("HEAD", None, True),
    ]
    assert len(connections(origin, key)) == 1, "each kind of read on a connection of its own"


async def test_each_kind_of_read_fails_with_the_same_typed_error_on_the_same_connection(
    store: S3Store, origin: CountingProxy, origin_s3: Any
) -> None:
    missing = "one-pool/missing"
    for read in (
        lambda: joined(store.read(missing)),
        lambda: store.stat(missing),
        lambda: joined(store.read(missing, 2, 5)),
    ):
        with pytest.raises(ObjectNotFound) as raised:
            await read()
        assert type(raised.value) is ObjectNotFound
    key = "one-pool/versions"
    version = origin_s3.put_object(Bucket=BUCKET, Key=key, Body=b"abc")["VersionId"]
    gone = "one-pool/no-such-version-id"
    with pytest.raises(NoSuchVersion):
        await joined(store.read_version(key, gone, 0, 3))
    with pytest.raises(NoSuchVersion):
        await store.stat_version(key, gone)
    for read in (
        lambda: joined(store.read(key, if_match='"not-its-etag"')),
        lambda: joined(store.read(key, 1, 2, if_match='"not-its-etag"')),
        lambda: joined(store.read_version(key, version, 0, 3, if_match='"not-its-etag"')),
    ):
        with pytest.raises(VersionChanged):
            await read()
    marker = origin_s3.delete_object(Bucket=BUCKET, Key=key)["VersionId"]
    with pytest.raises(ObjectNotFound):
        await joined(store.read(key))
    with pytest.raises(ObjectNotFound):
        await store.stat(key)
    # (A GET of a marker's version S3 answers 405 too; moto 404 NoSuchVersion.)
    with pytest.raises(IsDeleteMarker):
        await store.stat_version(key, marker)
    assert len(connections(origin, missing) | connections(origin, key)) == 1
