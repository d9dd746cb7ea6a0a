"""Alembic environment: async engines for SQLite and PostgreSQL alike, upgrades serialized."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from gateway.meta.engine import create_engine, normalize_database_url
from gateway.meta.migrate import MIGRATION_LOCK_KEY
from gateway.meta.tables import metadata

config = context.config
target_metadata = metadata


def database_url() -> str:
    # gateway.meta.migrate passes the URL as an attribute; the alembic CLI (alembic.ini) falls
    # back to sqlalchemy.url or the environment.
    url = (
        config.attributes.get("database_url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("GATEWAY_DATABASE_URL")
    )
    if not url:
        raise RuntimeError("no database URL: set sqlalchemy.url or GATEWAY_DATABASE_URL")
    return normalize_database_url(url)


def configure(**kwargs: Any) -> None:
    url = database_url()
    context.configure(
        target_metadata=target_metadata,
        # SQLite alters a table by copying it; batch mode generates that dance.
        render_as_batch=url.startswith("sqlite"),
        # One transaction around the whole upgrade on both dialects; for SQLite, engine.py makes
        # it BEGIN IMMEDIATE so that a concurrent migrator waits on the file lock.
        transactional_ddl=True,
        compare_type=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    configure(url=database_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    configure(connection=connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Two nodes starting at once: the second waits here until the first commits, then
            # reads the version table and finds nothing left to do. Released at commit.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = create_engine(database_url(), for_migrations=True)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_async_migrations())
