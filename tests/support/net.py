"""Loopback helpers for tests that start real servers: free ports and readiness waits."""

from __future__ import annotations

import socket
import ssl
import time

import httpx


def tls_context(cafile: str | None) -> ssl.SSLContext | bool:
    """What httpx should verify against: the test CA when there is one."""
    return ssl.create_default_context(cafile=cafile) if cafile else True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(
    url: str, timeout: float = 30.0, proc: object | None = None, cafile: str | None = None
) -> None:
    """Poll `url` until it answers (any status below 500) or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        poll = getattr(proc, "poll", None)
        if poll is not None and poll() is not None:
            raise RuntimeError(f"server process exited with {poll()} before {url} answered")
        try:
            if httpx.get(url, timeout=2.0, verify=tls_context(cafile)).status_code < 500:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout}s: {last}")
