"""What each kind of read of the S3 store costs the gateway's process in CPU, against the same
request through aiobotocore in the same run (the baseline): a HEAD, a ranged GET, a version's
HEAD and a version's ranged GET, `--reads` of each in turn on one event loop.

    python -m loadtest.storereads [--reads 300] [--size 100KiB] [--range 4096]

The origin is loadtest.moto_origin on loopback, one versioned bucket, one object; the store
(`S3Store`, static keys) and the baseline's aiobotocore client run in this process, so CPU
per read is this process's (time.process_time over the reads, every thread), the origin's
apart. Each kind is warmed up with 30 reads first. A ratio under 1 is the store cheaper.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from gateway.stores import open_store
from gateway.stores.s3 import S3Store
from loadtest.procs import Cleanup, free_port, wait_http
from loadtest.sizes import parse_size

_BUCKET = "storereads"
_KEY = "object"
_AUTH = {"aws_access_key_id": "ak", "aws_secret_access_key": "sk"}

Read = Callable[[], Awaitable[None]]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.storereads", description=__doc__)
    p.add_argument("--reads", type=int, default=300, help="reads of each kind measured (300)")
    p.add_argument("--size", default="100KiB", help="the object's size (100KiB)")
    p.add_argument("--range", type=int, default=4096, help="bytes of each ranged GET (4096)")
    args = p.parse_args(argv)
    cleanup = Cleanup()
    try:
        work = Path(tempfile.mkdtemp(prefix="storereads-"))
        cleanup.push(f"remove {work}", lambda: shutil.rmtree(work, ignore_errors=True))
        url = _start_origin(cleanup, work)
        s3 = boto3.client(
            "s3", endpoint_url=url, region_name="us-east-1", **_AUTH,
            config=Config(s3={"addressing_style": "path"}),
        )  # fmt: skip
        s3.create_bucket(Bucket=_BUCKET)
        s3.put_bucket_versioning(Bucket=_BUCKET, VersioningConfiguration={"Status": "Enabled"})
        body = b"x" * parse_size(args.size)
        version = s3.put_object(Bucket=_BUCKET, Key=_KEY, Body=body)["VersionId"]
        asyncio.run(_measure(url, version, args.reads, args.range))
    finally:
        cleanup.run()


def _start_origin(cleanup: Cleanup, work: Path) -> str:
    port = free_port()
    cmd = [sys.executable, "-m", "loadtest.moto_origin", "-H", "127.0.0.1", "-p", str(port)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = cleanup.spawn("moto", cmd, work / "moto.log", env)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/moto-api/", proc, timeout=60)
    return url


async def _measure(url: str, version: str, reads: int, length: int) -> None:
    store = open_store(
        f"s3://{_BUCKET}", {"endpoint_url": url, "access_key": "ak", "secret_key": "sk"}
    )
    assert isinstance(store, S3Store)
    await store.prepare()
    client = await store._s3()  # aiobotocore's, made as the store makes it: the baseline
    where = {"Bucket": _BUCKET, "Key": _KEY}
    ranged = f"bytes=0-{length - 1}"

    async def drained(chunks: Any) -> None:
        async for _ in chunks:
            pass

    async def botocore_get(**args: Any) -> None:
        r = await client.get_object(**where, Range=ranged, **args)
        async with r["Body"] as body:
            await body.read()

    kinds: list[tuple[str, Read, Read]] = [
        ("HEAD", lambda: store.stat(_KEY), lambda: client.head_object(**where)),
        (
            "ranged GET",
            lambda: drained(store.read(_KEY, 0, length)),
            lambda: botocore_get(),
        ),
        (
            "version's HEAD",
            lambda: store.stat_version(_KEY, version),
            lambda: client.head_object(**where, VersionId=version),
        ),
        (
            "version's ranged GET",
            lambda: drained(store.read_version(_KEY, version, 0, length)),
            lambda: botocore_get(VersionId=version),
        ),
    ]
    print(f"CPU per read of this process, {reads} reads of each, moto on loopback")
    print(f"{'read':<22} {'store us':>9} {'aiobotocore us':>15} {'ratio':>6}")
    try:
        for name, ours, theirs in kinds:
            mine, base = await _cpu(ours, reads), await _cpu(theirs, reads)
            print(f"{name:<22} {mine:>9.0f} {base:>15.0f} {mine / base:>6.2f}")
    finally:
        await store.close()


async def _cpu(read: Read, reads: int) -> float:
    """Microseconds of this process's CPU per `read`, after 30 to warm up."""
    for _ in range(30):
        await read()
    start = time.process_time()
    for _ in range(reads):
        await read()
    return (time.process_time() - start) / reads * 1e6


if __name__ == "__main__":
    main()
