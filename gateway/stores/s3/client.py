"""The S3 wire client: an aiobotocore client made once per store (one botocore session per
process), the lean GET of `fast_get` beside it, and botocore's failures turned into the typed
store errors."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

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
    KeyTooLong,
    MarkedDeleted,
    MetadataTooLarge,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    StoreRejected,
    StoreUnavailable,
    UnsupportedKey,
    UploadNotFound,
    VersionChanged,
    WriteConflict,
)
from gateway.stores.s3.fast_get import FastGet, body_chunks

log = logging.getLogger(__name__)

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
TRANSPORT_ERRORS = (BotoCoreError, aiohttp.ClientError, asyncio.TimeoutError, OSError)
_BAD_PARTS = {"InvalidPart", "InvalidPartOrder", "EntityTooSmall"}
_EXISTS = {"BucketAlreadyExists", "BucketAlreadyOwnedByYou"}


def status_of(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or status_of(exc))


def marked_deleted(exc: ClientError, key: str) -> MarkedDeleted | None:
    """A 404 that says the key's current version is a delete marker (x-amz-delete-marker),
    with the marker's version id where the origin gave it."""
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders") or {}
    if str(headers.get("x-amz-delete-marker", "")).lower() != "true":
        return None
    return MarkedDeleted(f"{key}: its current version is a delete marker",
                         headers.get("x-amz-version-id") or None)  # fmt: skip


