"""The limit on failed console sign-ins (gateway/console/signin.py): five failures of one key
from one address within the window refuse that key from that address until the oldest of them
is a window old (twenty from one address, any key from it); the same key from elsewhere is
not limited; nothing sleeps, the clock is moved on. Last,
the console itself over HTTP on loopback (uvicorn in this process, so that its clock is the
test's): 401 five times, 429 for the right secret, a sign-in again once the window has passed."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from gateway.console.routes import PREFIX, Console
from gateway.console.signin import SignInLimits
from gateway.meta import MetaStore, SecretBox
from tests.support.net import eventually_async


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.anyio
@pytest.mark.parametrize("shared", [False, True], ids=["memory", "file"])
async def test_five_failures_limit_that_key_from_that_address_for_the_window(
    tmp_path: Path, shared: bool
) -> None:
    clock = Clock()
    limits = SignInLimits(clock, str(tmp_path / "signins") if shared else None)
    for _ in range(4):
        await limits.failed("GKADMIN", "10.0.0.1")
        clock.now += 10
    assert await limits.retry_after("GKADMIN", "10.0.0.1") == 0
    await limits.failed("GKADMIN", "10.0.0.1")  # the fifth, 40 s after the first
    assert await limits.retry_after("GKADMIN", "10.0.0.1") == 260
    assert await limits.retry_after("GKADMIN", "10.0.0.9") == 0  # the key from elsewhere
    assert await limits.retry_after("GKOTHER", "10.0.0.1") == 0  # another key from there
    clock.now += 259.5
    assert await limits.retry_after("GKADMIN", "10.0.0.1") == 0.5
    clock.now += 0.5  # the first failure is a window old: one more try
    assert await limits.retry_after("GKADMIN", "10.0.0.1") == 0
    await limits.failed(
        "GKADMIN", "10.0.0.1"
    )  # five within the window again, the oldest 10 s later
    assert await limits.retry_after("GKADMIN", "10.0.0.1") == 10
    if shared:  # another worker process reads the same file
        other = SignInLimits(clock, str(tmp_path / "signins"))
        assert await other.retry_after("GKADMIN", "10.0.0.1") == 10


@pytest.mark.anyio
async def test_twenty_failures_from_one_address_limit_it_for_any_key() -> None:
    clock = Clock()
    limits = SignInLimits(clock)
    for i in range(20):
        await limits.failed(f"GK{i}", "10.0.0.1")
    assert await limits.retry_after("GKNEW", "10.0.0.1") == 300
    assert await limits.retry_after("GKNEW", "10.0.0.2") == 0


@pytest.mark.anyio
async def test_the_right_secret_clears_its_pairs_failures() -> None:
    clock = Clock()
    limits = SignInLimits(clock)
    for _ in range(4):
        await limits.failed("GKADMIN", "10.0.0.1")
    await limits.succeeded("GKADMIN", "10.0.0.1")
    await limits.failed("GKADMIN", "10.0.0.1")
    assert await limits.retry_after("GKADMIN", "10.0.0.1") == 0


@pytest.mark.anyio
async def test_failures_spread_over_more_than_the_window_do_not_limit() -> None:
    clock = Clock()
    limits = SignInLimits(clock)
    for _ in range(20):
        await limits.failed("GKADMIN", "10.0.0.1")
        clock.now += 61  # five take more than 300 s
        assert await limits.retry_after("GKADMIN", "10.0.0.1") == 0


@pytest.mark.anyio
async def test_what_is_remembered_is_bounded() -> None:
    clock = Clock()
    limits = SignInLimits(clock, max_tracked=100)
    for i in range(300):
        await limits.failed(f"GK{i:018d}" + "x" * 10_000, f"10.0.{i // 256}.{i % 256}")
    assert len(limits._memory) <= 100
    assert all(len(subject) <= 128 + 40 for subject in limits._memory)


# -- the console over HTTP, in this process --------------------------------------------------

ACCESS_KEY, SECRET = "GKSIGNINTEST00000000", "s" * 40


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """`app` served by uvicorn on a loopback port of its own; its base URL."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_config=None, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await eventually_async(lambda: server.started or task.done())
        assert server.started, task
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def sign_in(client: httpx.AsyncClient, access_key: str, secret: str) -> httpx.Response:
    page = (await client.get("/login")).text
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page
    form = {"csrf": found.group(1), "access_key": access_key, "secret_key": secret}
    return await client.post("/login", data=form)


@pytest.mark.anyio
async def test_the_console_refuses_sign_ins_past_the_limit_until_the_window_passes(
    tmp_path: Path,
) -> None:
    clock = Clock(1_800_000_000.0)  # sessions and failures alike go by it
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    async with MetaStore(url, SecretBox([SecretBox.generate_key()])) as meta:
        await meta.migrate()
        await meta.create_key(ACCESS_KEY, SECRET, admin=True)
        # The sign-in needs neither the namespace nor the jobs API.
        app = Console(meta, None, None, heartbeat_timeout=3, clock=clock)  # type: ignore[arg-type]
        async with (
            serving(app) as base,
            httpx.AsyncClient(base_url=base + PREFIX, timeout=30) as client,
        ):
            for _ in range(5):
                assert (await sign_in(client, ACCESS_KEY, "wrong")).status_code == 401
            limited = await sign_in(client, ACCESS_KEY, SECRET)  # from the guesser's address
            assert limited.status_code == 429 and limited.headers["retry-after"] == "300"
            assert "Too many failed sign-ins" in limited.text
            clock.now += 299.5
            limited = await sign_in(client, ACCESS_KEY, SECRET)
            assert limited.status_code == 429 and limited.headers["retry-after"] == "1"
            clock.now += 0.5
            signed = await sign_in(client, ACCESS_KEY, SECRET)
            assert signed.status_code == 303 and signed.headers["location"] == PREFIX + "/fleet"
