"""The namespace's refresh publishes mounts, keys and who may do what together: no request
sees a new mount with the policies of before it (a public mount refused to anonymous reads)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.generations import Generations
from gateway.meta import MetaStore
from gateway.service.namespace import Namespace
from tests.support.net import eventually_async

pytestmark = pytest.mark.anyio


class HeldMeta:
    """The real metadata store, with one of its reads held until the test lets it go."""

    def __init__(self, meta: MetaStore, held: str) -> None:
        self._meta = meta
        self._held = held
        self.entered = asyncio.Event()
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._meta, name)
        if name != self._held:
            return method

        async def held(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            await self.go.wait()
            return await method(*args, **kwargs)

        return held


@pytest.mark.parametrize("held", ["list_keys", "read_tenancy"])
async def test_a_public_mount_is_readable_from_the_instant_it_is_seen(
    meta: MetaStore, tmp_path: Path, held: str
) -> None:
    folder = tmp_path / "public"
    folder.mkdir()
    bucket = f"pub-{held.replace('_', '-')}"
    slow = HeldMeta(meta, held)
    namespace = Namespace(slow, default_ttl=60)  # type: ignore[arg-type]
    try:
        await meta.add_mount(bucket, folder.as_uri(), {"public_read": "true"})
        refresh = asyncio.create_task(namespace.refresh())
        seen = []
        # Until the held read returns, and after: whenever the bucket is known, anonymous
        # reads of it are allowed.
        while not refresh.done():
            if namespace.mount(bucket) is not None:
                seen.append(namespace.auth.allowed(None, "s3:GetObject", bucket, "k", None))
            if slow.entered.is_set():
                slow.go.set()
            await asyncio.sleep(0)
        await refresh
        assert namespace.mount(bucket) is not None
        assert seen and all(seen), seen
    finally:
        await namespace.close()


async def test_an_idle_worker_catches_up_with_a_change_told_on_the_node(
    meta: MetaStore, tmp_path: Path
) -> None:
    """A worker that answers no request still reads a change the CLI or a sibling told the
    node, long before its refresh interval: it holds the change if the database then goes."""
    folder = tmp_path / "told"
    folder.mkdir()
    generations = Generations(str(tmp_path))
    namespace = Namespace(meta, default_ttl=60, generations=generations)
    await namespace.refresh()
    runs = asyncio.create_task(namespace.run(interval=3600))
    try:
        await meta.add_mount("told", folder.as_uri(), {})
        generations.bump_state()  # what the CLI does once the change has committed
        await eventually_async(lambda: not namespace.stale())
        assert namespace.mount("told") is not None
    finally:
        runs.cancel()
        await namespace.close()
        generations.close()
