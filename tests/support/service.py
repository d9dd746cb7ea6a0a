"""The service of one worker in the test's own process, over a real metadata store and a real
page store: for unit tests that stand two workers side by side or hold a store's call."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from gateway.cache import PageStore
from gateway.meta import MetaStore
from gateway.service.shared import Shared

W = TypeVar("W")


@asynccontextmanager
async def worker(meta: MetaStore, cache: Path, workers: int = 1) -> AsyncIterator[Shared]:
    """A worker's shared state over `meta` (its mounts read) with its cache in `cache`, as one
    of a node's `workers` (more than one: it shares what it learns, as a node's workers do)."""
    pages = PageStore(cache, capacity_bytes=64 << 20, janitor=False)
    await pages.open()
    shared = Shared.build(meta, pages, 60.0, 1 << 20, workers=workers)
    try:
        await shared.namespace.refresh()
        yield shared
    finally:
        await shared.close()
        await pages.close()


def wrap_store(shared: Shared, bucket: str, wrapper: type[W], *args: Any) -> W:
    """Put `wrapper(store, *args)` in place of the mount's store, in this worker only."""
    handle = shared.namespace.mount(bucket)
    assert handle is not None
    wrapped = wrapper(handle.store, *args)  # type: ignore[call-arg]
    shared.namespace._mounts[bucket] = dataclasses.replace(handle, store=wrapped)
    return wrapped
