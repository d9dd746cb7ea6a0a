"""The `s3://bucket[/prefix]` under-store: any S3-compatible origin, through aiobotocore."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncGenerator, Mapping
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any
from urllib.parse import SplitResult, unquote

import aiohttp
from aiobotocore.session import AioSession, get_session
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from botocore.handlers import add_expect_header
from botocore.utils import parse_timestamp as botocore_parse_timestamp

from gateway.stores.base import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    InvalidPart,
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    UploadNotFound,
    VersionChanged,
)
from gateway.stores.s3_body import checksums_of
from gateway.stores.s3_get import FastGet, body_chunks
from gateway.stores.s3_write import S3Writes

log = logging.getLogger("gateway.stores")

# Large enough that per-chunk overhead vanishes, small enough to start streaming early.
CHUNK_SIZE = 512 * 1024

OPTIONS = frozenset(
    {
        "endpoint_url",
        "region",
        "access_key",
        "secret_key",
        "session_token",
        "addressing_style",
        "max_attempts",
        "connect_timeout",
        "read_timeout",
    }
)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}
_TRANSPORT_ERRORS = (BotoCoreError, aiohttp.ClientError, asyncio.TimeoutError, OSError)
_PRECONDITION = {"PreconditionFailed", "ConditionalRequestConflict"}
_BAD_PARTS = {"InvalidPart", "InvalidPartOrder", "EntityTooSmall"}
_EXISTS = {"BucketAlreadyExists", "BucketAlreadyOwnedByYou"}


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or _status(exc))


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


class S3Store(S3Writes):
    """Objects under `prefix` in one bucket of an S3-compatible origin.

    A mount prefix names a folder: 's3://b/pre/fix' holds 'pre/fix/<key>', never 'pre/fixture'.
    """

    scheme = "s3"
    _failures = (ClientError, *_TRANSPORT_ERRORS)

    def __init__(self, bucket: str, prefix: str = "", options: Mapping[str, str] | None = None):
        options = dict(options or {})
        unknown = set(options) - OPTIONS
        if unknown:
            raise ValueError(f"unknown s3 store options: {', '.join(sorted(unknown))}")
        if bool(options.get("access_key")) != bool(options.get("secret_key")):
            raise ValueError("s3 store options need both access_key and secret_key, or neither")
        self.bucket = bucket
        prefix = prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self._options = options
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._fast: FastGet | None = None
        self._lock = asyncio.Lock()
        self._bucket_seen = False

    def __repr__(self) -> str:
        where = self._options.get("endpoint_url", "aws")
        return f"S3Store(s3://{self.bucket}/{self.prefix} at {where})"

    def _config(self) -> Config:
        o = self._options
        style = o.get("addressing_style") or ("path" if o.get("endpoint_url") else "auto")
        return Config(
            region_name=o.get("region") or "us-east-1",
            connect_timeout=float(o.get("connect_timeout", 5)),
            read_timeout=float(o.get("read_timeout", 30)),
            max_pool_connections=64,
            # total_max_attempts counts the first try; the retries dict's max_attempts does not.
            retries={"mode": "standard", "total_max_attempts": int(o.get("max_attempts", 3))},
            # No payload signing (UNSIGNED-PAYLOAD): bodies are streamed, and a SigV4 payload
            # hash would need the whole body before its first byte is sent. TLS, and the
            # checksum a writer gives (which the origin verifies), protect the bytes.
            s3={"addressing_style": style, "payload_signing_enabled": False},
            # Checksums only where the API demands them: blocks are ranged reads, which S3 gives
            # no checksum for, and CRC of every full GET in Python costs CPU on the miss path.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )

    async def _s3(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    o = self._options
                    session = _session()
                    creator = session.create_client(
                        "s3",
                        endpoint_url=o.get("endpoint_url") or None,
                        aws_access_key_id=o.get("access_key") or None,
                        aws_secret_access_key=o.get("secret_key") or None,
                        aws_session_token=o.get("session_token") or None,
                        config=self._config(),
                    )
                    client = await self._stack.enter_async_context(creator)
                    # No "Expect: 100-continue": aiohttp leaves the failure of such a request on
                    # a pooled connection the origin has closed in a task nobody awaits; without
                    # it that failure is an ordinary one, retried while the body can be resent.
                    client.meta.events.unregister("before-call.s3", add_expect_header)
                    self._fast = await self._fast_get(client)
                    self._client = client
        return self._client

    async def _fast_get(self, client: Any) -> FastGet | None:
        """Reads without botocore's pipeline (s3_get.py), where the credentials are static."""
        o = self._options
        if not o.get("access_key"):
            return None
        probe = "k"
        url = await client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": probe}
        )
        base = url.split("?", 1)[0]
        if not base.endswith("/" + probe):
            return None
        return FastGet(
            base[: -len(probe)],
            client.meta.region_name,
            Credentials(o["access_key"], o["secret_key"], o.get("session_token") or None),
            connect_timeout=client.meta.config.connect_timeout,
            read_timeout=client.meta.config.read_timeout,
        )

    async def _get(
        self, key: str, args: dict[str, str]
    ) -> tuple[Mapping[str, Any], AsyncGenerator[bytes, None]]:
        """GetObject: (the answer's fields, its body as an async generator of chunks) or
        botocore's ClientError / transport errors."""
        client = await self._s3()
        fast = self._fast
        if fast is not None:
            headers = {"Range": args["Range"]} if "Range" in args else {}
            if "IfMatch" in args:
                headers["If-Match"] = args["IfMatch"]
            answered = await fast.get(self.prefix + key, headers)
            if answered is not None:
                found, response = answered
                return found, body_chunks(response, CHUNK_SIZE)
        response = await client.get_object(Bucket=self.bucket, Key=self.prefix + key, **args)
        if fast is not None and fast.refused and self._fast is fast:
            # Refused what botocore was given: the lean GET is built wrong for this origin (a
            # region, an endpoint, a proxy that rewrites paths). Stop paying for it twice.
            log.warning("%r: lean GETs refused where botocore's succeed; using botocore", self)
            self._fast = None
            await fast.close()
        return response, _botocore_chunks(response["Body"])

    async def prepare(self) -> None:
        """Load botocore's S3 models on a thread, then make the client, so that neither the
        event loop nor the first miss pays for it (~0.1-0.5 s here)."""
        await asyncio.to_thread(_load_models)
        await self._s3()

    async def close(self) -> None:
        client, self._client = self._client, None
        fast, self._fast = self._fast, None
        if fast is not None:
            await fast.close()
        if client is not None:
            await self._stack.aclose()
            self._stack = contextlib.AsyncExitStack()

    # -- errors ------------------------------------------------------------------------------

    def _error(self, exc: Exception, key: str) -> StoreError:
        """One of our typed errors for a botocore/aiohttp failure; messages carry no secrets."""
        where = f"s3://{self.bucket}/{self.prefix}{key}"
        if isinstance(exc, NoCredentialsError):
            return StoreAccessDenied(f"{where}: no credentials configured for the mount")
        if not isinstance(exc, ClientError):
            return StoreUnavailable(f"{where}: origin unreachable: {type(exc).__name__}: {exc}")
        code, status = _code(exc), _status(exc)
        if code == "NoSuchBucket":
            # The mount points at a bucket that is not there: a misconfiguration, not a miss.
            return StoreUnavailable(f"origin bucket {self.bucket!r} does not exist")
        if code in _NOT_FOUND:
            return ObjectNotFound(key)
        if code in _DENIED or status == 403:
            return StoreAccessDenied(f"{where}: {code}")
        if code == "PreconditionFailed" or status == 412:
            return VersionChanged(f"{where}: ETag no longer matches")
        if status >= 500 or status in (301, 307, 429) or code == "SlowDown":
            return StoreUnavailable(f"{where}: origin answered {status} {code}")
        return StoreError(f"{where}: origin answered {status} {code}")

    def _write_error(
        self, exc: Exception, key: str, *, conditional: bool = False, container: bool = False
    ) -> StoreError:
        """As _error, for writes: preconditions, uploads and buckets have errors of their own."""
        if isinstance(exc, ClientError):
            where = f"s3://{self.bucket}/{self.prefix}{key}"
            code, status = _code(exc), _status(exc)
            if code in _PRECONDITION or status == 412:
                return PreconditionFailed(f"{where}: {code}")
            if conditional and code in _NOT_FOUND:
                return PreconditionFailed(f"{where}: does not exist")
            if code == "NoSuchUpload":
                return UploadNotFound(f"{where}: no such upload")
            if code in _BAD_PARTS:
                return InvalidPart(f"{where}: {code}")
            if container and code in _EXISTS:
                return ContainerExists(f"bucket {self.bucket!r} exists")
            if container and code == "BucketNotEmpty":
                return ContainerNotEmpty(f"bucket {self.bucket!r} is not empty")
            if container and code == "NoSuchBucket":
                return ContainerNotFound(f"bucket {self.bucket!r} does not exist")
        return self._error(exc, key)

    async def _head_missing(self, key: str) -> StoreError:
        """A HEAD 404 has no body to tell a missing key from a missing bucket; ask once."""
        if not self._bucket_seen:
            try:
                await (await self._s3()).head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if _status(exc) == 404:
                    return StoreUnavailable(f"origin bucket {self.bucket!r} does not exist")
                # Else (403: no s3:ListBucket) we cannot learn more, and will not ask again.
            except _TRANSPORT_ERRORS as exc:
                return self._error(exc, key)
            self._bucket_seen = True
        return ObjectNotFound(key)

    # -- operations --------------------------------------------------------------------------

    async def _head(
        self, key: str, if_match: str | None = None, checksums: bool = False
    ) -> dict[str, Any]:
        if not key:
            raise ObjectNotFound(key)
        args = {"Bucket": self.bucket, "Key": self.prefix + key}
        if if_match is not None:
            args["IfMatch"] = if_match
        if checksums:
            args["ChecksumMode"] = "ENABLED"
        try:
            head: dict[str, Any] = await (await self._s3()).head_object(**args)
            return head
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                raise await self._head_missing(key) from None
            raise self._error(exc, key) from None
        except _TRANSPORT_ERRORS as exc:
            raise self._error(exc, key) from None

    async def stat(self, key: str) -> ObjectInfo:
        return self._info(key, await self._head(key, checksums=True))

    def _info(self, key: str, h: Mapping[str, Any]) -> ObjectInfo:
        expires = h.get("ExpiresString")
        if expires is None and isinstance(h.get("Expires"), datetime):
            expires = format_datetime(_utc(h["Expires"]), usegmt=True)
        return ObjectInfo(
            key=key,
            size=int(h["ContentLength"]),
            etag=h["ETag"],
            last_modified=_utc(h["LastModified"]),
            content_type=h.get("ContentType"),
            content_encoding=h.get("ContentEncoding"),
            content_disposition=h.get("ContentDisposition"),
            content_language=h.get("ContentLanguage"),
            cache_control=h.get("CacheControl"),
            expires=expires,
            metadata=dict(h.get("Metadata") or {}),
            storage_class=h.get("StorageClass") or "STANDARD",
            checksums=checksums_of(h),
        )

    async def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        if end is not None and end <= start:
            # No bytes to send, but a missing key or a changed version must still be reported.
            await self._head(key, if_match)
            return
        if not key:
            raise ObjectNotFound(key)
        args = {}
        # No Range for the whole object: S3 answers 416 to any range of an empty one.
        if start > 0 or end is not None:
            args["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        if if_match is not None:
            args["IfMatch"] = if_match
        try:
            _, body = await self._get(key, args)
        except ClientError as exc:
            if _status(exc) == 416:
                return  # the range starts at or past the end: [start, end) is empty
            raise self._error(exc, key) from None
        except _TRANSPORT_ERRORS as exc:
            raise self._error(exc, key) from None
        async with contextlib.aclosing(self._chunks(body, key)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def open(
        self, key: str, length: int | None = None
    ) -> tuple[ObjectInfo, AsyncGenerator[bytes, None]]:
        if not key:
            raise ObjectNotFound(key)
        args = {}
        if length is not None:
            # A range answers with Content-Range: bytes 0-N/TOTAL, so one request still tells
            # the whole object's size along with its first block.
            args["Range"] = f"bytes=0-{max(length, 1) - 1}"
        try:
            response, body = await self._get(key, args)
        except ClientError as exc:
            if length is not None and _status(exc) == 416:
                # Any range of an empty object is unsatisfiable: it has no bytes to send.
                info = await self.stat(key)
                if info.size == 0:
                    return info, _no_bytes()
            raise self._error(exc, key) from None
        except _TRANSPORT_ERRORS as exc:
            raise self._error(exc, key) from None
        info = self._info(key, response)
        total = _total_size(response.get("ContentRange"))
        if total is not None:
            info = dataclasses.replace(info, size=total)
        return info, self._chunks(body, key)

    async def _chunks(
        self, body: AsyncGenerator[bytes, None], key: str
    ) -> AsyncGenerator[bytes, None]:
        async with contextlib.aclosing(body) as chunks:
            while True:
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except _TRANSPORT_ERRORS as exc:
                    raise self._error(exc, key) from None
                yield chunk

    async def list_page(
        self,
        prefix: str = "",
        delimiter: str | None = None,
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        if max_keys <= 0:
            return ListPage([], [], None)
        args: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": self.prefix + prefix,
            "MaxKeys": max_keys,
        }
        if delimiter:
            args["Delimiter"] = delimiter
        if token:
            args["ContinuationToken"] = token
        if start_after:
            args["StartAfter"] = self.prefix + start_after
        try:
            page = await (await self._s3()).list_objects_v2(**args)
        except (ClientError, *_TRANSPORT_ERRORS) as exc:
            raise self._error(exc, prefix) from None
        cut = len(self.prefix)
        objects = [
            ObjectInfo(
                key=o["Key"][cut:],
                size=int(o["Size"]),
                etag=o["ETag"],
                last_modified=_utc(o["LastModified"]),
                storage_class=o.get("StorageClass") or "STANDARD",
            )
            for o in page.get("Contents", [])
        ]
        prefixes = [p["Prefix"][cut:] for p in page.get("CommonPrefixes", [])]
        more = page.get("IsTruncated") and page.get("NextContinuationToken")
        return ListPage(objects, prefixes, page["NextContinuationToken"] if more else None)


@functools.cache
def _session() -> AioSession:
    """One botocore session for every S3 store of the process: its loaded models are shared
    (a session of its own cost each store ~55 ms of CPU on the event loop)."""
    session = get_session()
    # botocore parses every LastModified with dateutil, ~60% of the CPU of a 1000-key listing
    # page; ISO-8601 from the standard library is far cheaper.
    session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=parse_timestamp
    )
    return session


@functools.cache
def _load_models() -> None:
    """What making an S3 client reads from botocore's data files (cached by its loader)."""
    loader = _session().get_component("data_loader")
    loader.load_service_model("s3", "service-2")
    loader.load_service_model("s3", "endpoint-rule-set-1")
    for name in ("partitions", "_retry", "sdk-default-configuration"):
        loader.load_data(name)


def open_s3(parts: SplitResult, options: Mapping[str, str]) -> S3Store:
    """`s3://bucket[/prefix]`."""
    bucket = parts.netloc
    if not bucket or ":" in bucket:
        raise ValueError(f"s3 URI {parts.geturl()!r} needs a bucket name: s3://bucket[/prefix]")
    return S3Store(bucket, unquote(parts.path), options)


def parse_timestamp(value: str) -> datetime:
    """S3's timestamps: ISO 8601 in bodies, RFC 7231 in headers; anything else as botocore does."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        try:
            parsed = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            result: datetime = botocore_parse_timestamp(value)
            return result
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _total_size(content_range: str | None) -> int | None:
    """TOTAL of 'bytes START-END/TOTAL'."""
    if not content_range:
        return None
    _, slash, total = content_range.rpartition("/")
    return int(total) if slash and total.isdigit() else None


async def _botocore_chunks(body: Any) -> AsyncGenerator[bytes, None]:
    try:
        async with contextlib.aclosing(body.iter_chunks(CHUNK_SIZE)) as chunks:
            async for chunk in chunks:
                yield chunk
    finally:
        # Closes the connection rather than pooling it when the body was not read to the end.
        body.close()


async def _no_bytes() -> AsyncGenerator[bytes, None]:
    return
    yield
