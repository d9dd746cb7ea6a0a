"""An S3 origin that answers oddly, as real ones sometimes do: the counting proxy in front of
moto, rewriting some of moto's replies or answering some requests itself.

- `blank_etags(*ops)`: the replies to these operations carry an empty ETag, in the header and
  in the XML body, as Ceph RGW 16.2 answers CompleteMultipartUpload.
- `fail_next(op, status, code)`: the next request of that operation is read to its end and
  answered with that S3 error (a 500 InternalError that a client retries, a 400 that it does
  not), without reaching moto.
- `fail_next(op, status, code, forward=True)`: the request reaches moto, which does it, and
  the answer is replaced by that error: a store that did the work and then failed to say so.
- `whole_gets = True`: GETs reach the upstream without their Range (or Azure's x-ms-range)
  header, so a ranged GET is answered 200 with the whole object, as some origins answer one.
- `parts_ignored = True`: GETs and HEADs reach the upstream without their `partNumber`, so a
  part is answered as the whole object, as Ceph RGW 16.2 answers one.

- `generation_answered = "N"` (in front of fake-gcs-server): every answer says it is of
  generation N (`x-goog-generation`), as a server that ignores the generation asked for
  answers with the one it has.

The proxy forwards to any HTTP upstream, so it stands in front of Azurite and
fake-gcs-server as well as moto (a request it does not recognise as S3 is passed on as is).
"""

from __future__ import annotations

import http.client
import re
from dataclasses import dataclass
from urllib.parse import parse_qs

from tests.support.origin import _HOP_BY_HOP, CountingProxy, ProxiedRequest, _Handler, _ProxyServer

_ETAG_ELEMENT = re.compile(rb"<ETag>[^<]*</ETag>")


def operation(method: str, path: str, query: str, headers: dict[str, str]) -> str:
    """The S3 operation a path-style request to moto is (only those the tests rewrite)."""
    params = parse_qs(query, keep_blank_values=True)
    copy = "x-amz-copy-source" in headers
    if method == "PUT" and "partNumber" in params:
        return "UploadPartCopy" if copy else "UploadPart"
    if method == "PUT" and path.count("/") >= 2 and path.split("/", 2)[2]:
        return "CopyObject" if copy else "PutObject"
    if method == "POST" and "uploads" in params:
        return "CreateMultipartUpload"
    if method == "POST" and "uploadId" in params:
        return "CompleteMultipartUpload"
    if method == "GET" and "uploads" in params:
        return "ListMultipartUploads"
    if method == "DELETE" and "uploadId" not in params and path.count("/") >= 2:
        return "DeleteObject"
    return f"{method} {path}"


@dataclass(frozen=True, slots=True)
class Failure:
    status: int
    code: str
    forward: bool = False


class _OddHandler(_Handler):
    server: _ProxyServer
    _rewriting = False
    _swallowed: Failure | None = None

    def _op(self) -> str:
        path, _, query = self.path.partition("?")
        headers = {k.lower(): v for k, v in self.headers.items()}
        return operation(self.command, path, query, headers)

    def do_any(self) -> None:
        owner = self.server.owner
        assert isinstance(owner, OddOrigin)
        op = self._op()
        failure = owner._take_failure(op)
        if failure is None or failure.forward:
            self._rewriting = op in owner._blanked
            self._swallowed = failure
            if owner.whole_gets and self.command == "GET":
                del self.headers["Range"]
                del self.headers["x-ms-range"]
            if owner.parts_ignored and self.command in ("GET", "HEAD") and "?" in self.path:
                path, _, query = self.path.partition("?")
                kept = "&".join(p for p in query.split("&") if not p.startswith("partNumber="))
                self.path = f"{path}?{kept}" if kept else path
            super().do_any()
            return
        path, _, query = self.path.partition("?")
        owner._record(ProxiedRequest(self.command, path, query, self.headers["Range"]))
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        body = self._request_body(chunked)
        if body is not None and not isinstance(body, bytes):
            for _ in body:  # the whole body first, so that the answer reaches the client
                pass
        self._send_failure(failure)

    def _send_failure(self, failure: Failure) -> None:
        reply = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{failure.code}</Code><Message>injected by the test</Message>"
            "<RequestId>odd-origin</RequestId></Error>"
        ).encode()
        self.send_response_only(failure.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
        self.wfile.flush()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_any

    def send_header(self, keyword: str, value: str) -> None:
        owner = self.server.owner
        assert isinstance(owner, OddOrigin)
        if owner.generation_answered is not None and keyword.lower() == "x-goog-generation":
            value = owner.generation_answered
        super().send_header(keyword, value)

    def _relay(self, response: http.client.HTTPResponse) -> None:
        if self._swallowed is not None:
            failure, self._swallowed = self._swallowed, None
            response.read()
            response.close()
            self._drop_upstream()
            self._send_failure(failure)
            return
        if not self._rewriting:
            super()._relay(response)
            return
        body = _ETAG_ELEMENT.sub(b"<ETag></ETag>", response.read())
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            lower = name.lower()
            if lower in _HOP_BY_HOP or lower == "content-length":
                continue
            self.send_header(name, "" if lower == "etag" else value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()
        response.close()
        if response.will_close:
            self._drop_upstream()


class OddOrigin(CountingProxy):
    """The counting proxy with odd answers (see the module's docstring)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._server.RequestHandlerClass = _OddHandler
        self._blanked: set[str] = set()
        self._failures: dict[str, list[Failure]] = {}
        self.whole_gets = False
        self.parts_ignored = False
        self.generation_answered: str | None = None

    def blank_etags(self, *ops: str) -> None:
        with self._lock:
            self._blanked = set(ops)

    def fail_next(
        self, op: str, status: int, code: str, count: int = 1, forward: bool = False
    ) -> None:
        with self._lock:
            self._failures[op] = [Failure(status, code, forward)] * count

    def _take_failure(self, op: str) -> Failure | None:
        with self._lock:
            queue = self._failures.get(op)
            return queue.pop() if queue else None

    def reset(self) -> None:
        super().reset()
        with self._lock:
            self._blanked.clear()
            self._failures.clear()
        self.whole_gets = False
        self.parts_ignored = False
        self.generation_answered = None
