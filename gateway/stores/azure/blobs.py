"""The blob client of the az:// store: one container's blobs under a prefix, over `wire`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx

from gateway.stores.azure.metadata import Found, etag_of, read_metadata, same_etag
from gateway.stores.azure.wire import AzureError, Transport
from gateway.stores.base import (
    InvalidPart,
    KeyTooLong,
    MetadataTooLarge,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    StoreRejected,
    StoreUnavailable,
    UnsupportedKey,
    VersionChanged,
    WriteAttrs,
    check_range,
    kept,
)

# Large enough that per-chunk overhead vanishes, small enough to start streaming early.
CHUNK_SIZE = 512 * 1024
# Azure's limits on a blob name: characters and path segments.
MAX_NAME, MAX_SEGMENTS = 1024, 254


def utc(value: str) -> datetime:
    return parsedate_to_datetime(value).astimezone(UTC)


class Blobs:
    """The blobs under `prefix` in one container, over the retried, authorized transport:
    names to request paths, Azure's error answers to the typed store errors, and a blob's
    headers to its ObjectInfo."""

    def __init__(self, account: str, container: str, prefix: str, transport: Transport) -> None:
        self.account, self.container, self.prefix = account, container, prefix
        self.transport = transport

    def __repr__(self) -> str:
        where = f"az://{self.account}/{self.container}/{self.prefix}"
        return f"AzureStore({where} at {self.transport.origin})"

    async def close(self) -> None:
        await self.transport.close()

    def error(self, exc: AzureError, key: str) -> StoreError:
        """A read's typed error; messages carry the blob's place, never a credential."""
        where = f"az://{self.account}/{self.container}/{self.prefix}{key}"
        if exc.code == "ContainerNotFound":
            # The mount points at a container that is not there: a misconfiguration, not a miss.
            return StoreMissing(f"azure container {self.container!r} does not exist")
        if exc.status == 404:
            return ObjectNotFound(key)
        if exc.status in (401, 403):
            return StoreAccessDenied(f"{where}: {exc.code}")
        if exc.status == 412:
            return VersionChanged(f"{where}: ETag no longer matches")
        if exc.status >= 500 or exc.status in (408, 429):
            return StoreUnavailable(f"{where}: Azure answered {exc.status} {exc.code}")
        if exc.code == "MetadataTooLarge":
            return MetadataTooLarge("more than Azure keeps with a blob")
        if 400 <= exc.status < 500:
            return StoreRejected(f"{where}: Azure answered {exc.status} {exc.code}")
        return StoreError(f"{where}: Azure answered {exc.status} {exc.code}")

    # -- stat and read -----------------------------------------------------------------------

    async def find(self, key: str) -> Found:
        path = self.path(key, reading=True)
        try:
            response = await self.transport.send("HEAD", path)
        except AzureError as exc:
            raise self.error(exc, key) from None
        return self._found(key, response.headers)

    def _found(self, key: str, h: httpx.Headers) -> Found:
        meta = {k[10:]: v for k, v in h.items() if k.lower().startswith("x-ms-meta-")}
        md5 = h.get("x-ms-blob-content-md5") or h.get("content-md5")
        total = h.get("content-range", "").rpartition("/")[2] or h.get("content-length", "0")
        user, expires, checksums = read_metadata(meta)
        info = ObjectInfo(
            key=key,
            size=int(total),
            etag=etag_of(meta, md5, h["etag"]),
            last_modified=utc(h["last-modified"]),
            content_type=h.get("content-type"),
            content_encoding=h.get("content-encoding"),
            content_disposition=h.get("content-disposition"),
            content_language=h.get("content-language"),
            cache_control=h.get("cache-control"),
            expires=expires,
            metadata=user,
            checksums=checksums,
            tag_count=int(h.get("x-ms-tag-count") or 0),
        )
        return Found(info, h["etag"])

    async def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        if end is not None and end <= start:
            # No bytes to send, but a missing key or a changed version must still be reported.
            await self._check(key, if_match)
            return
        headers = {}
        # No range for the whole object: Azure answers 416 to any range of an empty blob.
        if start > 0 or end is not None:
            headers["x-ms-range"] = f"bytes={start}-{'' if end is None else end - 1}"
        path = self.path(key, reading=True)
        try:
            response = await self.transport.send("GET", path, headers=headers, stream=True)
        except AzureError as exc:
            if exc.status == 416:
                # The range starts at or past the end, so [start, end) is empty; the blob is
                # there, but a version asked for must still be checked.
                if if_match is not None:
                    await self._check(key, if_match)
                return
            raise self.error(exc, key) from None
        try:
            # Checked on this very answer, so the bytes that follow are of the version asked
            # for: our ETag is not Azure's, and an If-Match with ours would always fail.
            if if_match is not None and not same_etag(
                self._found(key, response.headers).info.etag, if_match
            ):
                raise VersionChanged(f"{key}: is no longer {if_match}")
            # And the range: a server that ignores it answers 200 with the whole blob.
            h = response.headers
            answered = check_range(
                key, start, end, "x-ms-range" in headers, response.status_code,
                h.get("content-range"), h.get("content-length"),
            )  # fmt: skip
            async with contextlib.aclosing(kept(_body(response, key), answered, "az")) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            # Closes the connection rather than pooling it when the body was not read to the end.
            await response.aclose()

    async def _check(self, key: str, if_match: str | None) -> None:
        info = (await self.find(key)).info
        if if_match is not None and not same_etag(info.etag, if_match):
            raise VersionChanged(f"{key}: is no longer {if_match}")

    def path(self, key: str, *, reading: bool = False) -> str:
        """The blob's encoded path. Keys with '.' or '..' segments would be resolved by URL
        normalization and Azure turns '\\' into '/': either could leave the mount's prefix."""
        segments = key.split("/")
        if not key or "\\" in key or "." in segments or ".." in segments:
            raise ObjectNotFound(key) if reading else UnsupportedKey(f"{key!r}: not a blob name")
        name = self.prefix + key
        if len(name) > MAX_NAME or name.count("/") >= MAX_SEGMENTS:
            raise KeyTooLong(
                f"with the mount's prefix it is {len(name)} characters in"
                f" {name.count('/') + 1} segments, and Azure holds blob names of at most"
                f" {MAX_NAME} characters in {MAX_SEGMENTS} segments"
            )
        try:
            return f"/{self.container}/" + quote(self.prefix + key, safe="/~")
        except UnicodeEncodeError:
            raise (
                ObjectNotFound(key) if reading else UnsupportedKey(f"{key!r}: not UTF-8")
            ) from None

    async def send(
        self,
        key: str,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        content: Any = None,
        *,
        conditional: bool = False,
    ) -> httpx.Response:
        try:
            return await self.transport.send(method, path, query, headers, content)
        except AzureError as exc:
            if exc.status == 412 or (
                conditional and exc.code in ("BlobNotFound", "BlobAlreadyExists")
            ):
                raise PreconditionFailed(f"{key}: {exc.code}") from None
            if exc.code in ("InvalidBlockList", "InvalidBlockId"):
                raise InvalidPart(f"{key}: {exc.code}") from None
            raise self.error(exc, key) from None

    def written(
        self, key: str, size: int, etag: str, attrs: WriteAttrs, response: httpx.Response
    ) -> ObjectInfo:
        try:
            when = parsedate_to_datetime(response.headers["last-modified"]).astimezone(UTC)
        except (KeyError, TypeError, ValueError):
            when = datetime.now(UTC)
        # Azure keeps metadata names in lower case; a trailer's checksums are complete only now.
        lowered = {k.lower(): v for k, v in attrs.metadata.items()}
        return replace(attrs, metadata=lowered).info(key, size, etag, when)


async def _body(response: httpx.Response, key: str) -> AsyncGenerator[bytes, None]:
    chunks = response.aiter_raw(CHUNK_SIZE)
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except httpx.TransportError as exc:
            raise StoreUnavailable(f"{key}: read cut short: {type(exc).__name__}") from None
        yield chunk
