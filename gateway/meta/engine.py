"""Database URLs and async engines, set up the same way for the store and for migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event, make_url, pool
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

SQLITE_DRIVER = "sqlite+aiosqlite"
POSTGRES_DRIVER = "postgresql+asyncpg"

# A CLI command and a running server share one SQLite file: writers wait for each other
# this long instead of failing at once with "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 30_000
# asyncpg waits a minute by default; a gateway whose database is down should say so sooner.
POSTGRES_CONNECT_TIMEOUT_S = 10.0


def normalize_database_url(url: str) -> str:
    """The async-driver form of a URL: postgres(ql) of any driver to asyncpg, sqlite to aiosqlite.

    Everything after the scheme is kept byte for byte, so escaped passwords survive.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {url!r}")
    backend = scheme.partition("+")[0].lower()
    if backend in ("postgresql", "postgres"):
        return f"{POSTGRES_DRIVER}://{rest}"
    if backend == "sqlite":
        return f"{SQLITE_DRIVER}://{rest}"
    raise ValueError(f"unsupported database {scheme!r}: use sqlite:///path or postgresql://...")


def default_database_url(data_dir: Path) -> str:
    """The embedded default: one SQLite file in the data directory."""
    return f"{SQLITE_DRIVER}:///{Path(data_dir).absolute() / 'gateway.db'}"


def is_sqlite(url: str) -> bool:
    return make_url(normalize_database_url(url)).get_backend_name() == "sqlite"


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL; None for an in-memory database or PostgreSQL."""
    parsed = make_url(normalize_database_url(url))
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database)


def create_engine(
    url: str, *, for_migrations: bool = False, pool_size: int | None = None
) -> AsyncEngine:
    """An async engine for `url` (normalized first).

    `for_migrations` gives SQLite real transactions around DDL (see _sqlite_transactional) and
    no pool, since a migration run uses one connection once. `pool_size` caps a PostgreSQL pool at
    that many connections (none beyond it: a request waits for one), so that a fleet's
    connections add up to what docs/fleet.md says whatever the cores; None: SQLAlchemy's
    default (5, and 10 more at a peak).
    """
    url = normalize_database_url(url)
    # A pooled PostgreSQL connection may have died with its server: test it on checkout. A
    # SQLite connection is a file handle; pinging it cost a quarter of a millisecond a query.
    kwargs: dict[str, Any] = {"pool_pre_ping": url.startswith(POSTGRES_DRIVER)}
    if for_migrations:
        kwargs["poolclass"] = pool.NullPool
    if url.startswith(POSTGRES_DRIVER):
        kwargs["connect_args"] = {"timeout": POSTGRES_CONNECT_TIMEOUT_S}
        if pool_size is not None and not for_migrations:
            kwargs.update(pool_size=pool_size, max_overflow=0)
    engine = create_async_engine(url, **kwargs)
    if url.startswith(SQLITE_DRIVER):
        _sqlite_directory_check(engine, sqlite_path(url))
        _sqlite_pragmas(engine, foreign_keys=not for_migrations)
        if for_migrations:
            _sqlite_transactional(engine)
    return engine


def _sqlite_directory_check(engine: AsyncEngine, path: Path | None) -> None:
    # Checked before aiosqlite starts its thread: after a failed open, that thread reports its
    # shutdown to the event loop later, and raises "Event loop is closed" if the loop is gone
    # (omnilib/aiosqlite#241). A missing directory is also the usual cause, worth naming plainly.
    @event.listens_for(engine.sync_engine, "do_connect")
    def _on_do_connect(*_args: Any) -> None:
        if path is not None and not path.parent.is_dir():
            raise FileNotFoundError(f"directory of the SQLite database {path} does not exist")


def _sqlite_pragmas(engine: AsyncEngine, *, foreign_keys: bool) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # busy_timeout first: switching a fresh file to WAL needs a lock another process may hold.
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        # WAL lets readers (the server) go on while a writer (the CLI) commits.
        cursor.execute("PRAGMA journal_mode = WAL")
        # SQLite ignores ON DELETE CASCADE unless asked per connection. Migrations leave it off:
        # batch mode rebuilds a table by dropping it, which would cascade into its children.
        if foreign_keys:
            cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()


def _sqlite_transactional(engine: AsyncEngine) -> None:
    """One write-locked transaction around a whole upgrade.

    Python's sqlite3 commits implicitly around DDL, so by default two processes migrating a fresh
    file at once could both see no tables and both create them. Taking over BEGIN ourselves and
    making it IMMEDIATE serializes them: the second waits, then finds the schema at head.
    """

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
