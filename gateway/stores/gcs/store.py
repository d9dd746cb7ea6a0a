"""The `gs://bucket[/prefix]` under-store: Google Cloud Storage through its JSON API over
aiohttp. Requests, retries and errors are the `client`'s; writes are in `writes`, multipart
uploads in `multipart`, listings in `listing`; options, stat and ranged reads here."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping
from dataclasses import replace
from urllib.parse import SplitResult, unquote, urlsplit

import aiohttp

from gateway.stores import base as store_base
from gateway.stores.base import (
    InvalidVersionId,
    ListPage,
    ListRequest,
    NoSuchVersion,
    ObjectInfo,
    ObjectNotFound,
    StoreError,
    StoreRejected,
    StoreUnavailable,
    VersionChanged,
    VersionDeleted,
    VersionsPage,
    check_range,
    kept,
)
from gateway.stores.delegating import DelegatingStore
from gateway.stores.etags import bare
from gateway.stores.gcs.auth import credentials_from
from gateway.stores.gcs.client import TRANSPORT, Client, Settings
from gateway.stores.gcs.listing import list_page, list_versions
from gateway.stores.gcs.multipart import Uploads
from gateway.stores.gcs.resources import TAGS_KEY, etag_of, object_info, tags_value
from gateway.stores.gcs.writes import Writes
from gateway.stores.listing import resume_after
from gateway.stores.retry import SYSTEM_CLOCK, Clock

# Large enough that per-chunk overhead vanishes, small enough to start streaming early.
CHUNK_SIZE = 512 * 1024
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
OPTIONS = frozenset(
    {
        "endpoint",
        "project",
        "credentials_file",
        "credentials_json",
        "access_token",
        "max_attempts",
        "connect_timeout",
        "read_timeout",
        "retry_deadline",
    }
)


class GcsStore(DelegatingStore):
    """Objects under `prefix` in one GCS bucket (or an emulator's, at the `endpoint` option).

    A mount prefix names a folder: 'gs://b/pre/fix' holds 'pre/fix/<key>', never 'pre/fixture'.
    """

    scheme = "gs"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        options: Mapping[str, str] | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ):
        options = dict(options or {})
        unknown = set(options) - OPTIONS
        if unknown:
            raise ValueError(f"unknown gcs store options: {', '.join(sorted(unknown))}")
        self.bucket = bucket
        prefix = prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.endpoint = _endpoint(options.get("endpoint") or DEFAULT_ENDPOINT)
        settings = Settings(
            max_attempts=int(_positive(options, "max_attempts", 5)),
            retry_deadline=_positive(options, "retry_deadline", 30),
            connect_timeout=_positive(options, "connect_timeout", 5),
            read_timeout=_positive(options, "read_timeout", 30),
        )
        credentials = credentials_from(options, clock)
        self.client = Client(bucket, self.prefix, self.endpoint, credentials, settings, clock)
        self.writes = Writes(self.client, options.get("project") or None)
        self.uploads = Uploads(self.client, self.writes)

    def __repr__(self) -> str:
        return f"GcsStore({self.client!r})"

    async def close(self) -> None:
        await self.client.close()

    # -- reads -------------------------------------------------------------------------------

    async def stat(self, key: str) -> ObjectInfo:
        return object_info(key, await self.client.resource(key))

    async def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        generation = None
        if if_match is not None:
            # GCS ETags are not our ETags: the version is found by one, then read by the other.
            current = await self.client.resource(key)
            if bare(etag_of(current)) != bare(if_match):
                raise VersionChanged(f"{key}: is {etag_of(current)}, not {if_match}")
            generation = str(current["generation"])
        elif end is not None and end <= start:
            await self.client.resource(key)  # no bytes, but a missing key must be reported
        if end is not None and end <= start:
            return
        async with contextlib.aclosing(self._media(key, start, end, generation, False)) as body:
            async for chunk in body:
                yield chunk

    async def _media(
        self, key: str, start: int, end: int | None, generation: str | None, addressed: bool
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the key (of that generation: a version named by id when
        `addressed`, else the one an ETag was found to be), checked before any is used."""
        query = {"alt": "media"}
        if generation is not None:
            # fake-gcs-server honours `generation`, GCS both.
            query["generation"] = query["ifGenerationMatch"] = generation
        name = self.client.readable(key)
        headers = {"Accept-Encoding": "gzip"}  # never transcoded: the bytes as stored
        # No Range for the whole object: GCS answers 416 to any range of an empty one.
        if start > 0 or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        url = self.client.object_url(name)
        response = await self.client.send("GET", url, query, headers=headers, raw=True)
        try:
            if response.status == 416:
                return  # the range starts at or past the end: [start, end) is empty
            if response.status not in (200, 206):
                reply = await self.client.reply(response)
                if reply.status == 404 and generation is not None:
                    await self.client.resource(key)  # ObjectNotFound if it is gone altogether
                    if addressed:
                        raise NoSuchVersion(f"{key}: no generation {generation}")
                    raise VersionChanged(f"{key}: generation {generation} is gone")
                if reply.status == 404:
                    raise await self.client.missing(key)
                raise self.client.fail(reply, key)
            # The answer is of the generation asked for (a server that ignores `generation`
            # answers with the current one), and of the range (one that ignores Range sends
            # all of it): checked before a byte of it is used.
            answered_generation = response.headers.get("x-goog-generation")
            if generation is not None and answered_generation not in (None, generation):
                store_base.answer_report(self.scheme, 0, True)
                raise VersionChanged(
                    f"{key}: asked for generation {generation}, answered {answered_generation}"
                )
            answered = check_range(
                key, start, end, "Range" in headers, response.status,
                response.headers.get("Content-Range"), response.headers.get("Content-Length"),
            )  # fmt: skip
            body = kept(_chunks(response), answered, self.scheme)
            async with contextlib.aclosing(body) as chunks:
                async for chunk in chunks:
                    yield chunk
        except TRANSPORT as exc:
            raise StoreUnavailable(f"gs://{self.bucket}/{self.prefix}{key}: {exc!r}") from None
        finally:
            # Pooled only when read to the end; else the connection is closed.
            response.release()

    # -- versions: GCS's generations (versionId is the generation number) -------------------

    versions = True

    async def stat_version(self, key: str, version_id: str) -> ObjectInfo:
        generation = _generation(key, version_id)
        if generation is None:
            return replace(await self.stat(key), version_id="null")
        url = self.client.object_url(self.client.readable(key))
        reply = await self.client.call("GET", url, {"generation": generation})
        if reply.status == 404:
            missing = await self.client.missing(key)
            raise (
                NoSuchVersion(f"{key}: no generation {generation}")
                if isinstance(missing, ObjectNotFound)
                else missing
            )
        if reply.status != 200:
            raise self.client.fail(reply, key)
        if str(reply.body.get("generation")) != generation:
            raise StoreError(f"{key}: asked for generation {generation}, answered another")
        return replace(object_info(key, reply.body), version_id=generation)

    async def read_version(
        self, key: str, version_id: str, start: int, end: int, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        generation = _generation(key, version_id)
        if generation is None:
            body = self.read(key, start, end, if_match)
        elif end <= start:
            return
        else:
            body = self._media(key, start, end, generation, True)
        async with contextlib.aclosing(body) as chunks:
            async for chunk in chunks:
                yield chunk

    async def list_versions(
        self,
        prefix: str,
        delimiter: str | None,
        key_marker: str | None,
        version_marker: str | None,
        max_keys: int,
    ) -> VersionsPage:
        if version_marker is not None and not version_marker.isdigit():
            raise ValueError("a GCS version id is a generation number")
        return await list_versions(
            self.client, prefix, delimiter, key_marker, version_marker, max_keys
        )

    async def delete_version(self, key: str, version_id: str) -> VersionDeleted:
        generation = _generation(key, version_id)
        if generation is None:
            await self.delete(key)
            return VersionDeleted("null", False)
        url = self.client.object_url(self.client.readable(key))
        reply = await self.client.call("DELETE", url, {"generation": generation})
        if reply.status not in (200, 204, 404):
            raise self.client.fail(reply, key, write=True)
        return VersionDeleted(generation, False)

    async def get_versioning(self) -> str | None:
        reply = await self.client.call("GET", self.client.bucket_url())
        if reply.status != 200:
            raise self.client.fail(reply, "")
        versioning = reply.body.get("versioning")
        if not isinstance(versioning, dict):
            return None
        return "Enabled" if versioning.get("enabled") else "Suspended"

    def versioning_settable(self) -> bool:
        # Versioning is its bucket's: a mount of a prefix must not change it for the rest.
        return not self.prefix

    async def put_versioning(self, status: str) -> None:
        patch = {"versioning": {"enabled": status == "Enabled"}}
        reply = await self.client.call("PATCH", self.client.bucket_url(), json_body=patch)
        if reply.status != 200:
            raise self.client.fail(reply, "", write=True)

    # -- tags: one custom metadata key of ours (resources.TAGS_KEY) ----------------------

    async def get_tags(self, key: str, version_id: str | None = None) -> dict[str, str]:
        if version_id is not None and _generation(key, version_id) is not None:
            return dict((await self.stat_version(key, version_id)).tags or {})
        return dict((await self.stat(key)).tags or {})

    async def put_tags(
        self, key: str, tags: Mapping[str, str], version_id: str | None = None
    ) -> None:
        generation = None if version_id is None else _generation(key, version_id)
        url = self.client.object_url(self.client.readable(key))
        for _ in range(3):
            resource = await self.client.resource(key)
            if generation is not None and str(resource.get("generation")) != generation:
                # A patch of a noncurrent generation is not trusted to reach it
                # (fake-gcs-server patches the live one): only the live one is tagged.
                raise StoreRejected(f"{key}: GCS tags only the live generation here")
            # Only the metadata changes (the metageneration, not the generation or the bytes),
            # of the version read: one written meanwhile (412) is read again and tagged.
            query = {"ifGenerationMatch": str(resource.get("generation", 0))}
            patch = {"metadata": {TAGS_KEY: tags_value(tags)}}
            reply = await self.client.call("PATCH", url, query, json_body=patch)
            if reply.status == 200:
                return
            if reply.status != 412:
                raise self.client.fail(reply, key, write=True)
        raise StoreUnavailable(f"{self!r} {key!r}: overwritten while its tags were set")

    async def _list_page(self, q: ListRequest) -> ListPage:
        return await list_page(self.client, q.prefix, q.delimiter, resume_after(q), q.max_keys)


def _generation(key: str, version_id: str) -> str | None:
    """The generation a version id names; None for "null" (the current one: GCS keeps no
    version apart as S3's null version)."""
    if version_id == "null":
        return None
    if not version_id.isdigit() or len(version_id) > 20:
        raise InvalidVersionId(f"{key}: {version_id!r} is not a generation")
    return version_id


def _positive(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name)
    try:
        value = float(raw) if raw not in (None, "") else default
    except ValueError:
        raise ValueError(f"gcs store option {name} must be a number, not {raw!r}") from None
    if value <= 0:
        raise ValueError(f"gcs store option {name} must be positive")
    return value


def _endpoint(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
        raise ValueError(f"gcs store option endpoint must be http(s)://host[:port], not {url!r}")
    return url.rstrip("/")


def open_gcs(
    parts: SplitResult, options: Mapping[str, str], *, clock: Clock = SYSTEM_CLOCK
) -> GcsStore:
    """`gs://bucket[/prefix]`; `clock` times the retries."""
    bucket = parts.netloc
    if not bucket or ":" in bucket or "/" in bucket:
        raise ValueError(f"gs URI {parts.geturl()!r} needs a bucket name: gs://bucket[/prefix]")
    return GcsStore(bucket, unquote(parts.path), options, clock=clock)


async def _chunks(response: aiohttp.ClientResponse) -> AsyncGenerator[bytes, None]:
    async for chunk in response.content.iter_chunked(CHUNK_SIZE):
        yield chunk
