"""Azurite (Microsoft's Azure Blob emulator) as a test origin: the server in a subprocess, and
an `AzureOrigin` that puts blobs with Microsoft's own SDK so the store is checked against an
independent client."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gateway.stores import Store, open_store
from tests.support import procs
from tests.support.net import wait_http
from tests.support.stores import (
    DECOYS,
    MOUNT_PREFIX,
    LoopbackServer,
    Origin,
    QuietHandler,
    start_at_a_free_port,
)

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / ".test-servers" / "node_modules" / ".bin" / "azurite-blob"
INSTALL = "scripts/install-test-servers"
ACCOUNT = "devstoreaccount1"
# The well-known development key Azurite documents; it guards nothing.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class AzuriteServer:
    """`azurite-blob` on 127.0.0.1 at a free port, blobs kept under `location`.

    `.url` is the account endpoint (path-style: http://127.0.0.1:PORT/devstoreaccount1).
    A missing binary is an error, not a skip: the tests would silently stop covering Azure.
    """

    account = ACCOUNT
    key = KEY

    def __init__(self, location: str | os.PathLike[str]) -> None:
        if not os.access(BINARY, os.X_OK):
            raise RuntimeError(f"Azurite is not installed ({BINARY} missing): run {INSTALL}")
        self.location = Path(location)
        self.location.mkdir(parents=True, exist_ok=True)
        self.log_path = self.location / "azurite.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        start_at_a_free_port(self, "Azurite")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    def start(self) -> None:
        args = [str(BINARY), "--blobHost", "127.0.0.1", "--blobPort", str(self.port)]
        args += ["--location", str(self.location), "--skipApiVersionCheck", "--loose"]
        # Without --disableTelemetry Azurite tries to reach the internet.
        args += ["--disableProductStyleUrl", "--disableTelemetry", "--silent"]
        with open(self.log_path, "ab") as log:
            self.proc = procs.start(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        # Any answer below 500 means it listens; an unsigned account GET gets 4xx.
        wait_http(f"{self.url}?comp=list", timeout=30, proc=self.proc)

    def stop(self, kill: bool = False) -> None:
        """Stop the server; kill=True is a crash (SIGKILL), connections cut mid-request."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        procs.end(proc)

    def restart(self) -> None:
        """Start again on the same port and location: the blobs written before are there."""
        self.stop()
        self.start()


def store_options(server: AzuriteServer, **extra: str) -> dict[str, str]:
    return {"endpoint": server.url, "account_key": server.key, **extra}


def sdk_client(server: AzuriteServer) -> Any:
    """A synchronous BlobServiceClient of Microsoft's SDK, for setting up and checking data."""
    from azure.storage.blob import BlobServiceClient

    conn = (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint={server.url};"
    )
    return BlobServiceClient.from_connection_string(conn)


class AzureOrigin(Origin):
    """A fresh container with decoys next to the mount prefix; `.store` mounts `MOUNT_PREFIX`."""

    kind = "azure"

    def __init__(self, server: AzuriteServer, **options: str) -> None:
        self.server = server
        self.container = f"c-{uuid.uuid4().hex[:12]}"
        self.sdk = sdk_client(server)
        self.blobs = self.sdk.create_container(self.container)
        for key in DECOYS:
            self.blobs.upload_blob(key, b"decoy")
        self.store: Store = open_store(
            f"az://{ACCOUNT}/{self.container}/{MOUNT_PREFIX}", store_options(server, **options)
        )

    def put(self, key: str, data: bytes, content_type: str | None = None, **extra: Any) -> None:
        from azure.storage.blob import ContentSettings

        settings = ContentSettings(content_type=content_type) if content_type else None
        self.blobs.upload_blob(
            f"{MOUNT_PREFIX}/{key}", data, overwrite=True, content_settings=settings, **extra
        )

    def raw_keys(self) -> list[str]:
        """Committed blobs under the mount, relative to it."""
        cut = len(MOUNT_PREFIX) + 1
        found = self.blobs.list_blobs(name_starts_with=f"{MOUNT_PREFIX}/")
        return sorted(b.name[cut:] for b in found)


class FlakyFront:
    """An HTTP front on 127.0.0.1 that answers the first `failures` requests with `status`
    (503 ServerBusy, as Azure throttles) and forwards the rest to `upstream`."""

    def __init__(self, upstream: str, failures: int, status: int = 503) -> None:
        self.upstream = urlsplit(upstream).netloc
        self.failures = failures
        self.status = status
        self.seen: list[tuple[str, int]] = []  # (method, status answered)
        self._lock = threading.Lock()
        front = self

        class Handler(QuietHandler):
            def do_any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with front._lock:
                    fail = front.failures > 0
                    front.failures -= fail
                if fail:
                    self._answer(front.status, {"x-ms-error-code": "ServerBusy"}, b"")
                    return
                conn = http.client.HTTPConnection(front.upstream, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                    r = conn.getresponse()
                    data = r.read()
                    headers = {k: v for k, v in r.getheaders() if k.lower() != "transfer-encoding"}
                    self._answer(r.status, headers, data)
                finally:
                    conn.close()

            def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
                with front._lock:
                    front.seen.append((self.command, status))
                lengths = [v for k, v in headers.items() if k.lower() == "content-length"]
                # A HEAD answers the length of the body it does not send.
                length = lengths[0] if self.command == "HEAD" and lengths else str(len(data))
                self.send_response_only(status)
                for name, value in headers.items():
                    if name.lower() != "content-length":
                        self.send_header(name, value)
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_DELETE = do_any

        self._http = LoopbackServer(Handler)
        self.url = f"http://127.0.0.1:{self._http.port}/{ACCOUNT}"

    def stop(self) -> None:
        self._http.stop()
