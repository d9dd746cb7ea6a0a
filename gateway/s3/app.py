"""The S3 front end as an ASGI callable: parse, route, authenticate, run, render errors once.

Every operation goes through the same steps in the same order (MinIO's habit): the request
is parsed and routed, authenticated, and handed to its handler; any S3Error raised on the
way is rendered here, once, as S3's XML error document with the request id.
"""

from __future__ import annotations

import logging
import re
import time

from gateway import errors, metrics
from gateway.logs import AccessLog
from gateway.s3.handlers import Context
from gateway.s3.http import (
    Message,
    Receive,
    Reply,
    S3Request,
    Scope,
    Send,
    parse_request,
    send_reply,
)
from gateway.s3.routing import Operation, route
from gateway.s3.sigv2 import SigV2Verifier, is_sigv2
from gateway.s3.sigv4 import AuthResult, SigV4Verifier
from gateway.service.gateway import Gateway

log = logging.getLogger("gateway.s3")

_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


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
        self, gateway: Gateway, region: str, base_domain: str | None, log_access: bool
    ) -> None:
        self.gateway = gateway
        self.ctx = Context(gateway, region)
        self.base_domain = base_domain
        self.access_log = AccessLog() if log_access else None
        self.verifier = SigV4Verifier(gateway.namespace.secret_for)
        self.verifier_v2 = SigV2Verifier(gateway.namespace.secret_for)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
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
            op = route(req)
            await self.authenticate(req, op)
            reply = await op.handler(self.ctx, req)
        except errors.S3Error as exc:
            reply = error_reply(exc, req)
        except Exception:
            log.exception("internal error", extra={"request_id": req.request_id})
            reply = error_reply(errors.InternalError(), req)
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
        metrics.observe(name, reply.status, cache, sent, elapsed)
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
                }
            )

    def _verify(self, req: S3Request) -> AuthResult | None:
        if is_sigv2(req.headers, req.query_string):
            in_host = req.bucket if req.virtual_host else None
            return self.verifier_v2.verify(
                req.method, req.raw_path, req.query_string, req.headers, in_host
            )
        return self.verifier.verify(req.method, req.raw_path, req.query_string, req.headers)

    async def authenticate(self, req: S3Request, op: Operation) -> None:
        try:
            result = self._verify(req)
        except errors.S3Error as exc:
            if exc.code != "InvalidAccessKeyId":
                raise
            # Perhaps created since the last refresh: look again before refusing.
            ak = _claimed_access_key(req)
            if ak is None or await self.gateway.namespace.lookup_unknown_key(ak) is None:
                raise
            result = self._verify(req)
        if result is not None:
            req.access_key = result.access_key
            req.auth = result
            return
        if op.read_only and req.bucket is not None:
            handle = self.gateway.namespace.mount(req.bucket)
            if handle is not None and handle.public_read:
                return
        raise errors.AccessDenied()
