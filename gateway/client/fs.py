"""An fsspec filesystem for the gateway: `gw://bucket/key`, registered through fsspec's entry
point, so `fsspec.open("gw://datasets/train/000001.jpg", endpoint_url=..., key=..., secret=...)`
works, and so do pandas, pyarrow and anything else that takes an fsspec URL.

Reads go to the node on this host through its short-circuit socket when one is given
(`local_socket=`, or GATEWAY_LOCAL_SOCKET): the object's cached block files are read with
pread, as local files; what the node does not hold, and everything when there is no socket,
is read over HTTP (S3 ranged GETs, SigV4). Listings and writes are S3 requests.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import botocore.session
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as EndpointUnreachable
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from gateway.bounded import Bounded
from gateway.cache.blockfile import Corrupt
from gateway.client.endpoints import Endpoints
from gateway.client.local import HELLO_PATH, Lease, ShortCircuit, ShortCircuitError
from gateway.client.routing import Routing
from gateway.client.stats import ClientStats

log = logging.getLogger(__name__)

_REFUSED = {"AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "403"}
_VERSIONS_KEPT = 1 << 18
# A node that did not answer: refused, reset, timed out, or cut its answer short. Another
# node may answer (a 4xx or 5xx is an answer: the node is there).
_UNANSWERED = (EndpointUnreachable, HTTPClientError, IncompleteReadError)
T = TypeVar("T")


class ClientErrorRetry(Exception):
    """A node answered with a server error: another node may answer."""


class GatewayFileSystem(AbstractFileSystem):
    """The gateway's objects as files. Options as s3fs names them: `endpoint_url`, `key`,
    `secret` (else AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), `region`;
    `endpoint_url` may name several nodes (a list, or URLs separated by commas): each process
    uses the first that answers (`/healthz`), so a job starts with a node of the fleet down,
    and moves to the next that answers (those listed, then the fleet's other nodes) when its
    node stops answering; `local_socket` for short-circuit reads on the node's host,
    `max_descriptors` for the block files' descriptors it keeps (default: half the
    process's limit), `renew_ahead` (default True) to renew leases in a thread of the
    process before they lapse (docs/client.md, "Renewal")."""

    protocol = ("gw",)
    root_marker = ""

    def __init__(
        self,
        endpoint_url: str | list[str] | tuple[str, ...] | None = None,
        key: str | None = None,
        secret: str | None = None,
        region: str = "us-east-1",
        local_socket: str | None = None,
        route: bool = True,
        max_descriptors: int | None = None,
        renew_ahead: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        env = os.environ
        endpoint = endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        if not endpoint:
            raise ValueError("endpoint_url is needed (or AWS_ENDPOINT_URL)")
        if isinstance(endpoint, str):
            endpoint = endpoint.split(",")
        self.endpoints = [e.strip().rstrip("/") for e in endpoint if e.strip()]
        if not self.endpoints:
            raise ValueError("endpoint_url is needed (or AWS_ENDPOINT_URL)")
        self.key = key or env.get("AWS_ACCESS_KEY_ID")
        self.secret = secret or env.get("AWS_SECRET_ACCESS_KEY")
        self.region = region
        self.local_socket = local_socket or env.get("GATEWAY_LOCAL_SOCKET") or None
        self.stats = ClientStats()
        self._pid = -1
        self._lock = threading.Lock()
        self.max_descriptors = max_descriptors
        self.renew_ahead = renew_ahead
        self._local: ShortCircuit | None = None
        if self.local_socket:
            self._local = self._short_circuit()
        self.route = route
        self._routing = Routing(self._placement_document) if route else None
        self._endpoints = self._endpoint_choice()
        # This process's botocore clients by node URL: of endpoints (retries of their own), and
        # of owners (none: an owner that does not answer is skipped for the endpoint).
        self._clients: dict[str, Any] = {}
        self._nodes: dict[str, Any] = {}
        # Versions and sizes learnt from listings: a routed read of a large object needs the
        # version to find the owners of its blocks (no HEAD per object).
        self._versions: Bounded[tuple[str, str], tuple[str, int]] = Bounded(_VERSIONS_KEPT)

    # -- plumbing ------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        """The node this process sends its requests to (docs/client.md, "Several endpoints")."""
        return self._endpoints.current()

    @property
    def s3(self) -> Any:
        """This process's botocore client of the endpoint in use."""
        return self._endpoint_client(self.endpoint_url)

    def _endpoint_client(self, url: str) -> Any:
        with self._lock:
            if self._pid != os.getpid():  # forked or spawned: the parent's clients are not ours
                self._clients, self._nodes, self._pid = {}, {}, os.getpid()
            client = self._clients.get(url)
            if client is None:
                client = self._clients[url] = self._client(url, retries=3)
            return client

    def _node(self, url: str) -> Any:
        """This process's client of one node (no retries of its own: a node that does not
        answer is skipped for the endpoint)."""
        self._endpoint_client(self.endpoint_url)  # after a fork: the parent's clients dropped
        with self._lock:
            client = self._nodes.get(url)
            if client is None:
                client = self._nodes[url] = self._client(url, retries=1)
            return client

    def _endpoint_choice(self) -> Endpoints:
        routing = self._routing
        learnt = routing.urls if routing is not None else list
        return Endpoints(self.endpoints, _answers, learnt, self._moved)

    def _moved(self, old: str, new: str) -> None:
        log.warning("gateway node %s did not answer; going on with %s", old, new)
        self.stats.failovers += 1

    def _call(self, call: Callable[[Any], T]) -> T:
        """`call(client)` with the client of the endpoint in use; when that node does not
        answer, again with the next that does, which is kept from then on."""
        url = self.endpoint_url
        tried = {url}
        while True:
            try:
                return call(self._endpoint_client(url))
            except _UNANSWERED as exc:
                moved = self._endpoints.failed(url)
                if moved is None or moved in tried:
                    raise
                log.info("%s did not answer, trying %s: %s", url, moved, exc)
                tried.add(moved)
                url = moved

    def _client(self, url: str, retries: int) -> Any:
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=url,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name=self.region,
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                retries={"max_attempts": retries, "mode": "standard"},
                max_pool_connections=32,
                connect_timeout=5,
            ),
        )

    def _placement_document(self) -> bytes:
        """The fleet's placement as the endpoint node describes it (a signed GET)."""
        request = AWSRequest(method="GET", url=f"{self.endpoint_url}/_gateway/placement")
        credentials = Credentials(self.key or "", self.secret or "")
        S3SigV4Auth(credentials, "s3", self.region).add_auth(request)
        plain = urllib.request.Request(request.url, headers=dict(request.headers.items()))
        with urllib.request.urlopen(plain, timeout=10) as answer:
            data: bytes = answer.read()
        return data

    def _short_circuit(self) -> ShortCircuit:
        assert self.local_socket
        return ShortCircuit(
            self.local_socket, self._sign_hello, self.stats, self.max_descriptors,
            renew_ahead=self.renew_ahead,
        )  # fmt: skip

    def _sign_hello(self, nonce: str) -> tuple[str, str]:
        """The short-circuit connection's hello: a presigned GET naming the node's nonce,
        which proves the key once for the connection (request target, Host)."""
        url = f"{self.endpoint_url}{HELLO_PATH}?nonce={quote(nonce, safe='')}"
        request = AWSRequest(method="GET", url=url)
        credentials = Credentials(self.key or "", self.secret or "")
        S3SigV4QueryAuth(credentials, "s3", self.region, expires=300).add_auth(request)
        parts = urlsplit(request.url)
        return f"{parts.path}?{parts.query}", parts.netloc

    @classmethod
    def _strip_protocol(cls, path: str | list[str]) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        for prefix in ("gw://", "gw::"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
        return path.rstrip("/")

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    # -- metadata ------------------------------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        bucket, prefix = self._split(path)
        if not bucket:
            listed = self._call(lambda s3: s3.list_buckets())
            names = [b["Name"] for b in listed["Buckets"]]
            entries = [{"name": n, "size": 0, "type": "directory"} for n in names]
            return entries if detail else names
        if prefix:
            prefix += "/"
        entries = self._call(lambda s3: self._listing(s3, bucket, prefix))
        if not entries and prefix:
            info = self.info(path)
            if info["type"] == "file":
                entries = [info]
            else:
                raise FileNotFoundError(path)
        return entries if detail else [e["name"] for e in entries]

    def _listing(self, s3: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
        """The entries under `prefix`, one level down, through one node (all its pages)."""
        entries: list[dict[str, Any]] = []
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/"
        )
        for page in pages:
            for common in page.get("CommonPrefixes", []):
                name = f"{bucket}/{common['Prefix'].rstrip('/')}"
                entries.append({"name": name, "size": 0, "type": "directory"})
            for obj in page.get("Contents", []):
                self._remember(bucket, obj["Key"], obj["ETag"], obj["Size"])
                entries.append(
                    {
                        "name": f"{bucket}/{obj['Key']}",
                        "size": obj["Size"],
                        "type": "file",
                        "ETag": obj["ETag"],
                        "LastModified": obj["LastModified"],
                    }
                )
        return entries

    def _remember(self, bucket: str, key: str, etag: str, size: int) -> None:
        self._versions.put((bucket, key), (etag, size))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        bucket, key = self._split(path)
        if key:
            try:
                head = self._call(lambda s3: s3.head_object(Bucket=bucket, Key=key))
            except ClientError as exc:
                if exc.response["Error"]["Code"] not in ("404", "NoSuchKey", "NotFound"):
                    raise
            else:
                return {
                    "name": path,
                    "size": head["ContentLength"],
                    "type": "file",
                    "ETag": head["ETag"],
                    "LastModified": head["LastModified"],
                }
            listed = self._call(
                lambda s3: s3.list_objects_v2(Bucket=bucket, Prefix=key + "/", MaxKeys=1)
            )
            if listed.get("KeyCount", 0):
                return {"name": path, "size": 0, "type": "directory"}
            raise FileNotFoundError(path)
        self._call(lambda s3: s3.head_bucket(Bucket=bucket))
        return {"name": path, "size": 0, "type": "directory"}

    # -- bytes ---------------------------------------------------------------------------

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        bucket, key = self._split(self._strip_protocol(path))
        if (start is not None and start < 0) or (end is not None and end < 0):
            start, end = _resolve(start, end, self.info(f"{bucket}/{key}")["size"])
        if self._local is not None:
            data = self._read_local(bucket, key, start, end)
            if data is not None:
                return data
        return self._read_http(bucket, key, start, end, None)

    def prefetch(self, paths: Iterable[str]) -> None:
        """Lease the objects that will be read next from the node on this host, in as few
        requests as it takes (a DataLoader's batch, the keys of a cat or cat_ranges); those
        leased already cost nothing. Without a socket, nothing to do."""
        if self._local is None:
            return
        by_bucket: dict[str, list[str]] = {}
        for path in paths:
            bucket, key = self._split(self._strip_protocol(path))
            if key:
                by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            self._local.leases(bucket, keys)  # an error is met again when the key is read

    def lease_room(self) -> int:
        """How many more objects' descriptors may be leased before older leases are let go
        (0 without a socket)."""
        return self._local.room() if self._local is not None else 0

    def leased(self, path: str) -> bool:
        """Whether a valid lease of the object is held (its next read asks the node nothing)."""
        if self._local is None:
            return False
        return self._local.is_held(*self._split(self._strip_protocol(path)))

    def cat(
        self, path: str | list[str], recursive: bool = False, on_error: str = "raise",
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        if not isinstance(path, list) or recursive:
            return super().cat(path, recursive=recursive, on_error=on_error, **kwargs)
        # Many objects: their leases in one request, then each read from its descriptors.
        self.prefetch(path)
        out: dict[str, Any] = {}
        for p in path:
            name = self._strip_protocol(p)
            try:
                out[name] = self.cat_file(name, **kwargs)
            except Exception as exc:
                if on_error == "raise":
                    raise
                if on_error == "return":
                    out[name] = exc
        return out

    def cat_ranges(
        self, paths: list[str], starts: Any, ends: Any, max_gap: int | None = None,
        on_error: str = "return", **kwargs: Any,
    ) -> list[Any]:  # fmt: skip
        self.prefetch(paths)
        result: list[Any] = super().cat_ranges(
            paths, starts, ends, max_gap=max_gap, on_error=on_error, **kwargs
        )
        return result

    def _read_local(
        self, bucket: str, key: str, start: int | None, end: int | None
    ) -> bytes | None:
        assert self._local is not None
        try:
            lease = self._local.lease(bucket, key)
        except ShortCircuitError as exc:
            if exc.code in ("NoSuchKey", "NoSuchBucket"):
                raise FileNotFoundError(f"{bucket}/{key}") from None
            # Refused or unreachable: HTTP gives the answer (bytes, or the error for the key).
            self.stats.fallbacks += 1
            log.debug("short-circuit unavailable for %s/%s: %s", bucket, key, exc)
            return None
        lo, hi = _resolve(start, end, lease.size)
        try:
            return self._from_lease(lease, bucket, key, lo, hi)
        except (Corrupt, OSError) as exc:
            log.warning(
                "short-circuit read of %s/%s failed, reading over HTTP: %s", bucket, key, exc
            )
            self._local.drop(bucket, key)
            self.stats.fallbacks += 1
            return None

    def _from_lease(self, lease: Lease, bucket: str, key: str, lo: int, hi: int) -> bytes:
        assert self._local is not None
        size = lease.block_size
        parts: list[bytes] = []
        pos = lo
        while pos < hi:
            index = pos // size
            block_end = min(hi, (index + 1) * size)
            a, b = pos - index * size, block_end - index * size
            data = self._local.read(lease, index, a, b)
            if data is None:
                # Not held by this node (a peer's block, or not kept): over HTTP, that version.
                data = self._read_http(bucket, key, pos, block_end, lease.etag)
            else:
                self.stats.short_circuit_reads += 1
                self.stats.short_circuit_bytes += len(data)
            parts.append(data)
            pos = block_end
        return b"".join(parts)

    def _read_http(
        self, bucket: str, key: str, start: int | None, end: int | None, etag: str | None
    ) -> bytes:
        known = self._versions.get((bucket, key))
        version = etag or (known[0] if known else None)
        routing = self._routing
        block = routing.block_size(bucket) if routing is not None else None
        if routing is None or block is None:
            return self._through_endpoint(bucket, key, start, end, etag)
        lo = start or 0
        if known is None and lo >= block:
            # A range past block 0 of an object not listed: one HEAD tells the version, which
            # finds the owners of its blocks from now on.
            try:
                head = self._call(lambda s3: s3.head_object(Bucket=bucket, Key=key))
            except ClientError as exc:
                if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                    raise FileNotFoundError(f"{bucket}/{key}") from None
                raise
            self._remember(bucket, key, head["ETag"], head["ContentLength"])
            known = self._versions[(bucket, key)]
            version = etag or known[0]
        if known is not None and version is not None:
            # The blocks of the range, each from its owner.
            hi = known[1] if end is None else min(end, known[1])
            if lo == 0 and hi == known[1] <= block:
                # A whole object of one block: a plain GET, which its owner answers on its
                # quickest path (a Range or a condition takes the full one, ~3x the CPU).
                return self._routed(bucket, key, None, None, version, 0, etag)
            parts = []
            while lo < hi:
                index = lo // block
                upto = min(hi, (index + 1) * block)
                parts.append(self._routed(bucket, key, lo, upto, version, index, etag))
                lo = upto
            return b"".join(parts)
        # Version unknown: only block 0's owner is known (placed by the key alone).
        index = 0 if lo < block else -1
        return self._routed(bucket, key, start, end, version, index, etag)

    def _routed(
        self, bucket: str, key: str, start: int | None, end: int | None,
        version: str | None, index: int, etag: str | None,
    ) -> bytes:  # fmt: skip
        assert self._routing is not None
        url = (
            self._routing.owner(bucket, key, version or "", index)
            if index == 0 or (index > 0 and version)
            else None
        )
        if url is not None and not self._endpoints.is_down(url):
            try:
                data = self._get(self._node(url), bucket, key, start, end, etag)
            except (BotoCoreError, ClientErrorRetry) as exc:
                log.info("owner %s did not answer, through the endpoint: %s", url, exc)
                if isinstance(exc, _UNANSWERED):
                    self._endpoints.failed(url)  # passed over a while, as an endpoint and owner
                self._routing.stale()
                self.stats.fallbacks += 1
            else:
                self.stats.routed_reads += 1
                return data
        return self._through_endpoint(bucket, key, start, end, etag)

    def _through_endpoint(
        self, bucket: str, key: str, start: int | None, end: int | None, etag: str | None
    ) -> bytes:
        return self._call(lambda s3: self._get(s3, bucket, key, start, end, etag))

    def _get(
        self, client: Any, bucket: str, key: str, start: int | None, end: int | None,
        etag: str | None,
    ) -> bytes:  # fmt: skip
        params: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if etag is not None:
            params["IfMatch"] = etag
        if start is not None or end is not None:
            lo = start or 0
            if end is not None and end <= lo:
                return b""
            params["Range"] = f"bytes={lo}-" if end is None else f"bytes={lo}-{end - 1}"
        try:
            got = client.get_object(**params)
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            if code in ("NoSuchKey", "404"):
                raise FileNotFoundError(f"{bucket}/{key}") from None
            if code == "InvalidRange":
                return b""
            if code in ("PreconditionFailed", "412"):
                if self._local is not None:
                    self._local.drop(bucket, key)  # overwritten: the lease is of the old one
                self._versions.pop((bucket, key), None)
                raise OSError(f"{bucket}/{key} changed while it was read") from None
            if code in _REFUSED:
                raise PermissionError(f"{bucket}/{key}: {code}") from None
            if code.startswith("5") or code in ("ServiceUnavailable", "InternalError"):
                raise ClientErrorRetry(code) from None
            raise
        data: bytes = got["Body"].read()
        self.stats.http_reads += 1
        self.stats.http_bytes += len(data)
        return data

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> GatewayFile:
        if mode != "rb":
            raise NotImplementedError("gw:// files open for reading; write with pipe_file")
        return GatewayFile(self, path, mode, block_size or 4 << 20, cache_options=cache_options)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        bucket, key = self._split(self._strip_protocol(path))
        self._call(lambda s3: s3.put_object(Bucket=bucket, Key=key, Body=value))

    def rm_file(self, path: str) -> None:
        bucket, key = self._split(self._strip_protocol(path))
        self._call(lambda s3: s3.delete_object(Bucket=bucket, Key=key))

    def close(self) -> None:
        if self._local is not None:
            self._local.close()

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into spawned workers: no clients, sockets or descriptors travel.
        state = self.__dict__.copy()
        state["_clients"], state["_pid"], state["_lock"] = {}, -1, None
        state["_local"], state["_nodes"], state["_routing"] = None, {}, None
        state["_endpoints"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self.stats = ClientStats()
        if self.local_socket:
            self._local = self._short_circuit()
        if self.route:
            self._routing = Routing(self._placement_document)
        self._endpoints = self._endpoint_choice()


class GatewayFile(AbstractBufferedFile):
    """A gw:// object open for reading, fetched in ranges through its filesystem."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        data: bytes = self.fs.cat_file(self.path, start, end)
        return data


def _resolve(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    lo = 0 if start is None else (start if start >= 0 else max(0, size + start))
    hi = size if end is None else (end if end >= 0 else max(0, size + end))
    return min(lo, size), min(max(hi, 0), size)


def _answers(url: str) -> bool:
    """Whether the node at `url` serves: its /healthz answers within 2 s."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2):
            return True
    except (OSError, ValueError) as exc:
        log.info("gateway node %s does not answer (%s)", url, exc)
        return False
