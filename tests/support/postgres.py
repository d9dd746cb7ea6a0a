"""Throwaway PostgreSQL databases on the local server, for tests that run on both backends."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
import pytest

HOST = "127.0.0.1"
PORT = 5432
USER = "postgres"
ADMIN_DATABASE = "test"
START_COMMAND = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


async def _admin(sql: str, *args: object) -> None:
    conn = await asyncpg.connect(
        host=HOST, port=PORT, user=USER, database=ADMIN_DATABASE, timeout=10
    )
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


def _run(sql: str, *args: object) -> None:
    try:
        asyncio.run(_admin(sql, *args))
    except (TimeoutError, OSError, asyncpg.CannotConnectNowError) as exc:
        # A missing server must not turn half the suite into skips that nobody reads.
        pytest.fail(
            f"PostgreSQL is not reachable at {HOST}:{PORT} ({exc}); start it with:\n"
            f"    {START_COMMAND}",
            pytrace=False,
        )


def rows(url: str, sql: str, *args: object) -> list[dict[str, object]]:
    """The rows a query answers in the database of `url` (a temp_database URL)."""

    async def fetch() -> list[dict[str, object]]:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return [dict(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(fetch())


@contextmanager
def temp_database() -> Iterator[str]:
    """A fresh, uniquely named database, as a postgresql+asyncpg URL; dropped afterwards."""
    name = f"gw_test_{uuid.uuid4().hex[:16]}"
    _run(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+asyncpg://{USER}@{HOST}:{PORT}/{name}"
    finally:
        # FORCE terminates connections a failed test left open, which would block the drop.
        _run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def database_outage(url: str) -> Iterator[None]:
    """The database of `url` refuses every connection (and loses the open ones) for a while."""
    name = url.rsplit("/", 1)[1]
    _run(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    _run("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
    try:
        yield
    finally:
        _run(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
