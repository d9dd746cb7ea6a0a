"""The one small interface every under-store implements (fsspec-style primitives).

Keys given to a store are relative to the mount; the store joins them with its own
root or prefix. Nothing here knows about HTTP requests from clients.
"""

from __future__ import annotations

import abc
import base64
import binascii
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store knows of one object version."""

    key: str
    size: int
    etag: str  # quoted, exactly as S3 sends it: '"abc..."'
    last_modified: datetime  # timezone-aware, UTC
    content_type: str | None = None
    content_encoding: str | None = None
    content_disposition: str | None = None
    content_language: str | None = None
    cache_control: str | None = None
    expires: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)  # x-amz-meta-* without the prefix
    storage_class: str = "STANDARD"
    # Full-object checksums kept with the object: "crc32", "crc32c", "crc64nvme", "sha1",
    # "sha256" -> base64 value, as S3 returns them in x-amz-checksum-*. Empty when unknown.
    checksums: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WriteAttrs:
    """What a writer says about a new object; kept by the store and returned by stat."""

    content_type: str | None = None
    content_encoding: str | None = None
    content_disposition: str | None = None
    content_language: str | None = None
    cache_control: str | None = None
    expires: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    checksums: Mapping[str, str] = field(default_factory=dict)  # as in ObjectInfo, verified

    @classmethod
    def of(cls, info: ObjectInfo) -> WriteAttrs:
        """The attributes of an existing object (CopyObject with the COPY directive)."""
        return cls(
            info.content_type, info.content_encoding, info.content_disposition,
            info.content_language, info.cache_control, info.expires, info.metadata,
            info.checksums,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One uploaded part as the store knows it."""

    part_number: int
    etag: str  # quoted MD5 of the part's bytes, as S3 answers UploadPart
    size: int


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a listing; keys and prefixes are relative to the mount, sorted by UTF-8 bytes."""

    objects: list[ObjectInfo]
    common_prefixes: list[str]
    next_token: str | None  # None: the listing is complete


def encode_token(last: str) -> str:
    """A continuation token that resumes a listing after `last` (stores that list by walking)."""
    return base64.urlsafe_b64encode(last.encode("utf-8")).decode("ascii")


def decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
    except (ValueError, binascii.Error) as exc:
        raise ValueError("malformed continuation token") from exc


class StoreError(Exception):
    """Base of the typed errors every store raises instead of its client's own exceptions."""


class ObjectNotFound(StoreError):
    """The key does not exist (or is a directory, for file-like stores)."""


class StoreAccessDenied(StoreError):
    """The store refused our credentials for this operation."""


class StoreUnavailable(StoreError):
    """The store could not be reached or answered with a server error; retrying may help."""


class VersionChanged(StoreError):
    """The object no longer has the ETag the reader asked for (it was overwritten)."""


class PreconditionFailed(StoreError):
    """A conditional write found the key in another state than the writer required."""


class UploadNotFound(StoreError):
    """The multipart upload id is unknown to the store (completed, aborted or never made)."""


class ContainerNotEmpty(StoreError):
    """A bucket or folder to delete still holds objects."""


class ContainerExists(StoreError):
    """A bucket or folder to create exists already."""


class ContainerNotFound(StoreError):
    """A bucket or folder to delete does not exist."""


class InvalidPart(StoreError):
    """complete_multipart named a part the store does not hold with that ETag, or the origin
    refused the part list (out of order, a part too small)."""


class IncompleteBody(StoreError):
    """A body yielded fewer or more bytes than the size its writer declared."""


class UnsupportedKey(StoreError):
    """This store cannot hold an object under this key: for the file store a key with an
    empty, '.' or '..' segment or a trailing '/', a name reserved for the store's internals
    ('.s3gw…'), a folder outside the root, or a file where a folder is (or the reverse)."""


class Store(abc.ABC):
    """An under-store: stat, ranged read as an async byte stream, list page."""

    scheme: str = ""

    @abc.abstractmethod
    async def stat(self, key: str) -> ObjectInfo:
        """Metadata of one object; ObjectNotFound if there is none."""

    @abc.abstractmethod
    def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the object (end None: to the end), as they arrive.

        With `if_match`, raise VersionChanged rather than return bytes of another version.
        Callers close the iterator (contextlib.aclosing) when they stop early.
        """

    async def open(
        self, key: str, length: int | None = None
    ) -> tuple[ObjectInfo, AsyncGenerator[bytes, None]]:
        """The current version's metadata and its first `length` bytes (all with None), in one
        request where the store can (S3: one GET, where stat then read costs two round trips
        on a cold miss)."""
        info = await self.stat(key)
        end = None if length is None else min(length, info.size)
        return info, self.read(key, 0, end, if_match=info.etag)

    @abc.abstractmethod
    async def list_page(
        self,
        prefix: str = "",
        delimiter: str | None = None,
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        """Up to max_keys entries (objects and common prefixes together) after token/start_after."""

    # -- writes: each is atomic, so a failure (including the body iterator raising, which is
    # how a client's bad checksum or a disconnect arrives) leaves nothing half-visible.

    @abc.abstractmethod
    async def put(
        self,
        key: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> ObjectInfo:
        """Stream exactly `size` bytes into a new version of `key`; its info (ETag: the MD5,
        or the multipart form where a store sends large bodies up in parts).

        if_none_match: fail with PreconditionFailed when the key exists; if_match: unless the
        key exists with this ETag (a missing key fails too). Memory stays bounded whatever
        the size. An exception from `body` propagates unchanged; a body of another size
        raises IncompleteBody; both leave the previous version untouched.
        """

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Remove the key; a missing key is not an error."""

    @abc.abstractmethod
    async def copy(
        self, src_key: str, dst_key: str, attrs: WriteAttrs | None, *, if_match: str | None = None
    ) -> ObjectInfo:
        """Server-side copy within this store; attrs None keeps the source's. if_match guards
        the source's version (VersionChanged)."""

    @abc.abstractmethod
    async def create_multipart(self, key: str, attrs: WriteAttrs) -> str:
        """Start an upload; the store's own upload id."""

    @abc.abstractmethod
    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        """Store one part (1..10000); uploading a number again replaces that part.

        The body is taken as by put (IncompleteBody, exceptions propagate); UploadNotFound
        for an unknown upload or one made for another key.
        """

    @abc.abstractmethod
    async def complete_multipart(
        self, key: str, upload_id: str, parts: Sequence[PartInfo], attrs: WriteAttrs
    ) -> ObjectInfo:
        """Join the parts in order into the object, atomically; ETag md5(part md5s)-N.

        `attrs` are those given to create_multipart: stores that set attributes when the
        object appears (files) take them from here, S3 from the create. A part missing or
        with another ETag raises InvalidPart; an unknown upload UploadNotFound.
        """

    @abc.abstractmethod
    async def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop the upload and its parts; an unknown upload is not an error."""

    # -- containers: what CreateBucket/DeleteBucket make of a store whose URI names no prefix

    async def create_container(self) -> None:
        """Create the bucket/folder/container this store's URI names; ContainerExists if it is
        there already."""
        raise ValueError(f"{self.scheme}:// stores make no buckets")

    async def delete_container(self) -> None:
        """Delete it if it holds no objects (ContainerNotEmpty); ContainerNotFound if none."""
        raise ValueError(f"{self.scheme}:// stores delete no buckets")

    async def prepare(self) -> None:  # noqa: B027 - optional hook
        """Make clients and connections ahead of the first request (when a mount loads)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the store is not used afterwards."""
