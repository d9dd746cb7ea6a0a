"""Running the Alembic migrations programmatically, from the wheel or from a source checkout."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import gateway

from .engine import normalize_database_url, sqlite_path

if TYPE_CHECKING:  # alembic costs ~0.3 s to import: only a database behind SCHEMA_HEAD needs it
    from alembic.config import Config

# The newest revision in migrations/versions: a database there needs no Alembic run at all
# (MetaStore.migrate reads alembic_version and compares). A unit test holds it equal to
# Alembic's own head, so a new migration fails the suite until this names it.
SCHEMA_HEAD = "0012_node_cache_figures"

# Key of the PostgreSQL advisory lock that serializes concurrent upgrades (read by env.py).
MIGRATION_LOCK_KEY = 0x67617465776179  # "gateway"
# Alembic's `context` and `op` are module-level proxies to the one running environment, so two
# upgrades in threads of one process would trample each other. Across processes the database
# serializes them (see env.py).
_ALEMBIC_LOCK = threading.Lock()


def migrations_dir() -> Path:
    """The Alembic script directory: packaged into the wheel, else next to the source tree."""
    package = Path(gateway.__file__).resolve().parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError(f"no Alembic migrations found in {package}/_migrations or beside it")


# Alembic tells each step at INFO (its plugins as it is imported, "Context impl SQLiteImpl",
# "Running upgrade ..."): a node's first start would open with a score of its lines before its
# own. Set before any import of alembic (all of them are below); its warnings still show.
logging.getLogger("alembic").setLevel(logging.WARNING)


def alembic_config(url: str) -> Config:
    """A Config built in code, so that no alembic.ini is needed at run time."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    # Passed as an attribute, not a main option: configparser would choke on the '%' of an
    # escaped password.
    config.attributes["database_url"] = normalize_database_url(url)
    return config


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def run_migrations(url: str) -> None:
    """Upgrade the database at `url` to the newest revision; a no-op if it is there already."""
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _upgrade(url)
        return
    # env.py drives the async engine with asyncio.run, which cannot nest in a running loop:
    # give it a thread of its own. (MetaStore.migrate avoids blocking the loop meanwhile.)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="alembic") as pool:
        pool.submit(_upgrade, url).result()


def _upgrade(url: str) -> None:
    from alembic import command

    with _ALEMBIC_LOCK:
        command.upgrade(alembic_config(url), "head")
