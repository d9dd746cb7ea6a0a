"""POST Object: a browser's form upload, multipart/form-data to the bucket's URL, authorized by
the form's signed policy document (SigV4) rather than by its headers, as S3's API reference
has it ("POST Object", "Creating a POST policy").

The form is read as it arrives (python-multipart): its fields up to the file, at most
MAX_PRE_DATA bytes; then, before a byte of the file is kept, the signature, the policy's
expiration and conditions and the caller's right to PutObject are checked; then the file, at
most the policy's content-length-range (and MAX_PUT_SIZE), goes to a spool (memory up to
SPOOL_MEMORY, then a temporary file) and from there to the store, as a PutObject of its size.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
from python_multipart.multipart import MultipartParseError, MultipartParser, parse_options_header

from gateway import errors
from gateway.s3 import limits, xml
from gateway.s3.handlers_write import write_attrs
from gateway.s3.http import Reply, S3Request, Scope
from gateway.s3.sigv2 import SigV2Verifier
from gateway.s3.sigv4 import AuthResult, SigV4Verifier
from gateway.s3.sigv4_canonical import ALGORITHM
from gateway.service import MAX_PUT_SIZE, S3Service, WriteConditions

# The form's fields before its file, in bytes as sent: S3 refuses more (its limit is smaller).
MAX_PRE_DATA = 64 << 10
# Bytes after the file that are read (and ignored, as S3 does) so that the connection can be
# kept: a browser sends only the closing boundary there.
MAX_POST_DATA = 64 << 10
SPOOL_MEMORY = 1 << 20
_READ = 1 << 20  # bytes of the spool read at a time, on their way to the store
# Fields no condition needs to name (S3's list), and the prefix of those ignored altogether.
_UNCHECKED = frozenset({"policy", "x-amz-signature", "file", "signature", "awsaccesskeyid"})
_IGNORED = "x-ignore-"
_SIGNED = ("x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-signature")
_STATUSES = {"200": 200, "201": 201, "204": 204}


def _refused(reason: str) -> errors.S3Error:
    return errors.AccessDenied(f"Invalid according to Policy: {reason}")


@dataclass(frozen=True, slots=True)
class PostPolicy:
    """A policy document: until when it holds, and the conditions the form must meet."""

    expiration: datetime
    conditions: tuple[tuple[str, str, str], ...]  # (eq | starts-with, field, value)
    length: tuple[int, int] | None  # content-length-range: the file's least and most bytes

    @classmethod
    def parse(cls, encoded: str) -> PostPolicy:
        """InvalidPolicyDocument for what is no policy: not base64, not JSON, no expiration
        or conditions, a condition of no known form."""
        try:
            doc = json.loads(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            raise errors.InvalidPolicyDocument("Invalid Policy: Invalid JSON.") from None
        if not isinstance(doc, dict):
            raise errors.InvalidPolicyDocument("Invalid Policy: Invalid JSON.")
        expiration = doc.get("expiration")
        if not isinstance(expiration, str):
            raise errors.InvalidPolicyDocument("Invalid Policy: Policy missing expiration.")
        try:
            expires = datetime.fromisoformat(expiration)
        except ValueError:
            raise errors.InvalidPolicyDocument(
                f"Invalid Policy: Invalid 'expiration' value: '{expiration}'"
            ) from None
        raw = doc.get("conditions")
        if not isinstance(raw, list):
            raise errors.InvalidPolicyDocument("Invalid Policy: Policy missing conditions.")
        conditions: list[tuple[str, str, str]] = []
        length = None
        for c in raw:
            if isinstance(c, dict) and len(c) == 1:
                name, value = next(iter(c.items()))
                conditions.append(("eq", str(name).lower(), _text(value)))
            elif isinstance(c, list) and len(c) == 3 and str(c[0]).lower() in ("eq", "starts-with"):
                field = str(c[1])
                if not field.startswith("$"):
                    raise errors.InvalidPolicyDocument(f"Invalid Policy: Invalid Condition: {c}")
                conditions.append((str(c[0]).lower(), field[1:].lower(), _text(c[2])))
            elif isinstance(c, list) and len(c) == 3 and c[0] == "content-length-range":
                try:
                    length = (int(c[1]), int(c[2]))
                except (TypeError, ValueError):
                    raise errors.InvalidPolicyDocument(
                        f"Invalid Policy: Invalid content-length-range: {c}"
                    ) from None
            else:
                raise errors.InvalidPolicyDocument(f"Invalid Policy: Invalid Condition: {c}")
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=UTC)
        return cls(expires, tuple(conditions), length)

    def check(self, fields: Mapping[str, str], now: datetime) -> None:
        """AccessDenied, saying why, unless the policy holds now for these fields (lower-case
        names; `bucket` is the request's, `key` with ${filename} in place): each condition
        met, and each field the form has named by a condition."""
        if now > self.expiration:
            raise _refused("Policy expired.")
        for op, field, value in self.conditions:
            given = fields.get(field, "")
            if not (given == value if op == "eq" else given.startswith(value)):
                raise _refused(f'Policy Condition failed: ["{op}", "${field}", "{value}"]')
        named = {field for _, field, _ in self.conditions} | {"bucket"}
        for field in fields:
            if field not in named and field not in _UNCHECKED and not field.startswith(_IGNORED):
                raise _refused(f"Extra input fields: {field}")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class _Form:
    """The form as it arrives: fields, then the file's start, its data and its end, as events
    taken from the parser's callbacks after each piece of the body."""

    def __init__(self, req: S3Request, boundary: bytes) -> None:
        assert req.receive is not None
        self._receive = req.receive
        self._events: deque[tuple[str, Any]] = deque()
        self._ended = False
        self._pre = 0  # bytes of the body read before the file began
        self._post = -1  # bytes read after the file ended (-1: it has not)
        self._in_file = False
        self._began = False  # the file's part has begun
        self._part_name = ""
        self._part_data = bytearray()
        self._header = [bytearray(), bytearray()]
        self._disposition = b""
        callbacks: Any = {
            "on_part_begin": self._part_begin,
            "on_part_data": self._data,
            "on_part_end": self._part_end,
            "on_header_field": lambda d, s, e: self._header[0].extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._header[1].extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
        }
        self._parser = MultipartParser(boundary, callbacks)

    def _part_begin(self) -> None:
        self._part_name, self._disposition = "", b""
        self._part_data.clear()

    def _header_end(self) -> None:
        if bytes(self._header[0]).lower() == b"content-disposition":
            self._disposition = bytes(self._header[1])
        self._header[0].clear()
        self._header[1].clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        self._part_name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._part_name.lower() == "file" and not self._began:
            self._in_file = self._began = True
            filename = options.get(b"filename", b"").decode("utf-8", "replace")
            self._events.append(("file", filename))

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self._events.append(("data", data[start:end]))
        elif self._post < 0:
            self._part_data.extend(data[start:end])

    def _part_end(self) -> None:
        if self._in_file:
            self._in_file = False
            self._post = 0
            self._events.append(("end", None))
        elif self._post < 0:
            value = self._part_data.decode("utf-8", "replace")
            self._events.append(("field", (self._part_name, value)))

    async def event(self) -> tuple[str, Any] | None:
        """The next event, None once the body has ended."""
        while not self._events:
            if self._ended:
                return None
            await self._pull()
        return self._events.popleft()

    async def _pull(self) -> None:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise errors.IncompleteBody()
        body = message.get("body", b"")
        if self._post >= 0:
            self._post += len(body)
            if self._post > MAX_POST_DATA:
                self._ended = True  # the rest is not read: the connection is closed after
                return
        elif not self._began:
            self._pre += len(body)
        try:
            if body:
                self._parser.write(body)
            if not message.get("more_body", False):
                self._parser.finalize()
                self._ended = True
        except MultipartParseError:
            raise errors.MalformedPOSTRequest() from None
        if not self._began and self._pre > MAX_PRE_DATA:
            raise errors.MaxPostPreDataLengthExceeded()


class PostObject:
    """POST Object for the S3 front end: the form read, checked and written through the
    service, as PutObject of the form's file."""

    def __init__(
        self, service: S3Service, verifier: SigV4Verifier, verifier_v2: SigV2Verifier
    ) -> None:
        self.service = service
        self.verifier = verifier
        self.verifier_v2 = verifier_v2

    async def handle(self, req: S3Request, scope: Scope) -> Reply:
        assert req.bucket is not None
        bucket = req.bucket
        if not self.service.has_bucket(bucket):
            await self.service.lookup_new_bucket(bucket)
            if not self.service.has_bucket(bucket):
                raise errors.NoSuchBucket(BucketName=bucket)
        kind, options = parse_options_header(req.headers.get("content-type", ""))
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise errors.PreconditionFailed(
                Condition="Bucket POST must be of the enclosure-type multipart/form-data"
            )
        declared = req.headers.get("content-length", "").strip()
        if declared.isdigit() and int(declared) > MAX_PUT_SIZE + MAX_PRE_DATA + MAX_POST_DATA:
            raise errors.EntityTooLarge(MaxSizeAllowed=str(MAX_PUT_SIZE))
        form = _Form(req, boundary)
        fields: dict[str, str] = {}
        filename = None
        while (event := await form.event()) is not None:
            kind_, value = event
            if kind_ == "field":
                fields.setdefault(value[0].lower(), value[1])
            elif kind_ == "file":
                filename = value
                break
        if filename is None:
            raise errors.InvalidArgument(
                "POST requires exactly one file upload per request.",
                ArgumentName="file",
                ArgumentValue="0",
            )
        key, most, least = await self._allowed(req, scope, fields, filename)
        async with anyio.SpooledTemporaryFile(max_size=SPOOL_MEMORY) as spool:
            size = 0
            while (event := await form.event()) is not None and event[0] == "data":
                size += len(event[1])
                if size > most:
                    raise errors.EntityTooLarge(ProposedSize=str(size), MaxSizeAllowed=str(most))
                await spool.write(event[1])
            if event is None:  # the body ended inside the file: no closing boundary
                raise errors.IncompleteBody()
            while await form.event() is not None:
                pass  # after the file: ignored, as S3 does
            if size < least:
                raise errors.EntityTooSmall(ProposedSize=str(size), MinSizeAllowed=str(least))
            await spool.seek(0)
            attrs = write_attrs(S3Request("POST", "", "", _as_headers(fields), {}, bucket, key))
            info = await self.service.put_object(
                bucket, key, _chunks(spool, size), size, attrs, WriteConditions()
            )
        return _answer(req, scope, fields, key, info.etag)

    async def _allowed(
        self, req: S3Request, scope: Scope, fields: dict[str, str], filename: str
    ) -> tuple[str, int, int]:
        """The object's key, and the file's most and least bytes, once the form may write it:
        signed (or anonymous, with no policy), its policy holding, the caller allowed to put
        the key; else the error S3 answers."""
        assert req.bucket is not None
        if "key" not in fields:
            raise errors.InvalidArgument(
                "Bucket POST must contain a field named 'key'.  If it is specified, please"
                " check the order of the fields.",
                ArgumentName="key",
                ArgumentValue="",
            )
        key = fields["key"].replace("${filename}", filename)
        limits.check_key(key)
        if not key:
            raise errors.InvalidArgument(
                "User key must have a length greater than 0.", ArgumentName="key"
            )
        access_key = None
        most, least = MAX_PUT_SIZE, 0
        if "policy" in fields:
            access_key = await self._signed(fields)
            policy = PostPolicy.parse(fields["policy"])
            policy.check({**fields, "bucket": req.bucket, "key": key}, datetime.now(UTC))
            if policy.length is not None:
                least, most = policy.length[0], min(most, policy.length[1])
        elif any(name in fields for name in (*_SIGNED, "signature", "awsaccesskeyid")):
            raise errors.InvalidArgument(
                "Bucket POST must contain a field named 'policy'.  If it is specified, please"
                " check the order of the fields.",
                ArgumentName="policy",
                ArgumentValue="",
            )
        req.access_key = access_key
        client = scope.get("client")
        source_ip = client[0] if client else None
        secure = scope.get("scheme") == "https"
        headers = _as_headers(fields)  # what a policy's conditions on headers look at
        self.service.authorize(access_key, "s3:PutObject", req.bucket, key, source_ip,
                               secure=secure, headers=headers)  # fmt: skip
        self.service.check_writable(req.bucket)
        return key, most, least

    async def _signed(self, fields: Mapping[str, str]) -> str:
        """The access key whose signature the form's policy carries (SignatureDoesNotMatch,
        InvalidAccessKeyId, ... else)."""
        if "x-amz-algorithm" not in fields and (
            "signature" in fields or "awsaccesskeyid" in fields
        ):
            return await self._signed_v2(fields)
        _required(fields, [(name, name) for name in _SIGNED])
        if fields["x-amz-algorithm"] != ALGORITHM:
            raise errors.InvalidArgument(
                "Unsupported algorithm.",
                ArgumentName="x-amz-algorithm",
                ArgumentValue=fields["x-amz-algorithm"],
            )
        args = (fields["x-amz-credential"], fields["x-amz-date"], fields["policy"],
                fields["x-amz-signature"])  # fmt: skip
        access_key = args[0].split("/", 1)[0]
        return await self._verified(access_key, lambda: self.verifier.verify_policy(*args))

    async def _signed_v2(self, fields: Mapping[str, str]) -> str:
        """The access key of a form signed with SigV2 (`AWSAccessKeyId`, `signature`: the
        HMAC-SHA1 of the policy), as S3 still takes it."""
        _required(fields, [("awsaccesskeyid", "AWSAccessKeyId"), ("signature", "Signature")])
        access_key, policy, signature = (
            fields["awsaccesskeyid"], fields["policy"], fields["signature"]
        )  # fmt: skip
        return await self._verified(
            access_key, lambda: self.verifier_v2.verify_policy(access_key, policy, signature)
        )

    async def _verified(self, access_key: str, verify: Callable[[], AuthResult]) -> str:
        """The access key `verify` confirms; a key unknown to it may have been created since
        the last refresh: looked for again before the form is refused."""
        try:
            return verify().access_key
        except errors.InvalidAccessKeyId:
            if await self.service.lookup_new_key(access_key) is None:
                raise
            return verify().access_key


def _required(fields: Mapping[str, str], names: list[tuple[str, str]]) -> None:
    """InvalidArgument, as S3 words it, for the first of `names` (field, as shown) missing."""
    for name, shown in names:
        if not fields.get(name):
            raise errors.InvalidArgument(
                f"Bucket POST must contain a field named '{shown}'.  If it is specified,"
                " please check the order of the fields.",
                ArgumentName=shown,
                ArgumentValue="",
            )


def _as_headers(fields: Mapping[str, str]) -> dict[str, str]:
    """The form's fields as PutObject's headers say the same: the object's attributes, its
    user metadata and encryption under their own names, the canned ACL as x-amz-acl.
    NotImplemented for `tagging` (an XML document in a form), which would be dropped."""
    if "tagging" in fields:
        raise errors.NotImplementedError_(
            "POST Object with a tagging field is not implemented by this gateway."
        )
    headers = dict(fields)
    if "acl" in headers:
        headers["x-amz-acl"] = headers.pop("acl")
    return headers


async def _chunks(spool: Any, size: int) -> AsyncIterator[bytes]:
    left = size
    while left > 0:
        data = await spool.read(min(_READ, left))
        if not data:
            raise errors.IncompleteBody()
        left -= len(data)
        yield data


def _answer(req: S3Request, scope: Scope, fields: Mapping[str, str], key: str, etag: str) -> Reply:
    """What S3 answers a POST that wrote the object: a 303 to success_action_redirect (with
    the bucket, key and ETag in its query) when it is a URL; else success_action_status (200
    or 204 with no body, 201 with a PostResponse document; 204 by default)."""
    assert req.bucket is not None
    host = req.headers.get("host", "")
    location = f"{scope.get('scheme', 'http')}://{host}/{req.bucket}/{quote(key)}"
    redirect = fields.get("success_action_redirect") or fields.get("redirect")
    if redirect and urlsplit(redirect).scheme in ("http", "https"):
        query = f"bucket={quote(req.bucket)}&key={quote(key)}&etag={quote(etag)}"
        reply = Reply(status=303)
        reply.header("location", f"{redirect}{'&' if '?' in redirect else '?'}{query}")
        reply.header("etag", etag)
        return reply
    status = _STATUSES.get(fields.get("success_action_status", ""), 204)
    reply = Reply(status=status)
    reply.header("etag", etag)
    reply.header("location", location)
    if status == 201:
        reply.header("content-type", "application/xml")
        reply.body = xml.post_response(location, req.bucket, key, etag)
    return reply
