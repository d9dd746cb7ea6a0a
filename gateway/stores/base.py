"""The one small interface every under-store implements (fsspec-style primitives).

Keys given to a store are relative to the mount; the store joins them with its own
root or prefix. Nothing here knows about HTTP requests from clients.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


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
    # The object's tags where the store's stat knows them (file, HDFS, GCS), else None (get
    # them with Store.get_tags); their number where known (S3 and Azure say it on a HEAD).
    tags: Mapping[str, str] | None = None
    tag_count: int = 0
    # Server-side encryption the store applied, as ENCRYPTION names it; empty for none.
    encryption: Mapping[str, str] = field(default_factory=dict)
    # The store's id of this version where a read addressed it (S3's VersionId): reads of it
    # ask the store for that version, which never changes. None for a key's current version,
    # read by its ETag.
    version_id: str | None = None
    # The store's own id of this version where it keeps versions and said it (an S3 origin's
    # VersionId), told to clients as x-amz-version-id. Never used to address the store: a
    # key's current version is read by its ETag, and version_id above is a read by id.
    store_version: str | None = None


@dataclass(frozen=True, slots=True)
class VersionEntry:
    """One version of a key in a store that keeps versions (ListObjectVersions): the version
    (info.version_id names it), whether it is the key's latest, and whether it is a delete
    marker (then only key, version id and last_modified mean anything)."""

    info: ObjectInfo
    latest: bool
    delete_marker: bool = False


@dataclass(frozen=True, slots=True)
class VersionsPage:
    """A page of a store's versions, keys relative to the mount, in S3's order (by key, each
    key's newest first); the markers to ask the next page from (None: the listing is
    complete)."""

    entries: list[VersionEntry]
    common_prefixes: list[str]
    next_key_marker: str | None
    next_version_marker: str | None


@dataclass(frozen=True, slots=True)
class VersionDeleted:
    """What a delete did in a store that keeps versions: the version it removed, or the
    delete marker it made (then `delete_marker` is True and version_id names the marker)."""

    version_id: str | None
    delete_marker: bool


# The names of server-side encryption settings, in WriteAttrs.encryption and
# ObjectInfo.encryption: "algorithm" (S3's x-amz-server-side-encryption: AES256, aws:kms,
# aws:kms:dsse), "kms_key_id", "kms_context", "bucket_key" ("true"/"false"),
# "customer_algorithm", "customer_key" (base64; never kept by the gateway) and
# "customer_key_md5" (SSE-C).
ENCRYPTION = (
    "algorithm", "kms_key_id", "kms_context", "bucket_key", "customer_algorithm",
    "customer_key", "customer_key_md5",
)  # fmt: skip


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
    tags: Mapping[str, str] = field(default_factory=dict)  # S3 object tags, checked
    # Server-side encryption asked for (ENCRYPTION's names); only a store that does it
    # (`Store.encrypts`) is given any.
    encryption: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, info: ObjectInfo) -> WriteAttrs:
        """The attributes of an existing object (CopyObject with the COPY directive); its
        tags where the stat knew them."""
        return cls(
            info.content_type, info.content_encoding, info.content_disposition,
            info.content_language, info.cache_control, info.expires, info.metadata,
            info.checksums, dict(info.tags or {}),
        )  # fmt: skip

    def info(self, key: str, size: int, etag: str, last_modified: datetime) -> ObjectInfo:
        """The info of a version written with these attributes."""
        return ObjectInfo(
            key=key,
            size=size,
            etag=etag,
            last_modified=last_modified,
            content_type=self.content_type,
            content_encoding=self.content_encoding,
            content_disposition=self.content_disposition,
            content_language=self.content_language,
            cache_control=self.cache_control,
            expires=self.expires,
            metadata=dict(self.metadata),
            checksums=dict(self.checksums),
            tags=dict(self.tags),
            tag_count=len(self.tags),
            encryption={k: v for k, v in self.encryption.items() if k in _REPORTED},
        )


# What of WriteAttrs.encryption an object's info reports (never the client's key).
_REPORTED = ("algorithm", "kms_key_id", "bucket_key", "customer_algorithm", "customer_key_md5")


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One uploaded part as the store knows it."""

    part_number: int
    etag: str  # quoted MD5 of the part's bytes, as S3 answers UploadPart
    size: int


