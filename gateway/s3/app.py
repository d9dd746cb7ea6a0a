"""The S3 front end as an ASGI callable: parse, route, authenticate, run, render errors once.

Every operation goes through the same steps in the same order (MinIO's habit): the request
is parsed and routed, authenticated, and handed to its handler; any S3Error raised on the
way is rendered here, once, as S3's XML error document with the request id.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable

from gateway import counters, errors, timing
from gateway.logs import AccessLog
from gateway.s3 import handlers_cors, limits
from gateway.s3.fast import FastHits
from gateway.s3.handlers import Context
from gateway.s3.http import (
    ZEROCOPY,
    Message,
    Receive,
    Reply,
    S3Request,
    Scope,
    Send,
    parse_request,
    send_reply,
)
from gateway.s3.post_object import PostObject
from gateway.s3.routing import Operation, route
from gateway.s3.sigv2 import SigV2Verifier, is_sigv2
from gateway.s3.sigv4 import AuthResult, SigV4Verifier
from gateway.service import Caller, S3Service

log = logging.getLogger(__name__)

DOCUMENTS = "/_gateway/"  # no bucket is named so: "_" may not begin one
# Documents are never public: anonymous requests for them are refused.
_DOCUMENT = Operation("GetGatewayDocument", lambda ctx, req: _no_handler(), read_only=False)
_PREFLIGHT = Operation("PreflightRequest", lambda ctx, req: _no_handler(), read_only=True)
# A browser's form upload: authenticated by its form, not its headers (post_object.py).
_POST_OBJECT = Operation(
    "PostObject", lambda ctx, req: _no_handler(), read_only=False, action="s3:PutObject"
)
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


async def _no_handler() -> Reply:
    raise AssertionError("answered by S3App itself (documents, preflights, POST Object)")


def _claimed_access_key(req: S3Request) -> str | None:
    cred = req.query.get("X-Amz-Credential")
    if cred:
        return cred.split("/", 1)[0]
    if "AWSAccessKeyId" in req.query:
        return req.query["AWSAccessKeyId"]
    header = req.headers.get("authorization", "")
    if header.startswith("AWS "):
        return header[4:].rpartition(":")[0].strip() or None
    m = _CREDENTIAL.search(header)
    return m.group(1) if m else None


class _BodyTracker:
    """Knows whether the request's body has been read to its end."""

    def __init__(self, receive: Receive, headers: dict[str, str]) -> None:
        self._receive = receive
        length = headers.get("content-length", "0").strip()
        self.ended = ("transfer-encoding" not in headers) and length in ("", "0")

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.ended = True
        return message

    @property
    def unread(self) -> bool:
        return not self.ended


def error_reply(exc: errors.S3Error, req: S3Request) -> Reply:
    reply = Reply(status=exc.status)
    for name, value in exc.headers.items():
        reply.header(name, value)
    if exc.status == 304:
        return reply
    reply.header("content-type", "application/xml")
    reply.body = exc.to_xml(req.request_id, req.resource)
    return reply


