"""The S3 store's lean GET (gateway/stores/s3_get.py) against real servers: it is signed as
a strict SigV4 verifier wants (this gateway's own, in front of a file mount), it reads what
botocore reads for every header the service uses, and it leaves to botocore what it does not
handle itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.stores import ObjectNotFound, StoreAccessDenied, open_store
from gateway.stores.s3 import S3Store
from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "files"
    files.mkdir()
    node = start_gateway(module_dir / "node")
    node.cli("mount", "add", "plain", files.as_uri())
    eventually(lambda: "plain" in node.buckets())
    yield node
    node.stop()


@pytest.fixture(scope="module")
def bucket(origin_s3: Any) -> str:
    origin_s3.create_bucket(Bucket="origin-fast-get")
    return "origin-fast-get"


async def read_all(store: S3Store, key: str, start: int = 0, end: int | None = None) -> bytes:
    return b"".join([chunk async for chunk in store.read(key, start, end)])


@pytest.fixture
async def through_gateway(node: GatewayNode) -> AsyncIterator[S3Store]:
    opts = {"endpoint_url": node.url, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY}
    store = open_store("s3://plain/deep", opts)
    assert isinstance(store, S3Store)
    yield store
    await store.close()


async def test_a_strict_sigv4_verifier_accepts_the_lean_get(
    node: GatewayNode, through_gateway: S3Store
) -> None:
    """The gateway checks every signature; a 403 would send the read to botocore unseen, so
    the lean GET is asked directly here."""
    await through_gateway.prepare()
    fast = through_gateway._fast
    assert fast is not None
    for odd in ("!*'() [].txt", "sub/#1 & 2=3?.bin"):
        node.client().put_object(Bucket="plain", Key=f"deep/{odd}", Body=odd.encode())
        answered = await fast.get(f"deep/{odd}", {})
        assert answered is not None, f"the lean GET of {odd!r} was refused"
        assert await answered[1].read() == odd.encode()
    key = "odd keys/ü ~+=&?#%.bin"
    node.client().put_object(Bucket="plain", Key=f"deep/{key}", Body=b"0123456789" * 100)
    answered = await fast.get(f"deep/{key}", {"Range": "bytes=10-19"})
    assert answered is not None, "the lean GET was refused"
    found, response = answered
    assert response.status == 206 and await response.read() == b"0123456789"
    assert found["ContentRange"] == "bytes 10-19/1000"
    assert await read_all(through_gateway, key, 990) == b"0123456789"
    info, body = await through_gateway.open(key, 64)
    assert info.size == 1000 and b"".join([c async for c in body]) == (b"0123456789" * 7)[:64]


async def test_missing_and_changed_are_answered_without_asking_twice(
    node: GatewayNode, through_gateway: S3Store
) -> None:
    node.client().put_object(Bucket="plain", Key="deep/there", Body=b"x")
    with pytest.raises(ObjectNotFound):
        await read_all(through_gateway, "not-there")
    fast = through_gateway._fast
    assert fast is not None
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as missing:
        await fast.get("deep/not-there", {})
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    with pytest.raises(ClientError) as changed:
        await fast.get("deep/there", {"If-Match": '"not-the-etag"'})
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert changed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412


async def test_a_wrong_secret_goes_to_botocore_and_is_denied(node: GatewayNode) -> None:
    opts = {"endpoint_url": node.url, "access_key": ACCESS_KEY, "secret_key": "wrong" * 8}
    store = open_store("s3://plain/deep", opts)
    assert isinstance(store, S3Store)
    try:
        with pytest.raises(StoreAccessDenied):
            await read_all(store, "anything")
    finally:
        await store.close()


async def test_the_lean_get_reads_what_botocore_reads(
    origin: CountingProxy, origin_s3: Any, bucket: str
) -> None:
    """Every field the service takes from a GET, through both paths, from moto."""
    expires = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    origin_s3.put_object(
        Bucket=bucket,
        Key="fields/obj",
        Body=b"abc" * 1000,
        ContentType="text/csv; charset=utf-8",
        ContentEncoding="identity",
        ContentDisposition='attachment; filename="a b.csv"',
        ContentLanguage="de",
        CacheControl="max-age=60",
        Expires=expires,
        Metadata={"Owner": "zoe", "purpose": "a =b;c"},
        ChecksumAlgorithm="CRC32",
    )
    store = open_store(
        f"s3://{bucket}",
        {"endpoint_url": origin.url, "access_key": "origin-ak", "secret_key": "origin-sk"},
    )
    assert isinstance(store, S3Store)
    try:
        client = await store._s3()
        assert store._fast is not None
        # Keys whose URL a normalizing client would change: read as they are, not as
        # "fields/b" or "fields/x/y".
        for odd in ("fields/a/./x/../b", "fields/x//y", "fields/%41"):
            origin_s3.put_object(Bucket=bucket, Key=odd, Body=odd.encode())
            answered = await store._fast.get(odd, {})
            assert answered is not None
            assert await answered[1].read() == odd.encode()
        for headers, args in (({}, {}), ({"Range": "bytes=5-99"}, {"Range": "bytes=5-99"})):
            answered = await store._fast.get("fields/obj", headers)
            assert answered is not None
            fast, response = answered
            response.release()
            slow = await client.get_object(Bucket=bucket, Key="fields/obj", **args)
            slow["Body"].close()
            assert store._info("fields/obj", fast) == store._info("fields/obj", slow)
            assert fast.get("ContentRange") == slow.get("ContentRange")
    finally:
        await store.close()


async def test_a_lean_get_refused_where_botocore_succeeds_is_given_up(
    node: GatewayNode, through_gateway: S3Store
) -> None:
    """Say a proxy rewrites what the lean GET signed: its 403 while botocore's request
    succeeds means every read would be asked twice; the store stops using it."""
    from botocore.credentials import Credentials

    from gateway.stores.s3.fast_get import GetSigner

    node.client().put_object(Bucket="plain", Key="deep/given-up", Body=b"ok")
    await through_gateway.prepare()
    fast = through_gateway._fast
    assert fast is not None
    fast._signer = GetSigner(Credentials(ACCESS_KEY, "not-what-was-signed"), "us-east-1", fast.base)
    assert await read_all(through_gateway, "given-up") == b"ok"
    assert through_gateway._fast is None
    assert await read_all(through_gateway, "given-up") == b"ok"