@dataclass(frozen=True, slots=True)
class ListRequest:
    """What a listing asks of a store (Store.list_page's arguments); max_keys > 0."""

    prefix: str
    delimiter: str | None  # None for none: never ""
    token: str | None  # the next_token of the page before, as the store made it
    start_after: str | None
    max_keys: int


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a listing; keys and prefixes are relative to the mount, sorted by UTF-8 bytes."""

    objects: list[ObjectInfo]
    common_prefixes: list[str]
    next_token: str | None  # None: the listing is complete


class StoreError(Exception):
    """Base of the typed errors every store raises instead of its client's own exceptions.

    Raised as itself, it is a failure the gateway has no better name for (a bug, a store that
    answers nonsense). Messages may name the store's own addresses: they go to the log, never
    to clients, except where a subclass says otherwise.
    """


class ObjectNotFound(StoreError):
    """The key does not exist (or is a directory, for file-like stores)."""


class StoreAccessDenied(StoreError):
    """The store refused our credentials for this operation."""


class StoreUnavailable(StoreError):
    """The store could not be reached or answered with a server error; retrying may help."""


class StoreMissing(StoreUnavailable):
    """The mount's bucket, container or root folder does not exist: a misconfiguration (or
    one being made good), not a missing key."""


class NoSuchVersion(ObjectNotFound):
    """The key has no version of the id asked for (or there is no such key)."""


class IsDeleteMarker(ObjectNotFound):
    """The version asked for is a delete marker: it has no bytes nor metadata to read."""


class MarkedDeleted(ObjectNotFound):
    """The key's current version is a delete marker (`version_id`, where the store said it):
    there is no object, as for any missing key, and S3 says why (x-amz-delete-marker)."""

    def __init__(self, message: str, version_id: str | None) -> None:
        super().__init__(message)
        self.version_id = version_id


class VersionChanged(StoreError):
    """The object no longer has the ETag the reader asked for (it was overwritten)."""


class PreconditionFailed(StoreError):
    """A conditional write found the key in another state than the writer required."""


class WriteConflict(PreconditionFailed):
    """A conditional write whose condition held when it began found, when it was to land, that
    another write of the key had landed meanwhile (S3's 409 ConditionalRequestConflict: the
    client may send it again)."""


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
    ('.s3gw…'), a folder outside the root, or a file where a folder is (or the reverse).
    The message describes the key, never the store's addresses: clients see it."""


class KeyTooLong(UnsupportedKey):
    """The key, or a name in it, is longer than this store holds (reads and writes alike: no
    object can have it). The message names the limit; clients see it."""


class MetadataTooLarge(StoreError):
    """The object's attributes (user metadata and the rest) are more than this store keeps
    with an object. The message names the limit; clients see it."""


class StoreRejected(StoreError):
    """The store refused the request as it was made, for a reason it gave no finer name for
    (an origin's 4xx): sending it again unchanged would not help."""


class InvalidVersionId(StoreRejected):
    """The store refused a version id as no id of its own (S3 answers 400 to a malformed one)."""


def one_version(scheme: str, version_id: str | None) -> None:
    """Refuse a version id in a store that keeps one version of each key (the service passes
    none: it answers such ids itself)."""
    if version_id is not None:
        raise StoreRejected(f"{scheme}:// stores keep one version of a key")


def same_etag(a: str | None, b: str | None) -> bool:
    """Whether two ETags name one version, compared by value as S3 compares them: quoted or
    not (S3 quotes them in headers and listings; rclone lists them bare), weak or strong."""
    if a is None or b is None:
        return False
    return a.strip().removeprefix("W/").strip('"') == b.strip().removeprefix("W/").strip('"')


def _no_report(scheme: str, wasted: int, wrong_version: bool) -> None:
    del scheme, wasted, wrong_version