class S3App:
    def __init__(
        self, service: S3Service, region: str, base_domain: str | None, log_access: bool
    ) -> None:
        self.service = service
        self.ctx = Context(service, region)
        self.base_domain = base_domain
        self.access_log = AccessLog() if log_access else None
        self.verifier = SigV4Verifier(service.secret_for)
        self.verifier_v2 = SigV2Verifier(service.secret_for)
        self.fast = FastHits(service, self.verifier, base_domain, self.access_log, self.verifier_v2)
        self.post_object = PostObject(service, self.verifier, self.verifier_v2)
        # JSON documents for clients at /_gateway/<name> (the node gives them), signed GETs.
        # Each is given the caller's access key: a document shows what that key may see.
        self.documents: dict[str, Callable[[str | None], Awaitable[bytes]]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        waits = timing.begin()
        try:
            req = parse_request(scope, self.base_domain)
        except UnicodeDecodeError:
            req = S3Request(scope["method"], "/", "", {}, {}, None, None)
            reply = error_reply(errors.InvalidArgument("The path is not valid UTF-8."), req)
            await send_reply(send, reply, req.method == "HEAD", req.request_id)
            return
        tracker = _BodyTracker(receive, req.headers)
        req.receive = tracker.receive
        op: Operation | None = None
        try:
            if self.service.state_stale():
                # A bucket, policy, user or key changed through another worker of this node
                # (or the CLI): every request after its acknowledgement sees it.
                await self.service.state_current()
            if req.raw_path.startswith(DOCUMENTS):
                op = _DOCUMENT
                reply = await self._document(req)
            elif req.method == "OPTIONS":  # a browser's CORS preflight: no signature, as S3
                op = _PREFLIGHT
                reply = handlers_cors.preflight(self.ctx, req)
            elif req.method == "POST" and req.key is None and req.bucket and not req.query:
                op = _POST_OBJECT
                reply = await self.post_object.handle(req, scope)
            else:
                try:
                    op = route(req)
                except (errors.NotImplementedError_, errors.MethodNotAllowed):
                    # Who asks comes first, as in S3: an anonymous `GET /bucket?policy` is
                    # AccessDenied, not NotImplemented.
                    await self.authenticate(req, None)
                    raise
                await self.authenticate(req, op)
                self.authorize(req, op, scope)
                limits.check_request(req.key, req.query)
                # Blocks of the cache go out from their files where the server sends them.
                req.zero_copy = ZEROCOPY in scope.get("extensions", ())
                reply = await op.handler(self.ctx, req)
        except errors.S3Error as exc:
            reply = error_reply(exc, req)
        except Exception:
            log.exception("internal error", extra={"request_id": req.request_id})
            reply = error_reply(errors.InternalError(), req)
        if "origin" in req.headers and op is not _PREFLIGHT:
            handlers_cors.add_headers(self.ctx, req, reply)
        if tracker.unread:
            # The client may still be sending (or, after Expect: 100-continue, holding back)
            # a body we will not read; on a kept-alive connection those bytes would be taken
            # for the next request. Close it, as S3 does.
            reply.header("connection", "close")
        sent = 0
        try:
            sent = await send_reply(send, reply, req.method == "HEAD", req.request_id)
        except Exception as exc:
            # Headers are out: all we can do is cut the connection so the client sees a
            # short body instead of a silently wrong one.
            log.warning("response aborted: %s", exc, extra={"request_id": req.request_id})
        name = op.name if op else "Unknown"
        elapsed = time.perf_counter() - started
        cache = reply.cache or "none"
        # reply.cache is set by an object read that found its mount: only then a bucket label.
        counters.observe(
            name, reply.status, cache, sent, elapsed, req.bucket if reply.cache else None
        )
        if self.access_log is not None:
            self.access_log.write(
                {
                    "request_id": req.request_id,
                    "op": name,
                    "method": req.method,
                    "bucket": req.bucket,
                    "key": req.key,
                    "status": reply.status,
                    "bytes": sent,
                    "ms": round(elapsed * 1000, 3),
                    "cache": reply.cache,
                    "access_key": req.access_key,
                    # Its store reads' time to their first byte, summed (0: it read none).
                    "store_ms": round(waits.store_seconds * 1000, 3),
                }
            )

    async def _document(self, req: S3Request) -> Reply:
        """A document for clients (the fleet's placement...): to signed GETs only."""
        try:
            await self.authenticate(req, _DOCUMENT)
        except errors.NoSuchBucket:  # anonymous: no bucket is named "_gateway"
            raise errors.AccessDenied() from None
        produce = self.documents.get(req.raw_path.partition("?")[0][len(DOCUMENTS) :])
        if produce is None or req.method not in ("GET", "HEAD"):
            raise errors.NotImplementedError_("No such document on this node.")
        reply = Reply(body=await produce(req.access_key))
        reply.header("content-type", "application/json")
        return reply

    def _verify(self, req: S3Request) -> AuthResult | None:
        if is_sigv2(req.headers, req.query_string):
            in_host = req.bucket if req.virtual_host else None
            return self.verifier_v2.verify(
                req.method, req.raw_path, req.query_string, req.headers, in_host
            )
        return self.verifier.verify(req.method, req.raw_path, req.query_string, req.headers)

    async def authenticate(self, req: S3Request, op: Operation | None) -> None:
        """Set the request's key, or let it through anonymously to a public bucket's reads;
        else AccessDenied (NoSuchBucket for a bucket there is not, as S3 answers). `op` None:
        a request no operation takes, let through only when signed."""
        if req.bucket is not None and not self.service.has_bucket(req.bucket):
            await self.service.lookup_new_bucket(req.bucket)  # mounted since the last refresh?
        try:
            result = self._verify(req)
        except errors.S3Error as exc:
            if exc.code != "InvalidAccessKeyId":
                raise
            # Perhaps created since the last refresh: look again before refusing.
            ak = _claimed_access_key(req)
            if ak is None or await self.service.lookup_new_key(ak) is None:
                raise
            result = self._verify(req)
        if result is not None:
            req.access_key = result.access_key
            req.auth = result
            return
        if req.bucket is not None:
            if not self.service.has_bucket(req.bucket):
                raise errors.NoSuchBucket(BucketName=req.bucket)
            if op is not None and op.action:
                return  # anonymous: what a bucket policy (or public_read) allows, below
        raise errors.AccessDenied()

    def authorize(self, req: S3Request, op: Operation, scope: Scope) -> None:
        """AccessDenied unless the user's policies, the bucket's policy or owning the bucket
        allow the operation's action (docs/tenants.md); decided from memory, before anything
        is looked up, so that the answer says nothing of whether the object exists."""
        client = scope.get("client")
        source_ip = client[0] if client else None
        secure = scope.get("scheme") == "https"
        req.caller = Caller(req.access_key, source_ip, secure)
        action = op.action_for(req.query)
        if action == "s3:DeleteObject" and req.key is None:
            return  # DeleteObjects: each key is decided by the service, alone
        query = req.query
        try:
            self.service.authorize(
                req.access_key, action, req.bucket, req.key, source_ip,
                prefix=query.get("prefix") if query else None,
                delimiter=query.get("delimiter") if query else None, secure=secure,
                headers=req.headers,
            )  # fmt: skip
        except errors.AccessDenied:
            bucket = req.bucket
            if (
                bucket is not None
                and action != "s3:CreateBucket"
                and not self.service.has_bucket(bucket)
            ):
                return  # NoSuchBucket from the handler, whoever asks, as S3 answers
            raise
