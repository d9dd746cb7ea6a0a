"""Cache hits answered at the edge, before an ASGI request cycle exists.

The plain GET or HEAD of a whole small object that this node holds in its memory tier, by a
request that is signed with SigV4 or SigV2 (or anonymous on a public mount) and asks for
nothing else (no range, no condition, no response-* override), is answered from the
HTTP protocol's parser callback: the same checks, the same headers, the same metrics and
access-log line as the ASGI path, without the request cycle, task and message passing that
cost several times the answer itself (docs/performance.md). A GET of an object on disk is
answered here too, by a server that sends files even when its block is not in the page cache:
the block's file is read in on a cache-io thread while the connection holds the answer
(PageStore.peek_sendable). Anything else, and any doubt (a signature that does not verify, a
version past its TTL, a block not on this node), answers None: the request then takes the
full path, which gives the answer or the error S3 gives.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

import httptools

from gateway import counters, errors
from gateway.bounded import Bounded
from gateway.logs import AccessLog, fields
from gateway.s3 import limits
from gateway.s3.handlers import checksum_headers, object_headers, plain_object_head
from gateway.s3.http import Reply, new_request_id, render_refusal
from gateway.s3.routing import AUTH_PARAMS
from gateway.s3.sigv2 import SigV2Verifier, is_sigv2
from gateway.s3.sigv4 import AuthResult, SigV4Verifier
from gateway.service import (
    ByteRange,
    Conditions,
    FileRegion,
    ObjectInfo,
    S3Service,
    check_conditions,
)

# Headers that ask for more than the object or a range of it, or carry a body: the full path.
_NOT_PLAIN = frozenset(
    {
        b"content-length", b"transfer-encoding", b"expect",
        b"upgrade", b"content-type", b"x-amz-expected-bucket-owner", b"x-amz-request-payer",
        b"x-amz-server-side-encryption-customer-algorithm",
        b"origin",  # a browser's: the bucket's CORS rules answer it (s3/cors.py)
    }
)  # fmt: skip
# The query parameters a plain GET may carry: SigV4's and SigV2's (a presigned URL of either).
_FAST_PARAMS = AUTH_PARAMS
# Headers that ask for a range, or on a condition: answered here when satisfied.
_ASKS = frozenset(
    {b"range", b"if-match", b"if-none-match", b"if-modified-since", b"if-unmodified-since"}
)
_STATUS = b"HTTP/1.1 200 OK\r\n"
_STATUS_PARTIAL = b"HTTP/1.1 206 Partial Content\r\n"
_TARGET_MAX = 2048  # longer request targets are looked at every time, never kept
_KEPT = 4096  # request targets, and objects' header lines, remembered each
_JOINED_MAX = 64 << 10  # a body up to this size is joined to the head; a larger one is not
_UNREAD = "The object could not be read from the cache; try again."
_READ_IN_RANGED_MAX = 256 << 10  # objects whose block is read in whole for a range of it


class FastHits:
    """The edge's way to answer a plain cache hit (see the module's docstring)."""

    def __init__(
        self,
        service: S3Service,
        verifier: SigV4Verifier,
        base_domain: str | None,
        access_log: AccessLog | None,
        verifier_v2: SigV2Verifier | None = None,
    ) -> None:
        self._service = service
        self._verifier = verifier
        self._verifier_v2 = verifier_v2
        self._base_domain = base_domain
        self._access_log = access_log
        # What each request target seen is (parsing it costs more than the rest of a hit).
        self._targets: Bounded[bytes, tuple[str, str, str, str] | Literal[False]] = Bounded(_KEPT)
        # Each object's header lines and its access-log lines' fixed parts, for the version
        # they were rendered from.
        self._heads: Bounded[tuple[str, str, bool], _Rendered] = Bounded(_KEPT)
        # The server's default header fields (the date: a new list each second), rendered.
        self._dated: tuple[list[tuple[bytes, bytes]] | None, bytes] = (None, b"")

    def answer(
        self,
        method: bytes,
        target: bytes,
        fields: list[tuple[bytes, bytes]],
        keep_alive: bool,
        default_headers: list[tuple[bytes, bytes]],
        files: bool = False,
    ) -> tuple[bytes, bytes | memoryview | FileRegion | None] | None:
        """The whole HTTP response to the request: its head (a small body joined to it) and a
        larger body apart, or None for the full path to answer. The body apart is the memory
        tier's bytes (not copied), or, when the server takes `files`, a region of a block
        file on disk (sent from the page cache, closed by the server once sent; `reading`
        when it is being read in first): a block on disk is never read into memory for a
        connection, however large it is."""
        started = time.perf_counter()
        if (method != b"GET" and method != b"HEAD") or self._service.state_stale():
            return None  # the full path answers (after a re-read of what changed)
        headers: dict[str, str] = {}
        asks = False
        for name, value in fields:
            if name in _NOT_PLAIN:
                return None
            if name in _ASKS:
                asks = True
            n = name.decode("latin-1")
            v = value.decode("latin-1")
            headers[n] = f"{headers[n]},{v}" if n in headers else v
        plain = self._targets.get(target)
        if plain is None:
            plain = object_target(target, self._base_domain)
            if len(target) <= _TARGET_MAX:
                self._targets.put(target, plain)
        if not plain:
            return None
        raw_path, qs, bucket, key = plain
        verb = "GET" if method == b"GET" else "HEAD"
        # A hit or not, asked before the signature is checked: a miss is then verified once,
        # by the full path, and nothing of a hit is read or counted before authorization.
        at = self._service.hit_at(bucket, key, disk=verb == "GET")
        if at is None:
            return None
        auth: AuthResult | None
        try:
            if is_sigv2(headers, qs):
                # boto3's presigned URLs for an endpoint of one's own are SigV2 by default.
                if self._verifier_v2 is None:
                    return None
                auth = self._verifier_v2.verify(verb, raw_path, qs, headers, None)
            else:
                auth = self._verifier.verify(verb, raw_path, qs, headers)
        except errors.S3Error:
            return None  # the full path answers with the error
        # Authorized as the full path would (docs/tenants.md); a refusal, or a decision a
        # policy's Condition could change, is the full path's to answer.
        access_key = auth.access_key if auth is not None else None
        if self._service.allowed_quick(access_key, "s3:GetObject", bucket, key) is not True:
            return None
        # A block not in the page cache is read in whole: for a range of it, only if the
        # object is small (a range of a large one reads only its pieces on the full path).
        read_in = not asks or "range" not in headers or at.info.size <= _READ_IN_RANGED_MAX
        hit = self._service.take_hit(at, disk=verb == "GET", zero_copy=files, read_in=read_in)
        if hit is None:
            return None
        info, data = hit
        start, end = 0, info.size
        partial = False
        if asks:
            # A condition that holds and a range that is satisfied are answered here too;
            # any other outcome (304, 412, 416) is the full path's.
            cond = Conditions(
                headers.get("if-match"), headers.get("if-none-match"),
                headers.get("if-modified-since"), headers.get("if-unmodified-since"),
            )  # fmt: skip
            rng = ByteRange.parse(headers.get("range"))
            try:
                check_conditions(cond, info)
                if rng is not None:
                    start, end = rng.resolve(info.size)
                    partial = True
            except errors.S3Error:
                if isinstance(data, FileRegion):
                    data.close()
                return None
        request_id = new_request_id()
        checksums = (
            not partial
            and bool(info.checksums)
            and headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"
        )
        dated = self._dated
        if dated[0] is not default_headers:  # a new second: the date rendered once
            lines = b"".join(b"%s: %s\r\n" % (name, value) for name, value in default_headers)
            dated = self._dated = (default_headers, lines)
        rendered = self._rendered(bucket, key, info, checksums)
        head: list[bytes | memoryview]
        rid = request_id.encode()
        if not partial and keep_alive:  # the template's: only the date and request id vary
            head = [_STATUS, dated[1], rendered.head, rid, rendered.tail]
        else:
            head = [_STATUS_PARTIAL if partial else _STATUS, dated[1], rendered.head, rid]
            head.append(b"\r\n")
            if partial:
                head.append(b"content-range: bytes %d-%d/%d\r\n" % (start, end - 1, info.size))
            head.append(b"content-length: %d\r\n" % (end - start))
            if not keep_alive:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
        op = "GetObject" if verb == "GET" else "HeadObject"
        sent = 0
        body: bytes | memoryview | FileRegion | None = None
        if verb == "GET":
            sent = end - start
            if isinstance(data, FileRegion):
                data.offset += start  # the region is the whole block
                data.count = sent
                body = data
            else:
                if partial:
                    data = memoryview(data)[start:end]
                if sent <= _JOINED_MAX:
                    head.append(data)  # one write of one buffer
                else:
                    body = data  # not copied: written after the head
        status = 206 if partial else 200
        if isinstance(body, FileRegion) and body.reading is not None:
            # Read in from the disk first: counted and logged once the read has ended, as
            # what the client gets then (this answer, or an error in its place).
            reading = body.reading

            def settled(reading: asyncio.Future[None]) -> None:
                elapsed = time.perf_counter() - started
                if not reading.cancelled() and reading.exception() is None:
                    self._account(op, verb, bucket, key, status, sent, elapsed, access_key,
                                  request_id, rendered, partial)  # fmt: skip
                else:
                    self._account(op, verb, bucket, key, 500, 0, elapsed, access_key,
                                  request_id, None, partial)  # fmt: skip

            reading.add_done_callback(settled)
            body.failed = functools.partial(
                render_refusal, errors.InternalError(_UNREAD), default_headers, request_id
            )
        else:
            elapsed = time.perf_counter() - started
            self._account(op, verb, bucket, key, status, sent, elapsed, access_key, request_id,
                          rendered, partial)  # fmt: skip
        return b"".join(head), body

    def _account(
        self,
        op: str,
        verb: str,
        bucket: str,
        key: str,
        status: int,
        sent: int,
        elapsed: float,
        access_key: str | None,
        request_id: str,
        rendered: _Rendered | None,
        partial: bool,
    ) -> None:
        """The answer's request metrics and access-log line (`rendered` None: an error in its
        place, whose line is not the version's)."""
        hit = status < 400
        if hit:
            counters.observe(op, status, "hit", sent, elapsed, bucket)
        else:
            counters.observe(op, status, "none", sent, elapsed)
        log = self._access_log
        parts: tuple[bytes, bytes] | None = None
        if log is not None and not partial and rendered is not None:
            # The line's fields but the request id and time are the same for every answer of
            # this version by this op and key: rendered once.
            lookup = (op, access_key)
            if lookup in rendered.log:
                parts = rendered.log[lookup]
            else:
                parts = rendered.log[lookup] = _log_parts(op, verb, bucket, key, sent, access_key)
        if log is not None and parts is not None:
            log.write_parts(request_id.encode(), parts[0], elapsed * 1000, parts[1])
        elif log is not None:
            log.write(
                {
                    "request_id": request_id,
                    "op": op,
                    "method": verb,
                    "bucket": bucket,
                    "key": key,
                    "status": status,
                    "bytes": sent,
                    "ms": round(elapsed * 1000, 3),
                    "cache": "hit" if hit else None,
                    "access_key": access_key,
                    "store_ms": 0,
                }
            )

    def _rendered(self, bucket: str, key: str, info: ObjectInfo, checksums: bool) -> _Rendered:
        """The object's header lines, as the full path writes them, and its log lines' fixed
        parts: rendered once per version (and checksum mode) while that version is served."""
        kept = self._heads.get((bucket, key, checksums))
        if kept is not None and kept.info is info:
            return kept
        plain = None if checksums else plain_object_head(info)
        if plain is not None:
            head = plain + b"x-cache: hit\r\n"
        else:
            reply = Reply()
            object_headers(reply, info, {})
            if checksums:
                checksum_headers(reply, info.checksums)
            reply.header("x-cache", "hit")
            head = b"".join(b"%s: %s\r\n" % (name, value) for name, value in reply.headers)
        tail = b"\r\ncontent-length: %d\r\n\r\n" % info.size
        rendered = _Rendered(info, head + b"x-amz-request-id: ", tail, {})
        self._heads.put((bucket, key, checksums), rendered)
        return rendered


