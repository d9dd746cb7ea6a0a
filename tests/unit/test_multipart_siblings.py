"""Two workers (or nodes) complete one multipart upload at once: both answer with the object.

Each worker keeps completes of one upload in order among its own requests; across workers the
store decides. The first to finish takes the parts once its object is in place, so the other's
complete finds them gone: it answers with the object the parts made, as a retry would, never
InvalidPart. The service runs over a real file store and a real database (SQLite and
PostgreSQL); the second worker's store call is held until the first has completed, which is
the order the race takes on a busy machine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.meta import MetaStore
from gateway.service import S3Service, writes
from gateway.stores import WriteAttrs
from tests.support.service import worker, wrap_store

pytestmark = pytest.mark.anyio

MiB = 1 << 20


class HeldCompletes:
    """A real store whose complete_multipart waits until the test lets it go."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.entered = asyncio.Event()
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def complete_multipart(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        await self.go.wait()
        return await self._store.complete_multipart(*args, **kwargs)


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_a_complete_another_worker_finished_first_answers_its_object(
    meta: MetaStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The second worker holds the key's lock while its store call is held (a store's complete
    # of a large object can take minutes): the first goes on without it once it has waited
    # KEY_WAIT (30 s, for each of the two databases), here half a second.
    monkeypatch.setattr(writes, "KEY_WAIT", 0.5)
    origin = tmp_path / "origin"
    origin.mkdir()
    await meta.add_mount("parts", origin.as_uri(), {})
    async with (
        worker(meta, tmp_path / "cache-1") as first,
        worker(meta, tmp_path / "cache-2") as second,
    ):
        a, b = S3Service(first), S3Service(second)
        upload = await a.create_multipart_upload("parts", "twice.bin", WriteAttrs(), None)
        bodies = [b"t" * 5 * MiB, b"u" * 10]
        parts = []
        for number, body in enumerate(bodies, 1):
            part = await a.upload_part("parts", "twice.bin", upload, number, _body(body), len(body))
            parts.append((number, part.etag))
        held = wrap_store(second, "parts", HeldCompletes)

        late = asyncio.create_task(b.complete_multipart_upload("parts", "twice.bin", upload, parts))
        await held.entered.wait()  # past its checks of the upload and its parts
        done = await a.complete_multipart_upload("parts", "twice.bin", upload, parts)
        held.go.set()
        assert (await late).etag == done.etag
        assert (origin / "twice.bin").read_bytes() == b"".join(bodies)