class S3Client:
    """Calls to one bucket of an S3-compatible origin, keys under `prefix`."""

    # The failures of a call to the origin that error()/write_error() turn into typed errors.
    failures = (ClientError, *TRANSPORT_ERRORS)

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
        self.options = options
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self.fast: FastGet | None = None
        self._lock = asyncio.Lock()
        self._bucket_seen = False

    def __repr__(self) -> str:
        where = self.options.get("endpoint_url", "aws")
        return f"S3Store(s3://{self.bucket}/{self.prefix} at {where})"

    def _config(self) -> Config:
        o = self.options
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

    async def botocore(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    o = self.options
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
                    self.fast = await self._fast_get(client)
                    self._client = client
        return self._client

    async def _fast_get(self, client: Any) -> FastGet | None:
        """Reads without botocore's pipeline (fast_get.py), where the credentials are static."""
        o = self.options
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

    async def get(
        self, key: str, args: dict[str, str]
    ) -> tuple[Mapping[str, Any], AsyncGenerator[bytes, None]]:
        """GetObject: (the answer's fields, its body as an async generator of chunks) or
        botocore's ClientError / transport errors."""
        client = await self.botocore()
        fast = self.fast
        if fast is not None and "VersionId" not in args:
            headers = {"Range": args["Range"]} if "Range" in args else {}
            if "IfMatch" in args:
                headers["If-Match"] = args["IfMatch"]
            answered = await fast.get(self.prefix + key, headers)
            if answered is not None:
                found, response = answered
                return found, body_chunks(response, CHUNK_SIZE)
        response = await client.get_object(Bucket=self.bucket, Key=self.prefix + key, **args)
        if fast is not None and fast.refused and fast is self.fast:
            # Refused what botocore was given: the lean GET is built wrong for this origin (a
            # region, an endpoint, a proxy that rewrites paths). Stop paying for it twice.
            log.warning("%r: lean GETs refused where botocore's succeed; using botocore", self)
            await self._drop_fast()
        return response, _botocore_chunks(response["Body"])

    async def _drop_fast(self) -> None:
        fast, self.fast = self.fast, None
        if fast is not None:
            await fast.close()

    async def prepare(self) -> None:
        """Load botocore's S3 models on a thread, then make the client, so that neither the
        event loop nor the first miss pays for it (~0.1-0.5 s here)."""
        await asyncio.to_thread(_load_models)
        await self.botocore()

    async def close(self) -> None:
        # Under the lock: a client being made now (a mount's preparation) is closed too,
        # never left open after this.
        async with self._lock:
            client, self._client = self._client, None
            fast, self.fast = self.fast, None
            if fast is not None:
                await fast.close()
            if client is not None:
                await self._stack.aclose()
                self._stack = contextlib.AsyncExitStack()

    # -- errors ------------------------------------------------------------------------------

    def error(self, exc: Exception, key: str) -> StoreError:
        """One of our typed errors for a botocore/aiohttp failure; messages carry no secrets."""
        where = f"s3://{self.bucket}/{self.prefix}{key}"
        if isinstance(exc, NoCredentialsError):
            return StoreAccessDenied(f"{where}: no credentials configured for the mount")
        if not isinstance(exc, ClientError):
            return StoreUnavailable(f"{where}: origin unreachable: {type(exc).__name__}: {exc}")
        code, status = _code(exc), status_of(exc)
        if code == "NoSuchBucket":
            # The mount points at a bucket that is not there: a misconfiguration, not a miss.
            return StoreMissing(f"origin bucket {self.bucket!r} does not exist")
        if code in _NOT_FOUND:
            return marked_deleted(exc, key) or ObjectNotFound(key)
        if code in _DENIED or status == 403:
            return StoreAccessDenied(f"{where}: {code}")
        if code == "PreconditionFailed" or status == 412:
            return VersionChanged(f"{where}: ETag no longer matches")
        if status >= 500 or status in (301, 307, 429) or code == "SlowDown":
            return StoreUnavailable(f"{where}: origin answered {status} {code}")
        if code == "KeyTooLongError":
            # Shown to the client: the limit, not the origin's address.
            return KeyTooLong("with the mount's prefix it is over the origin's 1024 bytes")
        if code == "MetadataTooLarge":
            return MetadataTooLarge("the origin keeps at most 2 KB of user metadata")
        if 400 <= status < 500:
            return StoreRejected(f"{where}: origin answered {status} {code}")
        return StoreError(f"{where}: origin answered {status} {code}")

    def write_error(
        self, exc: Exception, key: str, *, conditional: bool = False, container: bool = False
    ) -> StoreError:
        """As _error, for writes: preconditions, uploads and buckets have errors of their own."""
        if isinstance(exc, ClientError):
            where = f"s3://{self.bucket}/{self.prefix}{key}"
            code, status = _code(exc), status_of(exc)
            if code == "ConditionalRequestConflict" or (status == 409 and conditional):
                return WriteConflict(f"{where}: {code}")
            if code == "PreconditionFailed" or status == 412:
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
        return self.error(exc, key)

    async def _head_missing(self, key: str) -> StoreError:
        """A HEAD 404 has no body to tell a missing key from a missing bucket; ask once."""
        if not self._bucket_seen:
            try:
                await (await self.botocore()).head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if status_of(exc) == 404:
                    return StoreMissing(f"origin bucket {self.bucket!r} does not exist")
                # Else (403: no s3:ListBucket) we cannot learn more, and will not ask again.
            except TRANSPORT_ERRORS as exc:
                return self.error(exc, key)
            self._bucket_seen = True
        return ObjectNotFound(key)

    # -- operations --------------------------------------------------------------------------

    async def head(
        self,
        key: str,
        if_match: str | None = None,
        checksums: bool = False,
        version_id: str | None = None,
    ) -> dict[str, Any]:
        if not key:
            raise ObjectNotFound(key)
        args = {"Bucket": self.bucket, "Key": self.prefix + key}
        if version_id is not None:
            args["VersionId"] = version_id
        if if_match is not None:
            args["IfMatch"] = if_match
        if checksums:
            args["ChecksumMode"] = "ENABLED"
        try:
            head: dict[str, Any] = await (await self.botocore()).head_object(**args)
            return head
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                marked = marked_deleted(exc, key)
                raise (marked or await self._head_missing(key)) from None
            raise self.error(exc, key) from None
        except TRANSPORT_ERRORS as exc:
            raise self.error(exc, key) from None

    def where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def object_args(self, key: str) -> dict[str, Any]:
        if not key:
            raise UnsupportedKey("an object needs a non-empty key")
        return {"Bucket": self.bucket, "Key": self.prefix + key}

    async def call(self, key: str, op: str, *, conditional: bool = False, **args: Any) -> Any:
        client = await self.botocore()
        try:
            return await getattr(client, op)(**args)
        except self.failures as exc:
            raise self.write_error(exc, key, conditional=conditional) from None


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


async def _botocore_chunks(body: Any) -> AsyncGenerator[bytes, None]:
    try:
        async with contextlib.aclosing(body.iter_chunks(CHUNK_SIZE)) as chunks:
            async for chunk in chunks:
                yield chunk
    finally:
        # Closes the connection rather than pooling it when the body was not read to the end.
        body.close()
