"""A node's PostgreSQL connections are bounded by its settings, whatever its worker count:
each worker's pool holds max(2, ceil(database_connections / workers)) and never more, on a
real PostgreSQL server (docs/fleet.md, "Database connections")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa

from gateway.config import Settings
from gateway.meta import open_meta
from tests.support.postgres import rows, temp_database


@pytest.mark.parametrize(
    ("workers", "budget", "per_worker"), [(1, 16, 16), (2, 16, 8), (8, 16, 2), (32, 16, 2)]
)
def test_a_workers_pool_is_its_share_of_the_nodes_budget(
    workers: int, budget: int, per_worker: int
) -> None:
    settings = Settings(workers=workers, database_connections=budget)
    assert settings.database_pool == per_worker


def test_a_worker_holds_no_more_connections_than_its_pool(tmp_path: Path) -> None:
    # A worker of a node of 8 workers on the default budget: 2 connections, however busy.
    with temp_database() as url:
        asyncio.run(_busy_worker(tmp_path, url))


async def _busy_worker(tmp_path: Path, url: str) -> None:
    settings = Settings(data_dir=tmp_path, workers=8, database_url=url)
    meta = open_meta(settings)
    name = url.rsplit("/", 1)[1]
    peak = 0
    busy = asyncio.Event()

    async def query() -> None:
        async with meta.engine.connect() as conn:
            busy.set()
            await conn.execute(sa.text("SELECT pg_sleep(0.3)"))

    async def watch() -> None:
        nonlocal peak
        await busy.wait()
        for _ in range(10):
            count = await asyncio.to_thread(
                rows, url,
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = $1"
                " AND pid <> pg_backend_pid()", name,
            )  # fmt: skip
            peak = max(peak, int(str(count[0]["n"])))
            await asyncio.sleep(0.05)

    try:
        await asyncio.gather(watch(), *(query() for _ in range(10)))
    finally:
        await meta.close()
    assert peak == settings.database_pool == 2