@dataclass(slots=True)
class _Rendered:
    """What the edge renders once per version of an object: its header lines up to the
    request id's value, what follows that value in a whole answer on a kept-alive
    connection (its length, the head's end), and the fixed parts of its access-log lines by
    (op, access key) (logs.AccessLog.write_parts; None: write() writes them)."""

    info: ObjectInfo
    head: bytes
    tail: bytes
    log: dict[tuple[str, str | None], tuple[bytes, bytes] | None]


def _log_parts(
    op: str, verb: str, bucket: str, key: str, sent: int, access_key: str | None
) -> tuple[bytes, bytes] | None:
    """A whole answer's access-log fields before and after "ms", as write() writes them."""
    before = fields(
        {"op": op, "method": verb, "bucket": bucket, "key": key, "status": 200, "bytes": sent}
    )
    after = fields({"cache": "hit", "access_key": access_key, "store_ms": 0})
    return (before, after) if before is not None and after is not None else None


def object_target(
    target: bytes, base_domain: str | None
) -> tuple[str, str, str, str] | Literal[False]:
    """(raw path, query, bucket, key) of a path-style request target that names an object and
    whose query holds only signature parameters (SigV4's or SigV2's), and that passes the
    limits; False for any other (the full path then judges it)."""
    if base_domain is not None:
        return False  # virtual-hosted buckets: the full path tells them from path-style
    try:
        url = httptools.parse_url(target)
    except httptools.HttpParserInvalidURLError:
        return False
    if url.schema is not None or url.fragment is not None:
        return False
    raw_path = url.path.decode("latin-1")
    qs = url.query.decode("latin-1") if url.query else ""
    if qs and not _signature_only(qs):
        return False
    try:
        path = raw_path
        if not path.isascii():
            path = path.encode("latin-1").decode("utf-8")
        if "%" in path:
            path = unquote(path, errors="strict")
        bucket, sep, key = path[1:].partition("/")
        if not (bucket and sep and key):
            return False
        limits.check_key(key)
    except (errors.S3Error, UnicodeError, ValueError):
        return False
    return raw_path, qs, bucket, key


def _signature_only(qs: str) -> bool:
    """Whether each parameter of the query is named as a signature's are, as sent (one named
    in escapes is left to the full path), and none can decode to a NUL (limits.check_request):
    the names read without decoding the values (urllib's parse_qsl: ~10 us a query, each
    request target of an epoch a new one)."""
    if "%00" in qs or "\x00" in qs:
        return False
    for piece in qs.split("&"):
        if piece and piece.partition("=")[0] not in _FAST_PARAMS:
            return False
    return True
