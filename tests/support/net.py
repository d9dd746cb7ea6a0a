"""Loopback helpers for tests that start real servers: free ports, readiness waits, and the
one way a test waits for something to happen (`eventually`, and its form for async tests)."""

from __future__ import annotations

import asyncio
import inspect
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import httpx

T = TypeVar("T")


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


def eventually(check: Callable[[], T], timeout: float = 15.0, interval: float = 0.05) -> T:
    """Poll `check` until it returns a true value, and return that value: the positive signal
    a test waits for. An exception (a bucket not mounted yet) counts as not yet; after
    `timeout` seconds the last one, or an AssertionError, is raised."""
    deadline = time.monotonic() + timeout
    while True:
        value, failure = _look(check, timeout)
        if failure is None:
            return value
        if time.monotonic() > deadline:
            raise failure
        time.sleep(interval)


async def eventually_async(
    check: Callable[[], T | Awaitable[T]],
    timeout: float = 15.0,  # noqa: ASYNC109 (the same arguments as eventually)
    interval: float = 0.02,
) -> T:
    """`eventually` for a test on the event loop, where the code under test runs on the same
    loop (it gets the loop between two looks); `check` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            value, failure = None, exc
        else:
            failure = None if value else AssertionError(f"{check} still false after {timeout}s")
        if failure is None:
            return cast(T, value)
        if time.monotonic() > deadline:
            raise failure
        await asyncio.sleep(interval)


def _look(check: Callable[[], T], timeout: float) -> tuple[T, None] | tuple[None, Exception]:
    """One look: the true value, or why not yet."""
    try:
        value = check()
    except Exception as exc:
        return None, exc
    if value:
        return value, None
    return None, AssertionError(f"{check} still false after {timeout}s")
