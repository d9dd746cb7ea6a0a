"""The object versions the workers of one node have learnt, shared between them.

A worker that learns a key's version (opening it, revalidating it, loading it for a preload job,
hearing it from a peer or writing it) keeps it in its own memory (metadata.py) and writes it
here, so that the node's other workers serve the key without asking the store again while the
version is within the mount's `metadata_ttl` counted from when it was learnt. One SQLite file in
the cache folder (the standard library's sqlite3: readers never wait in WAL mode, a write is a
few tens of microseconds without fsync), made anew at each start of the node: a record is a
hint, never the authority. Each record carries the generation of its key's slot when the
version was asked for (generations.py); a record whose slot has moved since is not trusted, so
that an answer older than a sibling's write can never come back through here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import marshal
import os
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.stores import ObjectInfo

log = logging.getLogger(__name__)

FILE = "versions.db"
# A write waits for no sibling's: it runs on the event loop, and SQLite's busy handler sleeps
# 1 ms at its first wait (then 2, 5, 10...: up to 20 ms with the 20 that was here), so two
# workers loading or opening keys at once stalled each other's loops (a tight loop of two
# writers: p99 0.2-1.2 ms, max 18-21 ms a write, against 36 µs alone). A write refused is
# kept by the worker and published again (metadata.py: put's next success, published()).
_BUSY_MS = 0
_OPEN_TRIES = 20  # opening the file at a worker's start, when a sibling holds it (~3 s in all)
_OPEN_PAUSE = 0.005


def reset(root: Path) -> None:
    """Drop the records of an earlier run: done by `gateway serve` before any worker starts."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            (root / (FILE + suffix)).unlink()


class LearntVersions:
    """(mount id, key) -> (version, wall time learnt, slot generation), across the workers.
    `shared`: whether the node's file could be opened (else this worker keeps to itself)."""

    def __init__(self, root: str, tries: int = _OPEN_TRIES) -> None:
        path = os.path.join(root, FILE)
        self._db = sqlite3.connect(":memory:")  # until the shared file is open
        self.shared = False
        # Made by the first worker to start; the others, starting at the same moment, can find
        # it locked while it is made (WAL's first switch takes the file whole, and SQLite's
        # busy handler is not asked then): tried again, at start only.
        for attempt in range(tries):
            try:
                db = _open(path)
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    return _unshared(path, exc)
                if attempt == tries - 1:
                    return _unshared(path, exc)
                time.sleep(_OPEN_PAUSE * (attempt + 1))
            except (OSError, sqlite3.Error) as exc:
                return _unshared(path, exc)
            else:
                self._db.close()
                self._db = db
                self.shared = True
                return

    def lookup(self, mount_id: int, key: str) -> tuple[ObjectInfo, float, int] | None:
        try:
            row = self._db.execute(
                "SELECT info, at, generation FROM versions WHERE mount = ? AND key = ?",
                (mount_id, key),
            ).fetchone()
        except sqlite3.Error as exc:
            log.debug("learnt versions: lookup failed: %s", exc)
            return None
        if row is None:
            return None
        try:
            return _decoded(row[0]), float(row[1]), int(row[2])
        except (ValueError, TypeError, EOFError):
            return None

    def publish(
        self, mount_id: int, key: str, info: ObjectInfo, at: float, generation: int
    ) -> bool:
        """Record the version; False when it could not be now (a sibling's write held the
        file): the caller may try again."""
        try:
            self._db.execute(
                "INSERT OR REPLACE INTO versions VALUES (?, ?, ?, ?, ?)",
                (mount_id, key, generation, at, _encoded(info)),
            )
        except sqlite3.Error as exc:
            log.debug("learnt versions: not kept: %s", exc)
            return False
        return True

    def publish_many(self, rows: list[tuple[int, str, ObjectInfo, float, int]]) -> bool:
        """publish() of many (mount id, key, version, at, generation) in one transaction."""
        try:
            self._db.executemany(
                "INSERT OR REPLACE INTO versions VALUES (?, ?, ?, ?, ?)",
                [(m, k, generation, at, _encoded(info)) for m, k, info, at, generation in rows],
            )
        except sqlite3.Error as exc:
            log.debug("learnt versions: not kept: %s", exc)
            return False
        return True

    def forget(self, mount_id: int, key: str) -> None:
        try:
            self._db.execute("DELETE FROM versions WHERE mount = ? AND key = ?", (mount_id, key))
        except sqlite3.Error as exc:
            # The generation moved with the forget: the record is not trusted either way.
            log.debug("learnt versions: not forgotten: %s", exc)

    def close(self) -> None:
        self._db.close()


def _open(path: str) -> sqlite3.Connection:
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    db = sqlite3.connect(path, timeout=0.1, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        db.execute(
            "CREATE TABLE IF NOT EXISTS versions (mount INTEGER NOT NULL, key TEXT NOT NULL,"
            " generation INTEGER NOT NULL, at REAL NOT NULL, info BLOB NOT NULL,"
            " PRIMARY KEY (mount, key)) WITHOUT ROWID"
        )
        db.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
    except BaseException:
        db.close()
        raise
    return db


def _unshared(path: str, exc: BaseException) -> None:
    # A full or read-only cache disk, or a file that stayed locked: the node serves, this
    # worker asking the store for what it does not know itself (and waiting for no sibling).
    log.warning("versions learnt are not shared with this worker's siblings: %s: %s", path, exc)


_FIELDS = tuple(f.name for f in dataclasses.fields(ObjectInfo))
_MAPPINGS = ("metadata", "checksums", "tags", "encryption")


def _encoded(info: ObjectInfo) -> bytes:
    """ObjectInfo's fields as a tuple of plain values in `marshal`'s format: a few
    microseconds each way, where JSON and ISO dates cost tens (and marshal makes no objects
    but those)."""
    values: list[Any] = []
    for name in _FIELDS:
        value = getattr(info, name)
        if name == "last_modified":
            value = value.timestamp()
        elif name in _MAPPINGS and value is not None:
            value = dict(value)
        values.append(value)
    return marshal.dumps(tuple(values))


def _decoded(raw: bytes) -> ObjectInfo:
    values = marshal.loads(raw)
    if not isinstance(values, tuple) or len(values) != len(_FIELDS):
        raise ValueError("not a version")
    fields = dict(zip(_FIELDS, values, strict=True))
    fields["last_modified"] = datetime.fromtimestamp(fields["last_modified"], UTC)
    return ObjectInfo(**fields)
