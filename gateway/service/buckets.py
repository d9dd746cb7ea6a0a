"""CreateBucket and DeleteBucket: a new bucket is a container in the configured bucket store
(a folder under a file:// root, or a bucket of the same name at an S3 origin) plus its mount."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gateway import errors
from gateway.meta import MetaUnavailable, MountExists
from gateway.service.namespace import store_options
from gateway.service.store_errors import store_errors
from gateway.stores import create_bucket, delete_bucket

if TYPE_CHECKING:
    from gateway.service.gateway import Gateway

_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
RESERVED = frozenset({"healthz", "metrics"})


def bucket_name_problem(name: str) -> str | None:
    """Why `name` is not a valid S3 bucket name (or reserved here), or None."""
    if not _NAME.match(name) or ".." in name or ".-" in name or "-." in name:
        return (
            "Bucket names are 3-63 characters of a-z, 0-9, '.' and '-', starting and ending"
            " with a letter or digit."
        )
    if _IP.match(name):
        return "Bucket names must not look like an IP address."
    if name in RESERVED:
        return f"The name {name!r} is reserved for the gateway's own endpoints."
    return None


def container_uri(bucket_store: str, bucket: str) -> str:
    """Where a new bucket lives: <root>/<bucket> for file://, s3://<bucket> for s3://."""
    if bucket_store.startswith("s3://"):
        return f"s3://{bucket}"
    return f"{bucket_store.rstrip('/')}/{bucket}"


class Buckets:
    def __init__(
        self, gateway: Gateway, bucket_store: str | None, options: Mapping[str, str]
    ) -> None:
        self.gw = gateway
        self.bucket_store = bucket_store
        self.options = dict(options)

    async def create(self, bucket: str) -> None:
        problem = bucket_name_problem(bucket)
        if problem:
            raise errors.InvalidBucketName(problem, BucketName=bucket)
        if self.gw.namespace.mount(bucket) is not None:
            raise errors.BucketAlreadyOwnedByYou(BucketName=bucket)
        if self.bucket_store is None:
            raise errors.NotImplementedError_(
                "This gateway creates no buckets: no bucket_store is configured. Mount an"
                " existing store instead: gateway mount add BUCKET URI."
            )
        uri = container_uri(self.bucket_store, bucket)
        with store_errors(bucket):
            await create_bucket(uri, self.options)
        try:
            await self.gw.meta.add_mount(bucket, uri, {**self.options, "owned": "true"})
        except MountExists:
            raise errors.BucketAlreadyOwnedByYou(BucketName=bucket) from None
        except MetaUnavailable as exc:
            raise errors.ServiceUnavailable(f"The metadata store is unavailable: {exc}") from None
        await self.gw.namespace.refresh_mounts()

    async def delete(self, bucket: str) -> None:
        handle = self.gw.writer.writable(bucket)
        with store_errors(""):
            page = await handle.store.list_page(max_keys=1)
        if page.objects or page.common_prefixes:
            raise errors.BucketNotEmpty(BucketName=bucket)
        if handle.mount.options.get("owned") == "true":
            with store_errors(""):
                await delete_bucket(handle.mount.uri, store_options(handle.mount.options))
        try:
            await self.gw.meta.remove_mount(bucket)
        except MetaUnavailable as exc:
            raise errors.ServiceUnavailable(f"The metadata store is unavailable: {exc}") from None
        await self.gw.namespace.refresh_mounts()
