"""The service as the S3 front end sees it: one method per S3 operation (versitygw's Backend),
plus what authentication asks. The front end calls this and nothing beneath it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from gateway import errors
from gateway.bounded import Bounded
from gateway.iam import MalformedPolicy, compile_policy
from gateway.meta import MetaUnavailable
from gateway.service.authz import Caller
from gateway.service.buckets import BucketDoor, Buckets, NoDoor
from gateway.service.conditions import ByteRange, Conditions
from gateway.service.encrypted import EncryptedReads
from gateway.service.host_reads import HostReads, LocalBlocks
from gateway.service.inputs import CopySource, DeleteEntry, Deletion, ListQuery, UploadsQuery
from gateway.service.multipart import Multipart, PartListing, UploadListing
from gateway.service.reads import FileRegion, HitAt, ObjectResult, Reader
from gateway.service.shared import Shared
from gateway.service.store_errors import meta_unavailable, store_errors
from gateway.service.writes import ObjectWriter, WriteConditions, check_encryption
from gateway.stores import (
    ListPage,
    ObjectInfo,
    PartInfo,
    VersionDeleted,
    VersionsPage,
    WriteAttrs,
)


@dataclass(frozen=True, slots=True)
class Bucket:
    name: str
    created_at: datetime


class S3Service:
    """The S3 operations of one node, each handed to the part that does it: reads to the
    Reader, writes to the ObjectWriter, uploads to Multipart, buckets to Buckets.

    `reader` and `multipart` are public for the node alone: its peer API serves blocks from
    the reader, and the multipart janitor runs beside the requests."""

    def __init__(
        self,
        shared: Shared,
        *,
        readahead: int = 4,
        multipart_max_age: float = 7 * 86400,
        bucket_store: str | None = None,
        bucket_store_options: Mapping[str, str] | None = None,
        door: BucketDoor | None = None,
    ) -> None:
        self._shared = shared
        self._door: BucketDoor = door if door is not None else NoDoor()
        self.reader = Reader(shared, readahead)
        self._host = HostReads(self.reader)  # clients on this host (short-circuit)
        self._writer = ObjectWriter(shared, self.reader)
        self.multipart = Multipart(shared, self.reader, self._writer, multipart_max_age)
        self._buckets = Buckets(shared, bucket_store, bucket_store_options or {}, self._door)
        self._encrypted = EncryptedReads(shared)
        # (mount id, key, ETag) -> offsets of its parts' starts and of its end (partNumber).
        self._parts: Bounded[tuple[int, str, str], list[int]] = Bounded(4096)

    # -- authentication --------------------------------------------------------------------

    def secret_for(self, access_key: str) -> str | None:
        """The secret of a key known at the last refresh; no I/O."""
        return self._shared.namespace.secret_for(access_key)

    async def lookup_new_key(self, access_key: str) -> str | None:
        """The secret of a key perhaps created since the last refresh (at most one re-read of
        the keys a second)."""
        return await self._shared.namespace.lookup_unknown_key(access_key)

    def state_stale(self) -> bool:
        """Whether mounts, tenants or keys changed on this node since this worker read them:
        one load from shared memory (gateway/generations.py)."""
        return self._shared.namespace.stale()

    async def state_current(self) -> None:
        """Re-read what changed on this node, before a request is answered."""
        await self._shared.namespace.current()

    def has_bucket(self, bucket: str) -> bool:
        """Whether the bucket is mounted (known at the last refresh); no I/O."""
        return self._shared.namespace.mount(bucket) is not None

    async def lookup_new_bucket(self, bucket: str) -> None:
        """Re-read the mounts when `bucket` is not known here: it may have been mounted since
        the last refresh (at most one re-read a second)."""
        await self._shared.namespace.lookup_unknown_mount(bucket)

    def public_read(self, bucket: str) -> bool:
        """Whether anonymous clients may read the bucket (False for one not mounted)."""
        handle = self._shared.namespace.mount(bucket)
        return handle is not None and handle.public_read

    # -- authorization (docs/tenants.md): decisions from memory, no I/O --------------------

    def authorize(
        self,
        access_key: str | None,
        action: str,
        bucket: str | None,
        key: str | None,
        source_ip: str | None,
        *,
        prefix: str | None = None,
        delimiter: str | None = None,
        secure: bool | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """AccessDenied unless the key (None: anonymous) may do `action` (an IAM action name,
        s3:GetObject) on the bucket or object; the same answer whether the object exists.
        `headers`: the request's, for the condition keys that are a header's value."""
        if not self._shared.namespace.auth.allowed(
            access_key, action, bucket, key, source_ip, prefix, delimiter, secure, headers
        ):
            raise errors.AccessDenied()

    def allowed_quick(
        self, access_key: str | None, action: str, bucket: str, key: str
    ) -> bool | None:
        """The decision without the request's condition values (the edge's hits): None where a
        policy's Condition could change it."""
        return self._shared.namespace.auth.quick(access_key, action, bucket, key)

    def _check_caller(
        self, caller: Caller | None, action: str, bucket: str, key: str | None
    ) -> None:
        """Authorize again, for an operation that decides more than once (None: a caller
        the front end did not name, the node's own work)."""
        if caller is not None:
            self.authorize(
                caller.access_key, action, bucket, key, caller.source_ip, secure=caller.secure
            )

    def hit_at(self, bucket: str, key: str, disk: bool = True) -> HitAt | None:
        """Whether a whole object may be answered from this node's memory or page cache
        (`disk`) with no await; nothing read or counted (Reader.hit_at)."""
        return self.reader.hit_at(bucket, key, disk)

    def take_hit(
        self, at: HitAt, disk: bool = True, zero_copy: bool = False, read_in: bool = True
    ) -> tuple[ObjectInfo, bytes | memoryview | FileRegion] | None:
        """The object hit_at() found, read and counted as a hit, or None (Reader.take_hit)."""
        return self.reader.take_hit(at, disk, zero_copy, read_in)

    async def local_blocks(self, bucket: str, key: str, first: int, count: int) -> LocalBlocks:
        """The key's version and the files of its blocks this node holds (short-circuit)."""
        return await self._host.local_blocks(bucket, key, first, count)

    async def local_files(
        self, bucket: str, keys: list[str], count: int
    ) -> list[LocalBlocks | errors.S3Error]:
        """local_blocks() of many keys, the files' paths not checked (short-circuit)."""
        return await self._host.local_files(bucket, keys, count)

    async def local_versions(
        self, bucket: str, keys: list[str], fresh_for: float = 0.0
    ) -> list[LocalBlocks | errors.S3Error]:
        """Each key's version and how long it stays fresh, for a lease renewal (short-circuit);
        keys fresh for less than `fresh_for` seconds revalidated first."""
        return await self._host.local_versions(bucket, keys, fresh_for)

    # -- service and buckets ---------------------------------------------------------------

    def list_buckets(self, caller: Caller | None) -> list[Bucket]:
        """The buckets the caller may see: its own and those a policy grants it anything in."""
        auth = self._shared.namespace.auth
        return [
            Bucket(h.bucket, h.mount.created_at)
            for h in self._shared.namespace.mounts()
            if caller is None or auth.may_see(caller.access_key, h.bucket)
        ]

    def head_bucket(self, bucket: str) -> None:
        self._shared.mount(bucket)

    async def create_bucket(self, bucket: str, caller: Caller | None) -> bool:
        """False when the bucket exists and is the caller's; BucketAlreadyExists when it is
        someone else's, or its name is taken in the bucket store."""
        return await self._buckets.create(bucket, caller.access_key if caller else None)

    async def delete_bucket(self, bucket: str) -> None:
        await self._buckets.delete(bucket)

    async def put_bucket_policy(self, bucket: str, document: bytes) -> None:
        """MalformedPolicy, saying why, for a document that is not a policy of this bucket."""
        self._shared.mount(bucket)
        try:
            text = document.decode("utf-8")
            compile_policy(text, bucket)
        except (UnicodeDecodeError, MalformedPolicy) as exc:
            raise errors.MalformedPolicy(str(exc)) from None
        await self._policy_change(bucket, text)

    def get_bucket_policy(self, bucket: str) -> str:
        """The bucket's policy as it was put (as of the last refresh); NoSuchBucketPolicy."""
        self._shared.mount(bucket)
        rules = self._shared.namespace.auth.buckets.get(bucket)
        if rules is None or rules.document is None:
            raise errors.NoSuchBucketPolicy(BucketName=bucket)
        return rules.document

    async def delete_bucket_policy(self, bucket: str) -> None:
        """Gone, or never there: S3 answers 204 either way."""
        self._shared.mount(bucket)
        await self._policy_change(bucket, None)

    async def _policy_change(self, bucket: str, text: str | None) -> None:
        try:
            found = await self._door.set_bucket_policy(bucket, text)
            if text is not None and not found:
                raise errors.NoSuchBucket(BucketName=bucket)  # removed meanwhile
            await self._shared.namespace.refresh_auth()
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None

    # -- versions: a store's own, where it keeps them (S3 origins) ------------------------

    def keeps_versions(self, bucket: str) -> bool:
        """Whether the bucket's store keeps versions a request may name (no I/O)."""
        return self._shared.mount(bucket).store.versions

    async def get_versioning(self, bucket: str) -> str | None:
        handle = self._shared.mount(bucket)
        with store_errors(""):
            return await handle.store.get_versioning()

    async def put_versioning(self, bucket: str, status: str) -> None:
        handle = self._shared.writable(bucket)
        if not handle.store.versions:
            raise errors.NotImplementedError_(
                "Versioning is not implemented for this bucket's store: it keeps one version"
                " of each key."
            )
        if not handle.store.versioning_settable():
            raise errors.NotImplementedError_(
                "This bucket is a prefix of its store's bucket, whose versioning is the whole"
                " bucket's: set it at the store."
            )
        with store_errors(""):
            await handle.store.put_versioning(status)

    async def list_versions(
        self, bucket: str, prefix: str, delimiter: str | None, key_marker: str | None,
        version_marker: str | None, max_keys: int,
    ) -> VersionsPage:  # fmt: skip
        return await self.reader.list_versions(
            bucket, prefix, delimiter, key_marker, version_marker, max_keys
        )

    async def delete_version(self, bucket: str, key: str, version_id: str) -> VersionDeleted | None:
        """DeleteObject with versionId: that version removed for good (or that delete marker),
        where the store keeps versions; "null" alone, the key's one version, where it keeps
        one (any other id is InvalidArgument and deletes nothing)."""
        return await self._writer.delete_version(bucket, key, version_id)

    def check_writable(self, bucket: str) -> None:
        """Refuse a write to a bucket not mounted, or mounted read-only, before its body."""
        self._shared.writable(bucket)

    def bucket_cors(self, bucket: str) -> str | None:
        """The bucket's CORS configuration as PutBucketCors kept it (the mount's `cors`
        option); None for none, NoSuchBucket for no bucket. No I/O."""
        return self._shared.mount(bucket).mount.options.get("cors")

    def cors_rules_if_mounted(self, bucket: str) -> str | None:
        """bucket_cors, None for a bucket not mounted too (answers to browsers)."""
        handle = self._shared.namespace.mount(bucket)
        return None if handle is None else handle.mount.options.get("cors")

    async def set_bucket_cors(self, bucket: str, config: str | None) -> None:
        """Keep (None: drop) the bucket's CORS configuration, in its mount's options; this
        node serves it at once, the others at their next refresh of the mounts."""
        self._shared.mount(bucket)
        try:
            found = await self._door.set_bucket_option(bucket, "cors", config)
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None
        if not found:
            raise errors.NoSuchBucket(BucketName=bucket)
        await self._shared.namespace.refresh_mounts()

    async def list_objects(self, bucket: str, query: ListQuery) -> ListPage:
        return await self.reader.list_objects(bucket, query)

    async def list_multipart_uploads(self, bucket: str, query: UploadsQuery) -> UploadListing:
        return await self.multipart.list_uploads(bucket, query)

    # -- objects ---------------------------------------------------------------------------

    async def head_object(
        self, bucket: str, key: str, rng: ByteRange | None, cond: Conditions,
        version_id: str | None = None,
    ) -> ObjectResult:  # fmt: skip
        return await self.reader.head_object(bucket, key, rng, cond, version_id)

    async def get_object(
        self, bucket: str, key: str, rng: ByteRange | None, cond: Conditions,
        version_id: str | None = None, zero_copy: bool = False,
    ) -> ObjectResult:  # fmt: skip
        """`zero_copy`: the HTTP server sends files itself (the ASGI extension
        http.response.zerocopysend), so blocks of this node's cache may come as regions of
        their files (FileRegion) rather than bytes."""
        return await self.reader.get_object(bucket, key, rng, cond, version_id, zero_copy)

    async def put_object(
        self,
        bucket: str,
        key: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        cond: WriteConditions,
    ) -> ObjectInfo:
        return await self._writer.put(bucket, key, body, size, attrs, cond)

    async def copy_object(
        self,
        source: CopySource,
        bucket: str,
        key: str,
        attrs: WriteAttrs | None,
        tags: dict[str, str] | None = None,
        encryption: dict[str, str] | None = None,
        caller: Caller | None = None,
    ) -> tuple[ObjectInfo, ObjectInfo]:
        """attrs None keeps the source's (directive COPY), tags None its tags (tagging
        directive COPY); encryption asked of the copy. The source's and the copy's infos."""
        self._check_caller(caller, _source_action(source), source.bucket, source.key)
        return await self._writer.copy(source, bucket, key, attrs, tags, encryption)

    async def delete_object(self, bucket: str, key: str) -> VersionDeleted | None:
        """On a store that keeps versions, the delete marker it made, where it made one."""
        return await self._writer.delete(bucket, key)

    async def delete_objects(
        self, bucket: str, entries: list[DeleteEntry], caller: Caller | None
    ) -> list[Deletion]:
        """Every entry tried, each with its own outcome, in the request's order; an entry the
        caller may not delete is AccessDenied, alone: one that names a version is authorized
        as s3:DeleteObjectVersion, as DeleteObject with versionId is."""
        allowed: list[DeleteEntry] = []
        denied: dict[int, Deletion] = {}
        for i, entry in enumerate(entries):
            action = "s3:DeleteObject" if entry.version_id is None else "s3:DeleteObjectVersion"
            try:
                self._check_caller(caller, action, bucket, entry.key)
            except errors.AccessDenied as exc:
                denied[i] = Deletion(entry, error=exc)
            else:
                allowed.append(entry)
        done = iter(await self._writer.delete_many(bucket, allowed) if allowed else [])
        return [denied[i] if i in denied else next(done) for i in range(len(entries))]

    async def get_encrypted_object(
        self,
        bucket: str,
        key: str,
        rng: ByteRange | None,
        cond: Conditions,
        encryption: dict[str, str],
        head: bool,
    ) -> ObjectResult:
        """GET or HEAD with the client's SSE-C key: from the store, never cached."""
        return await self._encrypted.get(bucket, key, rng, cond, encryption, head)

    async def part_range(
        self, bucket: str, key: str, info: ObjectInfo, number: int
    ) -> tuple[int, int] | None:
        """Bytes [start, end) of part `number` of version `info`, where the store tells its
        parts' sizes (kept per version, a few thousand versions); None where it cannot."""
        handle = self._shared.mount(bucket)
        found = self._parts.get((handle.id, key, info.etag))
        if found is None:
            with store_errors(key):
                sizes = await handle.store.part_sizes(key, info.etag)
            if sizes is None:
                return None
            found = [0]
            for size in sizes:
                found.append(found[-1] + size)
            if found[-1] != info.size:
                raise errors.ServiceUnavailable("The object changed while its parts were read.")
            self._parts.put((handle.id, key, info.etag), found)
        if number >= len(found):
            raise errors.InvalidPartNumber(
                PartNumberRequested=str(number), ActualPartCount=str(len(found) - 1)
            )
        return found[number - 1], found[number]

    async def get_object_tagging(
        self, bucket: str, key: str, version_id: str | None = None
    ) -> dict[str, str]:
        """The tags of the key's current version, or of the version named by id."""
        return await self._writer.get_tags(bucket, key, version_id)

    async def put_object_tagging(
        self, bucket: str, key: str, tags: dict[str, str], version_id: str | None = None
    ) -> None:
        """Replace the object's tags (of the version named by id); empty removes them
        (DeleteObjectTagging)."""
        await self._writer.put_tags(bucket, key, tags, version_id)

    # -- multipart uploads -----------------------------------------------------------------

    async def create_multipart_upload(
        self, bucket: str, key: str, attrs: WriteAttrs, access_key: str | None
    ) -> str:
        check_encryption(self._shared.writable(bucket), attrs.encryption)
        return await self.multipart.create(bucket, key, attrs, access_key)

    async def upload_part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        body: AsyncIterator[bytes],
        size: int,
    ) -> PartInfo:
        return await self.multipart.upload_part(bucket, key, upload_id, part_number, body, size)

    async def upload_part_copy(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        source: CopySource,
        caller: Caller | None = None,
    ) -> tuple[ObjectInfo, PartInfo]:
        """The source's info and the part's."""
        self._check_caller(caller, _source_action(source), source.bucket, source.key)
        return await self.multipart.upload_part_copy(bucket, key, upload_id, part_number, source)

    async def complete_multipart_upload(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        parts: list[tuple[int, str]],
        cond: WriteConditions = WriteConditions(),  # noqa: B008 - frozen, so shared safely
    ) -> ObjectInfo:
        """parts: (part number, ETag) as the client lists them; cond: If-Match and
        If-None-Match of the complete, as on PutObject."""
        return await self.multipart.complete(bucket, key, upload_id, parts, cond)

    async def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        await self.multipart.abort(bucket, key, upload_id)

    async def list_parts(
        self, bucket: str, key: str, upload_id: str, marker: int, max_parts: int
    ) -> PartListing:
        return await self.multipart.list_parts(bucket, key, upload_id, marker, max_parts)


def _source_action(source: CopySource) -> str:
    """The action a copy's source is read as: a version named by id is s3:GetObjectVersion,
    as a GET of it is."""
    return "s3:GetObject" if source.version_id is None else "s3:GetObjectVersion"