# Where a store tells what its answer checks found (bytes wasted around a range, an answer of
# another version): the service sets it to its metrics (counters.store_answer); stores may
# not import them.
answer_report: Callable[[str, int, bool], None] = _no_report


@dataclass(frozen=True, slots=True)
class Answered:
    """Which bytes of an origin's answer to a read are the ones asked for: `skip` of them,
    then `keep` (None: all the rest). An origin that ignores Range answers 200 with the whole
    object, and only a part of it is wanted."""

    skip: int = 0
    keep: int | None = None


def check_answer(
    key: str,
    start: int,
    end: int | None,
    ranged: bool,
    if_match: str | None,
    etag: str | None,
    content_range: str | None,
    length: int | None,
) -> Answered:
    """Check an origin's answer to a read of [start, end) of `key` against what was asked
    before a byte of it is kept or sent: the version (the answer's ETag against `if_match`,
    compared by value: an origin that ignores If-Match answers 200 with another version's
    bytes), and the range (Content-Range, or the whole object when the origin ignored Range).
    VersionChanged for another version; StoreError for an answer of bytes not asked for."""
    if if_match is not None and if_match != "*" and not same_etag(etag, if_match):
        raise VersionChanged(f"{key}: asked for {if_match}, the origin answered {etag}")
    if not ranged:
        return Answered()
    if not content_range:
        # 200 and the whole object: the range is in it, from `start` on (to its end at most).
        if end is not None and length is not None:
            end = min(end, length)
        return Answered(start, None if end is None else max(end - start, 0))
    unit, _, rest = content_range.strip().partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    try:
        got_start, got_end = int(first), int(last) + 1
    except ValueError:
        raise StoreError(f"{key}: the origin answered Content-Range {content_range!r}") from None
    if unit != "bytes" or got_start != start:
        raise StoreError(f"{key}: asked for bytes {start}-, answered {content_range!r}")
    if total.isdigit() and end is not None:
        end = min(end, int(total))  # S3 ends a range that runs past the object at its end
    if end is not None and got_end < end:
        raise StoreError(f"{key}: asked for bytes {start}-{end - 1}, answered {content_range!r}")
    # Past what was asked, the bytes are dropped; an exact answer is passed on as it comes.
    return Answered(0, None if end is None or got_end <= end else end - start)


def check_range(
    key: str,
    start: int,
    end: int | None,
    ranged: bool,
    status: int,
    content_range: str | None,
    content_length: str | None,
) -> Answered:
    """check_answer() of the range alone, from the answer's status and headers, for a store
    that checks the version by its own means (GCS by generation, Azure by its ETag)."""
    length = int(content_length) if status == 200 and content_length else None
    return check_answer(key, start, end, ranged, None, None, content_range, length)


async def kept(
    chunks: AsyncGenerator[bytes, None], answered: Answered, scheme: str
) -> AsyncGenerator[bytes, None]:
    """The chunks of an answer, of the bytes asked for only (see Answered); the others are
    reported as wasted (answer_report), and the answer is closed once the last byte asked
    for is in."""
    skip, keep = answered.skip, answered.keep
    if not skip and keep is None:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield chunk
        return
    wasted = 0
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                if skip:
                    if len(chunk) <= skip:
                        skip -= len(chunk)
                        wasted += len(chunk)
                        continue
                    wasted += skip
                    chunk = chunk[skip:]
                    skip = 0
                if keep is not None and len(chunk) >= keep:
                    wasted += len(chunk) - keep
                    if keep:
                        yield chunk[:keep]
                    return
                if keep is not None:
                    keep -= len(chunk)
                yield chunk
    finally:
        if wasted:
            answer_report(scheme, wasted, False)


class UploadJournal(abc.ABC):
    """Where a store records the uploads it opens at its origin on its own behalf (S3's
    multipart upload that streams a large PUT) while it holds them, so that those a crash
    leaves behind can be found and aborted by whoever outlives it."""

    @abc.abstractmethod
    def holding(self, key: str, upload_id: str) -> AbstractAsyncContextManager[None]:
        """Recorded, and kept alive, while the context is open; forgotten when it closes."""


