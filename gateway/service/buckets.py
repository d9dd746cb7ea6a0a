"""CreateBucket and DeleteBucket: a new bucket is a container in the configured bucket store
(a folder under a file:// root, or a bucket of the same name at an S3 origin) plus its mount.

Ownership: a bucket belongs to the user whose key created it (`gateway mount add` makes the
admin user's), so creating a bucket that is mounted and one's own is creating it again, and
someone else's is BucketAlreadyExists; a container in the bucket store that is not mounted
belongs to someone else."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Protocol

from gateway import errors
from gateway.meta import MetaUnavailable, MountExists, NoSuchUser
from gateway.service.namespace import store_options
from gateway.service.shared import Shared
from gateway.service.store_errors import meta_unavailable, store_errors
from gateway.stores import create_bucket, delete_bucket, open_store

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
RESERVED = frozenset({"healthz", "readyz", "metrics"})


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


class BucketDoor(Protocol):
    """The one door for administration (gateway/admin/ops.py, `Administration`), as the S3
    API's own bucket operations go through it: handed to the service by the node, since the
    service imports nothing above it. Its failures are the database's (MountExists,
    NoSuchUser, MetaUnavailable); False: no such mount."""

    async def mount_owned_bucket(
        self, bucket: str, uri: str, options: Mapping[str, str], owner: str | None
    ) -> object: ...

    async def unmount_bucket(self, bucket: str) -> bool: ...

    async def set_bucket_policy(self, bucket: str, text: str | None) -> bool: ...

    async def set_bucket_option(self, bucket: str, name: str, value: str | None) -> bool: ...


class NoDoor:
    """A service without the door (one made for a test of its reads and writes): the S3
    API's bucket operations are refused, never written past it."""

    async def _refused(self, *_: object) -> bool:
        raise errors.NotImplementedError_("This service changes no buckets.")

    mount_owned_bucket = unmount_bucket = set_bucket_policy = set_bucket_option = _refused


class Buckets:
    def __init__(
        self,
        shared: Shared,
        bucket_store: str | None,
        options: Mapping[str, str],
        door: BucketDoor,
    ) -> None:
        self.shared = shared
        self.bucket_store = bucket_store
        self.options = dict(options)
        self._door = door

    async def create(self, bucket: str, access_key: str | None = None) -> bool:
        """Make the bucket, owned by the key's user (None: the admin user); False if it is
        there already and the caller's (S3 answers that by region: 200 in us-east-1,
        BucketAlreadyOwnedByYou elsewhere)."""
        problem = bucket_name_problem(bucket)
        if problem:
            raise errors.InvalidBucketName(problem, BucketName=bucket)
        auth = self.shared.namespace.auth
        if self.shared.namespace.mount(bucket) is not None:
            if access_key is not None and not auth.owns(access_key, bucket):
                raise errors.BucketAlreadyExists(BucketName=bucket)
            return False
        if self.bucket_store is None:
            raise errors.NotImplementedError_(
                "This gateway creates no buckets: no bucket_store is configured. Mount an"
                " existing store instead: gateway mount add BUCKET URI."
            )
        uri = container_uri(self.bucket_store, bucket)
        folder = open_store(uri, self.options).local_folder()
        problem = None if folder is None else self.shared.namespace.own.problem(folder)
        if problem is not None:
            # The node refuses such a bucket store at start; a symlink changed since can still
            # lead a new bucket there. The paths go to the log, not to the client.
            log.error("CreateBucket %s refused: %s", bucket, problem)
            raise errors.AccessDenied(
                "The bucket store cannot hold this bucket: its folder would expose the"
                " gateway's own files."
            )
        with store_errors(bucket):
            await create_bucket(uri, self.options)
        principal = auth.principal(access_key)
        owner = principal.name if principal is not None else None
        try:
            await self._door.mount_owned_bucket(
                bucket, uri, {**self.options, "owned": "true"}, owner
            )
        except MountExists:
            return False  # mounted meanwhile, by another node or `gateway mount add`
        except NoSuchUser:  # the user was deleted meanwhile
            raise errors.AccessDenied() from None
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None
        await self.shared.namespace.refresh_mounts()
        return True

    async def delete(self, bucket: str) -> None:
        handle = self.shared.writable(bucket)
        with store_errors(""):
            page = await handle.store.list_page(max_keys=1)
        if page.objects or page.common_prefixes:
            raise errors.BucketNotEmpty(BucketName=bucket)
        if handle.mount.options.get("owned") == "true":
            with store_errors(""):
                await delete_bucket(handle.mount.uri, store_options(handle.mount.options))
        try:
            await self._door.unmount_bucket(bucket)
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None
        await self.shared.namespace.refresh_mounts()
