"""The S3 store's transport (gateway/stores/s3/transport.py) against real servers: its GETs
and HEADs are signed as a strict SigV4 verifier wants (this gateway's own, in front of a file
mount), it reads what botocore reads for every header the service uses, and its failures are
the store's typed errors."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gateway.stores import ObjectNotFound, StoreAccessDenied, VersionChanged, open_store
from gateway.stores.s3 import S3Store
from gateway.stores.s3.transport import Reply, Request
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


async def handled(store: S3Store, request: Request) -> Reply:
    """The transport's answer to `request`, asked directly."""
    await store.prepare()
    transport = store._transport
    assert transport is not None
    return await transport.handle(request)


async def body(reply: Reply) -> bytes:
    return b"".join([chunk async for chunk in reply.body])


@pytest.fixture
async def through_gateway(node: GatewayNode) -> AsyncIterator[S3Store]:
    opts = {"endpoint_url": node.url, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY}
    store = open_store("s3://plain/deep", opts)
    assert isinstance(store, S3Store)
    yield store
    await store.close()


async def test_a_strict_sigv4_verifier_accepts_the_transports_reads(
    node: GatewayNode, through_gateway: S3Store
) -> None:
    """The gateway checks every signature: GETs, ranged GETs and HEADs of odd keys pass."""
    for odd in ("!*'() [].txt", "sub/#1 & 2=3?.bin"):
        node.client().put_object(Bucket="plain", Key=f"deep/{odd}", Body=odd.encode())
        assert await body(await handled(through_gateway, Request("GET", odd))) == odd.encode()
        head = await handled(through_gateway, Request("HEAD", odd))
        assert head.fields["ContentLength"] == len(odd.encode())
    key = "odd keys/ü ~+=&?#%.bin"
    node.client().put_object(Bucket="plain", Key=f"deep/{key}", Body=b"0123456789" * 100)
    reply = await handled(through_gateway, Request("GET", key, (), (("Range", "bytes=10-19"),)))
    assert await body(reply) == b"0123456789"
    assert reply.fields["ContentRange"] == "bytes 10-19/1000"
    assert await read_all(through_gateway, key, 990) == b"0123456789"
    info, chunks = await through_gateway.open(key, 64)
    assert info.size == 1000 and b"".join([c async for c in chunks]) == (b"0123456789" * 7)[:64]
    assert (await through_gateway.stat(key)).size == 1000


async def test_missing_and_changed_are_typed_errors_of_the_transport(
    node: GatewayNode, through_gateway: S3Store
) -> None:
    node.client().put_object(Bucket="plain", Key="deep/there", Body=b"x")
    with pytest.raises(ObjectNotFound):
        await read_all(through_gateway, "not-there")
    for method in ("GET", "HEAD"):
        with pytest.raises(ObjectNotFound):
            await handled(through_gateway, Request(method, "not-there"))
        with pytest.raises(VersionChanged):
            await handled(through_gateway, Request(method, "there", (), (("If-Match", '"no"'),)))


async def test_a_wrong_secret_is_denied(node: GatewayNode) -> None:
    opts = {"endpoint_url": node.url, "access_key": ACCESS_KEY, "secret_key": "wrong" * 8}
    store = open_store("s3://plain/deep", opts)
    assert isinstance(store, S3Store)
    try:
        with pytest.raises(StoreAccessDenied):
            await read_all(store, "anything")
        with pytest.raises(StoreAccessDenied):
            await store.stat("anything")
    finally:
        await store.close()


async def test_the_transport_reads_what_botocore_reads(
    origin: CountingProxy, origin_s3: Any, bucket: str
) -> None:
    """Every field the service takes from a GET or a HEAD, through the transport and through
    botocore, from moto."""
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
        # Keys whose URL a normalizing client would change: read as they are, not as
        # "fields/b" or "fields/x/y".
        for odd in ("fields/a/./x/../b", "fields/x//y", "fields/%41"):
            origin_s3.put_object(Bucket=bucket, Key=odd, Body=odd.encode())
            assert await body(await handled(store, Request("GET", odd))) == odd.encode()
        for headers, args in (((), {}), ((("Range", "bytes=5-99"),), {"Range": "bytes=5-99"})):
            reply = await handled(store, Request("GET", "fields/obj", (), headers))
            await reply.body.aclose()
            slow = await client.get_object(Bucket=bucket, Key="fields/obj", **args)
            slow["Body"].close()
            assert store._info("fields/obj", reply.fields) == store._info("fields/obj", slow)
            assert reply.fields.get("ContentRange") == slow.get("ContentRange")
        head = await handled(store, Request("HEAD", "fields/obj"))
        slow = await client.head_object(Bucket=bucket, Key="fields/obj")
        assert store._info("fields/obj", head.fields) == store._info("fields/obj", slow)
    finally:
        await store.close()


CREDENTIALS_PROCESS = """\
import json, pathlib, sys
from datetime import datetime, timedelta, timezone
secret = pathlib.Path(sys.argv[1]).read_text().strip()
# Expiring within botocore's mandatory refresh window: asked again for every request.
expires = datetime.now(timezone.utc) + timedelta(minutes=5)
print(json.dumps({"Version": 1, "AccessKeyId": sys.argv[2], "SecretAccessKey": secret,
                  "Expiration": expires.isoformat()}))
"""


def test_reads_sign_with_the_credential_chains_keys_as_they_are_refreshed(
    node: GatewayNode, module_dir: Path
) -> None:
    """A mount without keys reads with the default chain's credentials (a credential_process
    here), asked again as botocore asks: a secret changed is used from the next read on."""
    folder = module_dir / "chain"
    folder.mkdir()
    secret = folder / "secret"
    secret.write_text(SECRET_KEY)
    script = folder / "creds.py"
    script.write_text(CREDENTIALS_PROCESS)
    config = folder / "config"
    config.write_text(
        f"[default]\ncredential_process = {sys.executable} {script} {secret} {ACCESS_KEY}\n"
    )
    env = {"AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    env |= {name: "" for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    reader = start_gateway(folder / "node", env=env)
    try:
        reader.cli("mount", "add", "chained", "s3://plain/deep", "-o", f"endpoint_url={node.url}")
        eventually(lambda: "chained" in reader.buckets())
        for n in range(3):
            node.client().put_object(Bucket="plain", Key=f"deep/chain-{n}", Body=b"%d" % n)
        client = reader.client()
        assert client.get_object(Bucket="chained", Key="chain-0")["Body"].read() == b"0"
        secret.write_text("not-the-secret")
        with pytest.raises(ClientError) as refused:
            client.get_object(Bucket="chained", Key="chain-1")
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        secret.write_text(SECRET_KEY)
        assert client.get_object(Bucket="chained", Key="chain-2")["Body"].read() == b"2"
    finally:
        reader.stop()