class NoJournal(UploadJournal):
    """Records nothing: a store used outside a node (the CLI, tests of the store alone)."""

    @contextlib.asynccontextmanager
    async def holding(self, key: str, upload_id: str) -> AsyncIterator[None]:
        yield


@dataclass(frozen=True, slots=True)
class Swept:
    """What a sweep of a store's leftovers removed."""

    files: int = 0
    size: int = 0  # bytes


class ObjectWrites(Protocol):
    """put, delete and copy, as every Store does them, and as a store's writes collaborator
    does them for it (see `delegating`).

    Each is atomic, so a failure (including the body iterator raising, which is how a
    client's bad checksum or a disconnect arrives) leaves nothing half-visible. The info a
    write returns names a version the store really holds: a store whose reply lacks the ETag
    (or gives an empty one) asks for it before returning, as if by stat.
    """

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
    async def delete(self, key: str) -> VersionDeleted | None:
        """Remove the key; a missing key is not an error. A store that keeps versions says
        what it did where it made a delete marker (S3's versioned buckets); None otherwise."""

    @abc.abstractmethod
    async def copy(
        self,
        src_key: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        *,
        if_match: str | None = None,
        version_id: str | None = None,
    ) -> ObjectInfo:
        """Server-side copy within this store; attrs None keeps the source's (and, with
        them, its tags). if_match guards the source's version (VersionChanged). version_id:
        copy that version of the source (stores that keep versions; the others refuse any,
        `one_version`)."""


