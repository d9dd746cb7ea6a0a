"""Test data: objects put into the origin (and the same bytes on local disk), presigned URLs.

URLs are presigned ahead of the load: botocore takes ~50-90 µs to sign a request, more than
the gateway takes to answer a hit, so signing during the load would measure the client.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
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
_SEED_BATCH, _SEED_BATCH_BYTES = 5000, 512 << 20  # per request to the seeding endpoint
_BLOCK_SEED = 7
_SEED_PATH = "/_loadtest/seed"  # loadtest.moto_origin.SEED_PATH (not imported: moto-free)


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


def origin_seeds_in_process(seed_url: str) -> bool:
    """Whether the origin is loadtest.moto_origin with its seeding endpoint (not --stock)."""
    try:
        with urllib.request.urlopen(seed_url + _SEED_PATH, timeout=10) as resp:
            return bool(resp.status == 200 and json.load(resp).get("loadtest_seed") == 1)
    except (OSError, ValueError, AttributeError):
        return False


def seed_objects(
    seed_url: str,
    keys: Sequence[str],
    size: int,
    local_root: Path | None = None,
    progress: Callable[[str], None] = print,
    *,
    over_http: bool | None = None,
) -> None:
    """Put `keys` (of `size` bytes each) into the origin; mirror them under `local_root`.

    Object i holds `payload(i, size, random_block(size))`. By default, when the origin has
    loadtest.moto_origin's seeding endpoint, moto creates them in its own process (~100,000
    a minute, against ~300 a second over HTTP); with SeaweedFS, rclone, `--stock-moto` (or
    `over_http=True`) every object is a PUT, 16 at once."""
    client = origin_client(seed_url)
    ensure_bucket(client)
    if over_http is None:
        over_http = not origin_seeds_in_process(seed_url)
    if over_http:
        _seed_over_http(client, keys, size, local_root, progress)
    else:
        _seed_in_origin(seed_url, keys, size, local_root, progress)


def _mirror(local_root: Path, key: str, body: bytes) -> None:
    path = local_root / BUCKET / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)


def _seed_over_http(
    client: Any,
    keys: Sequence[str],
    size: int,
    local_root: Path | None,
    progress: Callable[[str], None],
) -> None:
    block = random_block(size, _BLOCK_SEED)

    def put(item: tuple[int, str]) -> None:
        i, key = item
        body = payload(i, size, block)
        client.put_object(Bucket=ORIGIN_BUCKET, Key=f"{ORIGIN_PREFIX}/{key}", Body=body)
        if local_root is not None:
            _mirror(local_root, key, body)

    with ThreadPoolExecutor(_SEED_THREADS) as pool:
        for n, _ in enumerate(pool.map(put, enumerate(keys)), 1):
            if n % 5000 == 0:
                progress(f"  seeded {n}/{len(keys)} over HTTP")


def _seed_in_origin(
    seed_url: str,
    keys: Sequence[str],
    size: int,
    local_root: Path | None,
    progress: Callable[[str], None],
) -> None:
    """Batches of keys to the origin's seeding endpoint; the local mirror is written here
    meanwhile (the same bytes: the origin calls the same `payload`)."""
    block = random_block(size, _BLOCK_SEED)
    batch = max(1, min(_SEED_BATCH, _SEED_BATCH_BYTES // max(size, 1)))

    def post(first: int) -> dict[str, Any]:
        spec = {
            "bucket": ORIGIN_BUCKET,
            "keys": [f"{ORIGIN_PREFIX}/{k}" for k in keys[first : first + batch]],
            "size": size,
            "first_index": first,
            "block_seed": _BLOCK_SEED,
        }
        request = urllib.request.Request(
            seed_url + _SEED_PATH,
            data=json.dumps(spec).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as resp:
                return dict(json.load(resp))
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"seeding in the origin failed: {exc.read()[:500]!r}") from exc

    with ThreadPoolExecutor(1) as origin:
        for first in range(0, len(keys), batch):
            answer = origin.submit(post, first)
            if local_root is not None:
                for i in range(first, min(first + batch, len(keys))):
                    _mirror(local_root, keys[i], payload(i, size, block))
            done = answer.result()
            if done.get("created") != min(batch, len(keys) - first):
                raise RuntimeError(f"seeding in the origin: {done}")
            progress(
                f"  seeded {first + done['created']}/{len(keys)} in the origin's process "
                f"({done['seconds']:.1f} s for {done['created']} there)"
            )


def seed_file(seed_url: str, key: str, path: Path) -> None:
    """Upload one large local file (moto holds it in a temp file). One PUT up to 4 GiB: moto
    takes a multipart upload about twice as long (it joins the parts in memory)."""
    client = origin_client(seed_url)
    ensure_bucket(client)
    config = TransferConfig(
        multipart_threshold=4 << 30, multipart_chunksize=256 << 20, max_concurrency=2
    )
    client.upload_file(str(path), ORIGIN_BUCKET, f"{ORIGIN_PREFIX}/{key}", Config=config)
    # rclone computes an object's ETag (the MD5 of the file: ~1.6 s of CPU a GiB) on its first
    # HEAD or GET and keeps it; here, not in a measured read (concurrent first reads each
    # compute it). Any other origin just answers a HEAD.
    client.head_object(Bucket=ORIGIN_BUCKET, Key=f"{ORIGIN_PREFIX}/{key}")


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
