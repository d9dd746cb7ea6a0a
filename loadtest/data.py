"""Test data: objects put into the origin (and the same bytes on local disk), presigned URLs.

URLs are presigned ahead of the load: botocore takes ~50-90 µs to sign a request, more than
the gateway takes to answer a hit, so signing during the load would measure the client.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from loadtest.servers import (
    ACCESS_KEY,
    BUCKET,
    ORIGIN_BUCKET,
    ORIGIN_KEY,
    ORIGIN_PREFIX,
    ORIGIN_SECRET,
    SECRET_KEY,
)

_SEED_THREADS = 16


def s3_client(endpoint: str, access_key: str, secret_key: str, pool: int = 32) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            retries={"max_attempts": 5, "mode": "standard"},
            max_pool_connections=pool,
            # moto answers no checksums of its own; keep the requests as plain as a loader's.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def origin_client(endpoint: str) -> Any:
    return s3_client(endpoint, ORIGIN_KEY, ORIGIN_SECRET)


def gateway_client(endpoint: str) -> Any:
    return s3_client(endpoint, ACCESS_KEY, SECRET_KEY)


def ensure_bucket(client: Any) -> None:
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if ORIGIN_BUCKET not in existing:
        client.create_bucket(Bucket=ORIGIN_BUCKET)


def payload(index: int, size: int, block: bytes) -> bytes:
    """Distinct bytes per object (its index up front) without generating each one anew."""
    head = b"%016d" % index
    return (head + block[: max(size - len(head), 0)])[:size]


def random_block(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


def seed_objects(
    seed_url: str,
    keys: Sequence[str],
    size: int,
    local_root: Path | None = None,
    progress: Callable[[str], None] = print,
) -> None:
    """Put `keys` (of `size` bytes each) into the origin; mirror them under `local_root`."""
    client = origin_client(seed_url)
    ensure_bucket(client)
    block = random_block(size)

    def put(item: tuple[int, str]) -> None:
        i, key = item
        body = payload(i, size, block)
        client.put_object(Bucket=ORIGIN_BUCKET, Key=f"{ORIGIN_PREFIX}/{key}", Body=body)
        if local_root is not None:
            path = local_root / BUCKET / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)

    with ThreadPoolExecutor(_SEED_THREADS) as pool:
        for n, _ in enumerate(pool.map(put, enumerate(keys)), 1):
            if n % 5000 == 0:
                progress(f"  seeded {n}/{len(keys)}")


def seed_file(seed_url: str, key: str, path: Path) -> None:
    """Upload one large local file (moto holds it in a temp file). One PUT up to 4 GiB: moto
    takes a multipart upload about twice as long (it joins the parts in memory)."""
    client = origin_client(seed_url)
    ensure_bucket(client)
    config = TransferConfig(
        multipart_threshold=4 << 30, multipart_chunksize=256 << 20, max_concurrency=2
    )
    client.upload_file(str(path), ORIGIN_BUCKET, f"{ORIGIN_PREFIX}/{key}", Config=config)


def seed_large(
    seed_url: str, key: str, size: int, local_root: Path, progress: Callable[[str], None] = print
) -> Path:
    """One large object in the origin, and the same bytes at local_root/<bucket>/<key> (for
    nginx, or a direct read); returns the local file."""
    path = local_root / BUCKET / key
    t0 = time.monotonic()
    write_random_file(path, size)
    t1 = time.monotonic()
    seed_file(seed_url, key, path)
    progress(f"  {size >> 20} MiB written in {t1 - t0:.1f} s, put in {time.monotonic() - t1:.1f} s")
    return path


def write_random_file(path: Path, size: int) -> None:
    """`size` bytes that differ in every MiB: 64 MiB of random bytes, repeated, with each
    MiB's offset written over its first 16 bytes (random bytes cost ~8 s a GiB here)."""
    block = random_block(64 << 20, seed=11)
    mib = 1 << 20
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for offset in range(0, size, mib):
            start = offset % len(block)
            chunk = b"%016d" % offset + block[start + 16 : start + mib]
            f.write(chunk[: size - offset])


def random_ranges(size: int, span: int, count: int, seed: int) -> list[str]:
    """`count` Range header values of `span` bytes at random, unaligned offsets in `size`."""
    rng = random.Random(seed)
    starts = [rng.randrange(0, size - span + 1) for _ in range(count)]
    return [f"bytes={s}-{s + span - 1}" for s in starts]


def presign(client: Any, bucket: str, key: str, expires: int = 6 * 3600) -> str:
    """The request target (path and query) of a presigned GET."""
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires
    )
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def gateway_targets(gateway_url: str, keys: Sequence[str]) -> list[str]:
    client = gateway_client(gateway_url)
    return [presign(client, BUCKET, k) for k in keys]


def origin_targets(origin_url: str, keys: Sequence[str]) -> list[str]:
    client = origin_client(origin_url)
    return [presign(client, ORIGIN_BUCKET, f"{ORIGIN_PREFIX}/{k}") for k in keys]
