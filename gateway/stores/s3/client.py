"""The S3 wire client: the store's one transport for object reads (transport.py: GET and HEAD
of any kind), and an aiobotocore client made once per store (one botocore session per process)
for the rest (writes, listings, multipart uploads, tags, versioning), whose failures are turned
into the typed store errors by the same table (errors.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from aiobotocore.session import AioSession, get_session
from botocore.config import Config
from botocore.credentials import ReadOnlyCredentials
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from botocore.handlers import add_expect_header
from botocore.utils import parse_timestamp as botocore_parse_timestamp

from gateway.stores.base import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    InvalidPart,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    UnsupportedKey,
    UploadNotFound,
    WriteConflict,
)
from gateway.stores.s3.errors import NOT_FOUND, error_of, unreachable
from gateway.stores.s3.transport import Credentials, Reply, Request, Transport

log = logging.getLogger(__name__)

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

TRANSPORT_ERRORS = (BotoCoreError, aiohttp.ClientError, asyncio.TimeoutError, OSError)
_BAD_PARTS = {"InvalidPart", "InvalidPartOrder", "EntityTooSmall"}
_EXISTS = {"BucketAlreadyExists", "BucketAlreadyOwnedByYou"}


def status_of(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or status_of(exc))


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
        self.transport: Transport | None = None  # None: no credentials to sign reads with
        self._lock = asyncio.Lock()

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
                    self.transport = await self._transport(client)
                    self._client = client
        return self._client

    async def _transport(self, client: Any) -> Transport | None:
        """The reads' transport, at botocore's URL of the bucket's objects, signing with the
        credentials botocore's client was made with (refreshed where they refresh)."""
        o = self.options
        credentials: Credentials
        if o.get("access_key"):
            credentials = ReadOnlyCredentials(
                o["access_key"], o["secret_key"], o.get("session_token") or None
            )
        else:
            chain = await _session().get_credentials()
            if chain is None:
                return None  # every read is refused as botocore's calls are (error())
            credentials = chain.get_frozen_credentials  # refreshes them when they expire

        probe = "k"
        url = await client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": probe}
        )
        base = url.split("?", 1)[0]
        if not base.endswith("/" + probe):
            raise ValueError(f"{self!r}: an object's URL is not the bucket's and the key: {base}")
        config = client.meta.config
        return Transport(
            base[: -len(probe)],
            client.meta.region_name,
            credentials,
            bucket=self.bucket,
            prefix=self.prefix,
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            max_attempts=int(o.get("max_attempts", 3)),
        )

    async def read(self, request: Request) -> Reply:
        """A GET or HEAD of an object, through the one transport (transport.py)."""
        return await (await self._reads(request.key)).handle(request)

    async def listing(self, query: tuple[tuple[str, str], ...]) -> bytes:
        """A ListObjectsV2 answer's body, through the one transport (transport.py)."""
        return await (await self._reads("")).listing(query)

    async def _reads(self, key: str) -> Transport:
        transport = self.transport
        if transport is None:
            await self.botocore()
            transport = self.transport
            if transport is None:
                where = self.where(key)
                raise StoreAccessDenied(f"{where}: no credentials configured for the mount")
        return transport

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
            transport, self.transport = self.transport, None
            if transport is not None:
                await transport.close()
            if client is not None:
                await self._stack.aclose()
                self._stack = contextlib.AsyncExitStack()

    # -- errors ------------------------------------------------------------------------------

    def error(self, exc: Exception, key: str, version_id: str | None = None) -> StoreError:
        """One of our typed errors for a botocore/aiohttp failure (errors.py's table); of a
        version's (`version_id`), in the version's terms."""
        where = self.where(key)
        if isinstance(exc, NoCredentialsError):
            return StoreAccessDenied(f"{where}: no credentials configured for the mount")
        if not isinstance(exc, ClientError):
            return unreachable(where, exc)
        meta = exc.response.get("ResponseMetadata", {})
        headers = {str(k).lower(): str(v) for k, v in (meta.get("HTTPHeaders") or {}).items()}
        return error_of(self.bucket, where, key, status_of(exc), _code(exc), headers, version_id)

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
            if conditional and code in NOT_FOUND:
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

    # -- operations --------------------------------------------------------------------------

    async def head(
        self,
        key: str,
        if_match: str | None = None,
        checksums: bool = False,
        version_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        part: int | None = None,
    ) -> dict[str, Any]:
        """HeadObject's answer in botocore's names, through the transport."""
        if not key:
            raise ObjectNotFound(key)
        query = []
        if version_id is not None:
            query.append(("versionId", version_id))
        if part is not None:
            query.append(("partNumber", str(part)))
        sent = dict(headers or {})
        if if_match is not None:
            sent["If-Match"] = if_match
        if checksums:
            sent["x-amz-checksum-mode"] = "ENABLED"
        reply = await self.read(Request("HEAD", key, tuple(query), tuple(sent.items())))
        return reply.fields

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
