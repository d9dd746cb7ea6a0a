"""Test data: objects put into the origin (and the same bytes on local disk), presigned URLs.

URLs are presigned ahead of the load: botocore takes ~50-90 µs to sign a request, more than
the gateway takes to answer a hit, so signing during the load would measure the client.
"""

from __future__ import annotations

import random
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
    """Upload one large local file in 64 MiB parts (moto holds it in a temp file)."""
    client = origin_client(seed_url)
    ensure_bucket(client)
    chunk = 64 * 1024 * 1024
    config = TransferConfig(multipart_threshold=chunk, multipart_chunksize=chunk, max_concurrency=4)
    client.upload_file(str(path), ORIGIN_BUCKET, f"{ORIGIN_PREFIX}/{key}", Config=config)


def write_random_file(path: Path, size: int) -> None:
    rng = random.Random(11)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 8 * 1024 * 1024)
            f.write(rng.randbytes(n))
            left -= n


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
