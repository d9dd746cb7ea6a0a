"""Writes of the GCS store: small bodies as one multipart upload, large ones as a resumable
session sent in chunks, copies through compose, deletes and buckets."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlsplit

import anyio

from gateway.stores.base import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    NoSuchVersion,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
    VersionChanged,
    WriteAttrs,
    WriteConflict,
)
from gateway.stores.etags import bare
from gateway.stores.gcs.client import Client
from gateway.stores.gcs.listing import list_page
from gateway.stores.gcs.resources import (
    ETAG_KEY,
    HIDDEN,
    b64,
    etag_of,
    gather,
    object_info,
    persisted,
    pieces,
    related,
    resource_for,
    slices,
)

log = logging.getLogger(__name__)

# Bodies up to this size are gathered in memory and sent as one multipart upload, which GCS
# (and the emulator) can make conditional and which can be sent again after a failure.
SIMPLE_LIMIT = 8 << 20
# Larger bodies go up in resumable-session chunks of this size (GCS wants multiples of
# 256 KiB): one chunk is in memory at a time, and a chunk that fails can be sent again.
CHUNK = 8 << 20
MARKER = "key"  # the object that says an upload exists, and for which key


class Writes:
    """put, copy, delete and buckets of the GCS store, over its client; also the writes that
    multipart uploads are made of (`write`, `upload`, `compose`, `drop`)."""

    def __init__(self, client: Client, project: str | None) -> None:
        self.client = client
        self.project = project  # where create_container makes the bucket

    # -- put ---------------------------------------------------------------------------------

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
        name = self.client.writable(key)
        cond = await self.condition(key, if_match, if_none_match)
        try:
            resource = await self.write(name, body, size, attrs, cond, key)
        except PreconditionFailed as exc:
            if not cond:
                raise
            # The condition held before the body: another write landed during this one.
            raise WriteConflict(str(exc)) from None
        info = object_info(key, resource)
        # The writer's checksums are complete only now when they came in a trailer.
        return replace(info, checksums={**attrs.checksums, **info.checksums})

    async def condition(
        self, key: str, if_match: str | None, if_none_match: bool
    ) -> dict[str, str]:
        """ifGenerationMatch for the write: 0 (must not exist), or the generation whose
        ETag the writer named; PreconditionFailed at once when that cannot hold (GCS would
        refuse it only once the body is sent, and a refusal then is a conflict: WriteConflict)."""
        if if_match is None:
            if not if_none_match:
                return {}
            try:
                await self.client.resource(key)
            except ObjectNotFound:
                return {"ifGenerationMatch": "0"}
            raise PreconditionFailed(f"{key} exists")
        try:
            current = await self.client.resource(key)
        except ObjectNotFound:
            raise PreconditionFailed(f"{key} does not exist") from None
        if bare(etag_of(current)) != bare(if_match) or if_none_match:
            raise PreconditionFailed(f"{key} is {etag_of(current)}, not {if_match}")
        return {"ifGenerationMatch": str(current["generation"])}

    async def write(
        self,
        name: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        cond: Mapping[str, str],
        key: str,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        if size <= SIMPLE_LIMIT:
            data = await gather(body, size, key)
            # Built after the body: checksums that came in its trailer are kept too.
            return await self.upload(name, data, resource_for(name, attrs, extra), cond, key)
        if cond.get("ifGenerationMatch") == "0":
            # GCS checks the condition when the session completes; fake-gcs-server never does.
            # Asking first also spares sending a body that is bound to be refused.
            try:
                await self.client.resource(key)
            except ObjectNotFound:
                pass
            else:
                raise PreconditionFailed(f"{key} exists")
        return await self._resumable(name, body, size, resource_for(name, attrs, extra), cond, key)

    async def upload(
        self,
        name: str,
        data: bytearray,
        resource: dict[str, Any],
        cond: Mapping[str, str],
        key: str,
    ) -> dict[str, Any]:
        """One multipart/related request: the resource, then the bytes (GCS checks the MD5)."""
        md5 = hashlib.md5(data, usedforsecurity=False).digest()
        headers, head, tail = related({**resource, "md5Hash": b64(md5)}, len(data))
        query = {"uploadType": "multipart", **cond}
        reply = await self.client.call(
            "POST",
            self._upload_url(),
            query,
            headers=headers,
            data=lambda: slices(head, data, tail),
        )
        if reply.status != 200:
            raise self.client.fail(reply, key, write=True)
        return reply.body

    def _upload_url(self) -> str:
        return f"{self.client.endpoint}/upload/storage/v1/b/{self.client.bucket}/o"

    async def _resumable(
        self,
        name: str,
        body: AsyncIterator[bytes],
        size: int,
        resource: dict[str, Any],
        cond: Mapping[str, str],
        key: str,
    ) -> dict[str, Any]:
        headers = {
            "X-Upload-Content-Length": str(size),
            "X-Upload-Content-Type": resource.get("contentType") or "application/octet-stream",
        }
        query = {"uploadType": "resumable", "name": name, **cond}
        reply = await self.client.call(
            "POST", self._upload_url(), query, json_body=resource, headers=headers
        )
        if reply.status != 200 or "Location" not in reply.headers:
            raise self.client.fail(reply, key, write=True)
        # Sent to our endpoint whatever host the answer names: an emulator behind a proxy
        # names itself, and a session URI is never a reason to talk to another host.
        location = urlsplit(reply.headers["Location"])
        session = f"{self.client.endpoint}{location.path}?{location.query}"
        md5 = hashlib.md5(usedforsecurity=False)
        done: dict[str, Any] | None = None
        try:
            offset = 0
            async with contextlib.aclosing(pieces(body, size, CHUNK, key)) as cut:
                async for piece in cut:
                    if done is not None:  # finished early: it holds fewer bytes than the body
                        raise StoreError(f"{key}: GCS ended the upload after {offset} bytes")
                    md5.update(piece)
                    done = await self._chunk(session, piece, offset, size, key)
                    offset += len(piece)
                    piece.clear()  # freed before the next piece is gathered
        except BaseException:
            await self._cancel(session)
            raise
        if done is None or int(done.get("size", size)) != size:
            raise StoreUnavailable(f"{key}: GCS did not finish the upload of {size} bytes")
        if done.get("md5Hash") and done["md5Hash"] != b64(md5.digest()):
            raise StoreError(f"{key}: GCS holds other bytes than were sent (MD5 differs)")
        return done

    async def _chunk(
        self, session: str, piece: bytearray, offset: int, size: int, key: str
    ) -> dict[str, Any] | None:
        """Send bytes [offset, offset+len(piece)) of the upload; the object once the last
        piece is in. After a failure the session is asked what it holds, and only the rest
        is sent again: GCS may have kept part of a chunk."""
        end = offset + len(piece)
        start = offset
        backoff = self.client.backoff()
        while True:
            headers = {
                "Content-Range": f"bytes {start}-{end - 1}/{size}",
                "Content-Length": str(end - start),
            }
            try:
                reply = await self.client.call(
                    "PUT",
                    session,
                    headers=headers,
                    data=functools.partial(slices, piece, start=start - offset),
                    retry=False,
                )
            except StoreUnavailable:
                if not await backoff.pause():
                    raise
                status = {"Content-Range": f"bytes */{size}", "Content-Length": "0"}
                reply = await self.client.call("PUT", session, headers=status)
            if reply.status in (200, 201):
                return reply.body
            if reply.status in (404, 410):  # the session expired or was cancelled
                raise StoreUnavailable(f"{key}: the upload session is gone ({reply.status})")
            if reply.status != 308:
                raise self.client.fail(reply, key, write=True)
            held = persisted(reply.headers.get("Range"))
            if held >= end:
                return None
            if held < offset:
                raise StoreUnavailable(f"{key}: the upload session lost bytes it had taken")
            if held == start and not await backoff.pause():
                raise StoreUnavailable(f"{key}: GCS kept none of bytes {start}-{end - 1}")
            start = held

    async def _cancel(self, session: str) -> None:
        # Shielded: the write failed or was cancelled, and the session must not linger.
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            try:
                await self.client.call("DELETE", session, retry=False)
            except StoreError as exc:
                log.info("resumable session not cancelled: %s", exc)

    # -- delete and copy ---------------------------------------------------------------------

    async def delete(self, key: str) -> None:
        if not key or key.startswith(HIDDEN):
            return
        reply = await self.client.call("DELETE", self.client.object_url(self.client.prefix + key))
        if reply.status not in (200, 204, 404):
            raise self.client.fail(reply, key, write=True)

    async def copy(
        self,
        src_key: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        *,
        if_match: str | None = None,
        version_id: str | None = None,
    ) -> ObjectInfo:
        dst = self.client.writable(dst_key)
        if version_id is not None and version_id != "null":
            return await self._copy_generation(src_key, version_id, dst, dst_key, attrs)
        source = await self.client.resource(src_key)
        src = object_info(src_key, source)
        if if_match is not None and bare(src.etag) != bare(if_match):
            raise VersionChanged(f"{src_key}: is {src.etag}, not {if_match}")
        keep = WriteAttrs.of(src) if attrs is None else attrs
        # The bytes are the source's, and so are their checksums and ETag (kept with the copy:
        # compose makes no MD5).
        keep = replace(keep, checksums={**src.checksums, **keep.checksums})
        resource = resource_for(dst, keep, {ETAG_KEY: src.etag})
        sources = [(self.client.prefix + src_key, str(source["generation"]))]
        made = await self.compose(sources, resource, src_key, pinned=if_match is not None)
        return object_info(dst_key, made)

    async def _copy_generation(
        self, src_key: str, generation: str, dst: str, dst_key: str, attrs: WriteAttrs | None
    ) -> ObjectInfo:
        """A copy of one generation of the source (a version named by id): GCS's copyTo with
        sourceGeneration, which names the bytes copied (compose's pin on a source's
        generation is not honoured by fake-gcs-server, so it is not trusted for this)."""
        url = self.client.object_url(self.client.readable(src_key))
        reply = await self.client.call("GET", url, {"generation": generation})
        if reply.status == 404:
            raise NoSuchVersion(f"{src_key}: no generation {generation}")
        if reply.status != 200:
            raise self.client.fail(reply, src_key)
        src = object_info(src_key, reply.body)
        keep = WriteAttrs.of(src) if attrs is None else attrs
        keep = replace(keep, checksums={**src.checksums, **keep.checksums})
        resource = resource_for(dst, keep, {ETAG_KEY: src.etag})
        body = {k: v for k, v in resource.items() if k not in ("crc32c", "md5Hash", "name")}
        target = f"{url}/copyTo/b/{self.client.bucket}/o/{quote(dst, safe='')}"
        reply = await self.client.call(
            "POST", target, {"sourceGeneration": generation}, json_body=body
        )
        if reply.status == 404:
            raise NoSuchVersion(f"{src_key}: no generation {generation}")
        if reply.status != 200:
            raise self.client.fail(reply, dst_key, write=True)
        return object_info(dst_key, reply.body)

    async def compose(
        self,
        sources: Sequence[tuple[str, str]],
        resource: dict[str, Any],
        key: str,
        *,
        pinned: bool = False,
        cond: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One compose call; each source pinned to its generation (fake-gcs-server ignores
        that pin, which is why callers check versions before)."""
        body = {
            "sourceObjects": [
                {"name": n, "generation": g, "objectPreconditions": {"ifGenerationMatch": g}}
                for n, g in sources
            ],
            # GCS computes the hashes of what compose makes; the source's are no claim on it.
            "destination": {k: v for k, v in resource.items() if k not in ("crc32c", "md5Hash")},
        }
        url = self.client.object_url(resource["name"]) + "/compose"
        reply = await self.client.call("POST", url, cond or None, json_body=body)
        if reply.status == 200:
            return reply.body
        if reply.status in (404, 412) and pinned:
            raise VersionChanged(f"{key}: changed while being copied")
        if reply.status == 404:
            raise ObjectNotFound(key)
        raise self.client.fail(reply, key, write=True)

    async def drop(self, folder: str) -> None:
        """Delete every object under a hidden folder, an upload's marker first: the upload is
        gone for new parts before its parts are."""
        await self._delete_name(folder + MARKER)
        names = [o["name"] for o in await self.client.objects(folder)]
        limit = anyio.CapacityLimiter(8)

        async def drop(name: str) -> None:
            async with limit:
                await self._delete_name(name)

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(drop, name)

    async def _delete_name(self, name: str) -> None:
        reply = await self.client.call("DELETE", self.client.object_url(name))
        if reply.status not in (200, 204, 404):
            raise self.client.fail(reply, name[len(self.client.prefix) :], write=True)

    # -- the bucket itself -------------------------------------------------------------------

    async def create_container(self) -> None:
        """Create the bucket (in the `project` option's project); ContainerExists if it is there."""
        bucket = self._whole_bucket()
        query = {"project": self.project} if self.project else {}
        url = f"{self.client.endpoint}/storage/v1/b"
        reply = await self.client.call("POST", url, query, json_body={"name": bucket})
        if reply.status == 409:
            raise ContainerExists(f"bucket {bucket!r} exists")
        if reply.status != 200:
            raise self.client.fail(reply, "", write=True)

    async def delete_container(self) -> None:
        """Delete the bucket if it holds no objects; unfinished uploads go with it."""
        bucket = self._whole_bucket()
        url = self.client.bucket_url()
        if (await self.client.call("GET", url)).status == 404:
            raise ContainerNotFound(f"bucket {bucket!r} does not exist")
        page = await list_page(self.client, "", None, "", 1)
        if page.objects or page.common_prefixes:
            raise ContainerNotEmpty(f"bucket {bucket!r} is not empty")
        await self.drop(HIDDEN)
        reply = await self.client.call("DELETE", url)
        if reply.status == 404:
            raise ContainerNotFound(f"bucket {bucket!r} does not exist")
        # GCS says 409, fake-gcs-server 412, to a bucket that still holds objects.
        if reply.status in (409, 412):
            raise ContainerNotEmpty(f"bucket {bucket!r} is not empty")
        if reply.status not in (200, 204):
            raise self.client.fail(reply, "", write=True)

    def _whole_bucket(self) -> str:
        if self.client.prefix:
            raise ValueError(f"a bucket URI names no prefix: gs://{self.client.bucket}")
        return self.client.bucket
