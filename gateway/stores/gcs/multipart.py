"""S3 multipart uploads on GCS: parts are hidden objects under `<prefix>/.s3gw-uploads/<id>/`,
joined by compose (a tree of them past 32 parts) and then deleted."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gateway.stores.base import (
    InvalidPart,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    UploadNotFound,
    VersionChanged,
    WriteAttrs,
)
from gateway.stores.etags import bare, check_part_number, check_part_order, multipart_etag
from gateway.stores.gcs.client import Client
from gateway.stores.gcs.resources import (
    ETAG_KEY,
    HIDDEN,
    KEY_KEY,
    etag_of,
    object_info,
    resource_for,
)
from gateway.stores.gcs.writes import MARKER, Writes

COMPOSE_MAX = 32  # sources one compose call takes
# Ids are ours (token_hex); anything else could name objects outside the upload's folder.
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")


class Uploads:
    """Multipart uploads of the GCS store, by the Store's method names (attrs are taken at
    completion, when the object appears): parts are written, and joined, by the store's
    `Writes`."""

    def __init__(self, client: Client, writes: Writes) -> None:
        self.client, self.writes = client, writes

    def _folder(self, upload_id: str) -> str:
        if not _UPLOAD_ID.fullmatch(upload_id):
            raise UploadNotFound(f"{upload_id!r} is no upload id of this store")
        return f"{self.client.prefix}{HIDDEN}{upload_id}/"

    async def create_multipart(self, key: str, attrs: WriteAttrs) -> str:
        self.client.writable(key)
        upload_id = secrets.token_hex(16)
        marker = self._folder(upload_id) + MARKER
        # The key is kept with the marker: parts and completions for another key are refused.
        resource = resource_for(marker, WriteAttrs(), {KEY_KEY: key})
        await self.writes.upload(marker, bytearray(), resource, {"ifGenerationMatch": "0"}, key)
        return upload_id

    async def _open_upload(self, key: str, upload_id: str) -> str:
        """The upload's folder; UploadNotFound unless it was made for this key and is open."""
        folder = self._folder(upload_id)
        reply = await self.client.call("GET", self.client.object_url(folder + MARKER))
        if reply.status == 404:
            raise UploadNotFound(f"{upload_id}: no such upload")
        if reply.status != 200:
            raise self.client.fail(reply, key)
        if (reply.body.get("metadata") or {}).get(KEY_KEY) != key:
            raise UploadNotFound(f"{upload_id} is no upload of {key!r}")
        return folder

    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        check_part_number(part_number)
        folder = await self._open_upload(key, upload_id)
        # A part is written like an object: atomically, so a failed body keeps the previous
        # part of that number.
        made = await self.writes.write(
            f"{folder}{part_number:05d}", body, size, WriteAttrs(), {}, key
        )
        return PartInfo(part_number, etag_of(made), size)

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
        dst = self.client.writable(key)
        folder = await self._open_upload(key, upload_id)
        check_part_order(parts)
        # ifGenerationMatch on the compose that makes the object: atomic at the store.
        cond = await self.writes.condition(key, if_match, if_none_match)
        if if_none_match:
            # Asked first too: fake-gcs-server ignores ifGenerationMatch=0 on a compose.
            try:
                await self.client.resource(key)
            except ObjectNotFound:
                pass
            else:
                raise PreconditionFailed(f"{key} exists")
        staged = {o["name"]: o for o in await self.client.objects(folder)}
        sources: list[tuple[str, str]] = []
        for part in parts:
            held = staged.get(f"{folder}{part.part_number:05d}")
            if held is None:
                raise InvalidPart(f"part {part.part_number} was not uploaded")
            if bare(etag_of(held)) != bare(part.etag):
                raise InvalidPart(f"part {part.part_number} has ETag {etag_of(held)}")
            # Pinned: a part uploaded again while we compose is not silently taken instead.
            sources.append((held["name"], str(held["generation"])))
        etag = multipart_etag([p.etag for p in parts])
        resource = resource_for(dst, attrs, {ETAG_KEY: etag})
        try:
            made = await self._compose_tree(folder, sources, resource, cond)
        except VersionChanged:
            if cond:  # the object's condition, or a part's pin: which one failed
                await self.writes.condition(key, if_match, if_none_match)
            raise InvalidPart(f"{upload_id}: a part changed while being joined") from None
        # Only after the object is there: a failure before leaves hidden temporaries, never
        # a half object, and the upload can still be completed or aborted.
        await self.writes.drop(folder)
        info = object_info(key, made)
        return replace(info, checksums={**attrs.checksums, **info.checksums})

    async def _compose_tree(
        self,
        folder: str,
        sources: list[tuple[str, str]],
        resource: dict[str, Any],
        cond: Mapping[str, str],
    ) -> dict[str, Any]:
        """Compose takes 32 sources: join them 32 at a time into hidden intermediates, level
        by level, until one call can make the object."""
        level = 0
        while len(sources) > COMPOSE_MAX:
            joined: list[tuple[str, str]] = []
            for i in range(0, len(sources), COMPOSE_MAX):
                name = f"{folder}c{level}-{i // COMPOSE_MAX:05d}"
                group = sources[i : i + COMPOSE_MAX]
                made = await self.writes.compose(group, {"name": name}, name, pinned=True)
                joined.append((name, str(made["generation"])))
            sources, level = joined, level + 1
        return await self.writes.compose(
            sources, resource, resource["name"], pinned=True, cond=cond
        )

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            folder = await self._open_upload(key, upload_id)
        except UploadNotFound:
            return
        await self.writes.drop(folder)