class MultipartUploads(Protocol):
    """S3's multipart uploads, as every Store does them, and as a store's uploads
    collaborator does them for it (see `delegating`)."""

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
        self,
        key: str,
        upload_id: str,
        parts: Sequence[PartInfo],
        attrs: WriteAttrs,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> ObjectInfo:
        """Join the parts in order into the object, atomically; ETag md5(part md5s)-N.

        `attrs` are those given to create_multipart: stores that set attributes when the
        object appears (files) take them from here, S3 from the create. A part missing or
        with another ETag raises InvalidPart; an unknown upload UploadNotFound. The
        conditions are put's: PreconditionFailed when the key is not at `if_match` or, with
        `if_none_match`, exists; atomically where the store can.
        """

    @abc.abstractmethod
    async def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop the upload and its parts; an unknown upload is not an error."""


class Store(ObjectWrites, MultipartUploads, abc.ABC):
    """An under-store: stat, ranged read as an async byte stream, list page; the writes of
    ObjectWrites and MultipartUploads; the container its URI names."""

    scheme: str = ""
    journal: UploadJournal = NoJournal()  # set by the node that serves the store
    # Whether the store encrypts objects as WriteAttrs.encryption asks (S3 origins); the
    # gateway refuses such writes to any other store rather than keep plaintext.
    encrypts: bool = False

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

    async def list_page(
        self,
        prefix: str = "",
        delimiter: str | None = None,
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        """Up to max_keys entries (objects and common prefixes together) after token/start_after;
        ValueError for a token this store did not give."""
        if max_keys <= 0:
            return ListPage([], [], None)
        return await self._list_page(
            ListRequest(prefix, delimiter or None, token, start_after, max_keys)
        )

    @abc.abstractmethod
    async def _list_page(self, request: ListRequest) -> ListPage:
        """list_page, its arguments checked and gathered."""

    # -- tags: S3's object tags (at most 10, checked by the caller), kept by the store

    async def get_tags(self, key: str, version_id: str | None = None) -> dict[str, str]:
        """The object's tags (empty for none); ObjectNotFound if there is no object. With
        version_id, that version's (stores that keep versions; the others refuse any)."""
        raise StoreRejected(f"{self.scheme}:// stores keep no tags")

    async def put_tags(
        self, key: str, tags: Mapping[str, str], version_id: str | None = None
    ) -> None:
        """Replace the object's tags (empty: remove them), leaving its bytes, ETag and other
        attributes as they are; ObjectNotFound if there is no object. With version_id, that
        version's (stores that keep versions and can; the others refuse any)."""
        raise StoreRejected(f"{self.scheme}:// stores keep no tags")

    async def part_sizes(self, key: str, etag: str) -> list[int] | None:
        """The sizes of the parts version `etag` of the key was uploaded in, in order, where
        the store can tell them (S3 origins: HEAD ?partNumber=N); None where it cannot. The
        caller checks they add up to the version's size (a new version may answer)."""
        return None

    # -- versions: stores that keep each key's versions and read any of them (S3 origins)

    # Whether the store addresses versions (the methods below); the others keep one version
    # of a key, which S3 calls "null".
    versions: bool = False

    async def stat_version(self, key: str, version_id: str) -> ObjectInfo:
        """The metadata of one version of the key (info.version_id is it); NoSuchVersion if
        the key has none of that id, IsDeleteMarker if it is a delete marker."""
        raise StoreRejected(f"{self.scheme}:// stores keep one version of a key")

    def read_version(
        self, key: str, version_id: str, start: int, end: int, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        """read() of that version: bytes [start, end), checked against `if_match` (its ETag,
        as stat_version told it) as read() checks them."""
        raise StoreRejected(f"{self.scheme}:// stores keep one version of a key")

    async def list_versions(
        self,
        prefix: str,
        delimiter: str | None,
        key_marker: str | None,
        version_marker: str | None,
        max_keys: int,
    ) -> VersionsPage:
        """Up to max_keys versions and delete markers (and common prefixes) under prefix, after
        the markers; ValueError for a marker the store refuses."""
        raise StoreRejected(f"{self.scheme}:// stores keep one version of a key")

    async def delete_version(self, key: str, version_id: str) -> VersionDeleted:
        """Remove that version of the key for good (or that delete marker); a version that is
        not there is not an error."""
        raise StoreRejected(f"{self.scheme}:// stores keep one version of a key")

    async def get_versioning(self) -> str | None:
        """The versioning status of the store's bucket: "Enabled", "Suspended", or None for
        a bucket it was never enabled on."""
        return None

    def versioning_settable(self) -> bool:
        """Whether put_versioning may be asked: the store's versioning is the mount's alone."""
        return False

    async def put_versioning(self, status: str) -> None:
        """Set the store's bucket's versioning status ("Enabled" or "Suspended")."""
        raise StoreRejected(f"{self.scheme}:// stores keep one version of a key")

    # -- SSE-C: objects encrypted with a client's key, read only with it (stores that encrypt)

    async def stat_encrypted(self, key: str, encryption: Mapping[str, str]) -> ObjectInfo:
        """stat, with the client's key (WriteAttrs.encryption's customer_* names)."""
        raise StoreRejected(f"{self.scheme}:// stores keep no encrypted objects")

    def read_encrypted(
        self, key: str, encryption: Mapping[str, str], start: int, end: int, if_match: str
    ) -> AsyncGenerator[bytes, None]:
        """read, with the client's key; bytes [start, end) of version `if_match`."""
        raise StoreRejected(f"{self.scheme}:// stores keep no encrypted objects")

    # -- containers: what CreateBucket/DeleteBucket make of a store whose URI names no prefix

    async def create_container(self) -> None:
        """Create the bucket/folder/container this store's URI names; ContainerExists if it is
        there already."""
        raise ValueError(f"{self.scheme}:// stores make no buckets")

    async def delete_container(self) -> None:
        """Delete it if it holds no objects (ContainerNotEmpty); ContainerNotFound if none."""
        raise ValueError(f"{self.scheme}:// stores delete no buckets")

    async def sweep(self) -> Swept:
        """Remove what writers that died (kill -9, a crash) left in the store, never what a
        live writer of any process or node still holds; safe to run anywhere, any time."""
        return Swept()

    def local_folder(self) -> str | None:
        """The folder of this machine whose files this store serves (file://), else None: the
        gateway keeps its own files out of it."""
        return None

    async def prepare(self) -> None:
        """Make clients and connections ahead of the first request (when a mount loads)."""

    async def close(self) -> None:
        """Release connections; the store is not used afterwards."""
