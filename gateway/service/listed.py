"""What the node's listings of its stores said, shared by its workers: revalidation by listing.

A listing of a prefix from a key tells a thousand keys' ETags and sizes in one store request,
as a stat tells one (every store lists a key's version as its stat gives it: the store
contract). So when the versions of many keys under one prefix need revalidating, the node lists
the prefix from the first of them and records what the page said: its *span* (the keys after
`after`, to `hi` or to the prefix's end when the page was the last) and each key listed, with
the wall time the listing was asked. A key in a span asked within the mount's TTL is answered
from it: listed with the same ETag and size, its held version is fresh again from then;
another version, it changed; not listed, it is gone.

Pages keep their edges: a listing begun at the prefix's start or where an earlier such page
ended (a *chained* span) is begun at the same place the next time (`edge`), so that readers in
any order, TTL after TTL, list each page of a prefix once, N/1000 requests, rather than from
wherever their key is, spans that overlap. One SQLite file in the cache folder (the
standard library's sqlite3, WAL, no fsync), made anew at each start, shared by the workers:
one listing per prefix and TTL for the node, not per worker. A record is a hint about the
store, never the authority over a write through the node (the caller checks the key's ticket).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FILE = "listed.db"
_BUSY_MS = 50
_OPEN_TRIES = 20
END = "\U0010ffff"  # sorts after every key of a prefix
_KEPT_ROWS = 200_000  # rows of spans kept in a process's memory (lookup), at most
_IN_MAX = 500  # keys asked in one query (SQLite's variables: 999 in older builds)
_KEEP = 3600.0  # spans older than this are dropped (no mount trusts a listing longer)


def reset(root: Path) -> None:
    """Drop the records of an earlier run: done by `gateway serve` before any worker starts."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            (root / (FILE + suffix)).unlink()


def prefix_of(key: str) -> str:
    """The prefix a key is listed under: its "folder" (up to its last slash)."""
    return key[: key.rfind("/") + 1]


def after_for(key: str) -> str:
    """A start-after that lists `key` itself and the keys past it: the key without its last
    character sorts before it, and only keys that share all but that character come between."""
    return key[:-1]


@dataclass(frozen=True, slots=True)
class Listed:
    """What a listing asked at wall time `at` said of a key: its ETag and size, or (etag None)
    that it was not there."""

    etag: str | None
    size: int
    at: float


@dataclass(frozen=True, slots=True)
class _Span:
    """A listing's span as this process read it: the keys listed (key -> etag, size, at)."""

    after: str
    hi: str | None
    at: float
    rows: dict[str, tuple[str, int, float]]


@dataclass(frozen=True, slots=True)
class Edges:
    """A prefix's page edges: where chained pages ended (`his`, sorted) and, for each edge a
    page began at, where the newest such page ended (None: at the prefix's end)."""

    prefix: str
    his: list[str]
    pages: dict[str, str | None]
    listed_at: dict[str, float]  # the wall time the newest page from each edge was asked

    def below(self, key: str) -> tuple[str, bool]:
        """The last edge before `key` (the prefix's start if none), and whether a chained
        page began there."""
        i = bisect.bisect_left(self.his, key)
        start = self.his[i - 1] if i else self.prefix
        return start, start in self.pages

    def gap(self) -> str | None:
        """The first edge, walking the pages from the prefix's start, that no page began at
        yet (None: the pages reach the prefix's end)."""
        start: str | None = self.prefix
        seen = set()
        while start is not None and start in self.pages and start not in seen:
            seen.add(start)
            start = self.pages[start]
        return None if start in seen else start


class ListedVersions:
    """The spans listed and the keys in them, across the node's workers (see the module)."""

    def __init__(self, root: str) -> None:
        path = os.path.join(root, FILE)
        self._db: sqlite3.Connection | None = None
        # Spans read in this process, with their rows, by (mount, prefix), the newest first.
        self._kept: dict[tuple[int, str], list[_Span]] = {}
        self._kept_rows = 0
        for attempt in range(_OPEN_TRIES):
            try:
                self._db = _open(path)
                return
            except sqlite3.OperationalError as exc:
                if attempt == _OPEN_TRIES - 1 or "locked" not in str(exc):
                    log.warning("listings are not shared with this worker's siblings: %s", exc)
                    break
                time.sleep(0.005 * (attempt + 1))
            except (OSError, sqlite3.Error) as exc:
                log.warning("listings are not shared with this worker's siblings: %s", exc)
                break
        self._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        _schema(self._db)

    def lookup(self, mount_id: int, key: str, since: float) -> Listed | None:
        """What the newest listing asked after `since` that spans `key` said of it; None when
        none does. A span read once is kept in this process (`_Span`) until `since` passes
        it: the next keys of its page are answered with no query. (A newer listing recorded
        meanwhile by a sibling is not seen then: what is answered is still what a listing
        asked after `since` said, so a read stays within one TTL of the store.)"""
        prefix = prefix_of(key)
        kept = self.kept(mount_id, key, since, prefix)
        if kept is not None:
            return kept
        db = self._db
        assert db is not None
        try:
            span = db.execute(
                "SELECT after, hi, at FROM spans WHERE mount = ? AND prefix = ? AND after < ?"
                " AND (hi IS NULL OR hi >= ?) AND at > ? ORDER BY at DESC LIMIT 1",
                (mount_id, prefix, key, key, since),
            ).fetchone()
            if span is None:
                return None
            after, hi, at = str(span[0]), span[1], float(span[2])
            rows = db.execute(
                "SELECT key, etag, size, at FROM listed WHERE mount = ? AND key > ?"
                " AND key <= ? AND at >= ?",
                (mount_id, after, prefix + END if hi is None else hi, at),
            ).fetchall()
        except sqlite3.Error as exc:
            log.debug("listings: lookup failed: %s", exc)
            return None
        found = _Span(after, hi, at, {
            k: (str(e), int(n), float(t)) for k, e, n, t in rows if prefix_of(k) == prefix
        })  # fmt: skip
        self._keep(mount_id, prefix, found)
        row = found.rows.get(key)
        return Listed(None, 0, at) if row is None else Listed(row[0], row[1], row[2])

    def kept(
        self, mount_id: int, key: str, since: float, prefix: str | None = None
    ) -> Listed | None:
        """lookup() from the spans this process has read only, with no query: None when none
        of them, asked after `since`, spans the key (a hit's check, which must not wait)."""
        kept = self._kept.get((mount_id, prefix_of(key) if prefix is None else prefix))
        if not kept:
            return None
        found = None
        lapsed = False
        for span in kept:
            if span.at <= since:
                lapsed = True
            elif span.after < key and (span.hi is None or span.hi >= key):
                row = span.rows.get(key)
                found = Listed(None, 0, span.at) if row is None else Listed(*row)
                break
        if lapsed:
            kept[:] = [span for span in kept if span.at > since]
        return found

    def _keep(self, mount_id: int, prefix: str, span: _Span) -> None:
        kept = self._kept.setdefault((mount_id, prefix), [])
        kept.insert(0, span)  # the newest first
        self._kept_rows += len(span.rows)
        if self._kept_rows > _KEPT_ROWS:
            self._kept.clear()  # the next lookups read their spans again
            self._kept_rows = 0

    def lookup_many(self, mount_id: int, keys: Sequence[str], since: float) -> dict[str, Listed]:
        """lookup() of many keys in a few queries: those a listing asked after `since` spans."""
        db = self._db
        assert db is not None
        found: dict[str, Listed] = {}
        try:
            for prefix in {prefix_of(k) for k in keys}:
                spans = db.execute(
                    "SELECT after, hi, at FROM spans WHERE mount = ? AND prefix = ? AND at > ?"
                    " ORDER BY at DESC",
                    (mount_id, prefix, since),
                ).fetchall()
                if not spans:
                    continue
                mine = [k for k in keys if prefix_of(k) == prefix]
                rows: dict[str, tuple[str, int, float]] = {}
                for i in range(0, len(mine), _IN_MAX):
                    chunk = mine[i : i + _IN_MAX]
                    marks = ",".join("?" * len(chunk))
                    for key, etag, size, at in db.execute(
                        "SELECT key, etag, size, at FROM listed WHERE mount = ?"
                        f" AND key IN ({marks})",
                        (mount_id, *chunk),
                    ):
                        rows[key] = (etag, size, at)
                for key in mine:
                    # The newest span of the key, as lookup() takes it.
                    span = next((at for after, hi, at in spans
                                 if after < key and (hi is None or hi >= key)), None)  # fmt: skip
                    if span is None:
                        continue
                    row = rows.get(key)
                    if row is None or row[2] < span:
                        found[key] = Listed(None, 0, float(span))
                    else:
                        found[key] = Listed(str(row[0]), int(row[1]), float(row[2]))
        except sqlite3.Error as exc:
            log.debug("listings: lookup failed: %s", exc)
        return found

    def edge(self, mount_id: int, prefix: str, key: str) -> tuple[str, bool]:
        """Where a page-aligned listing that spans `key` begins (a start-after: the prefix's
        start, or the end of a chained page before the key), and whether a page was listed
        from there before (then it reaches the key, keys not having moved since)."""
        return self.edges(mount_id, prefix).below(key)

    def edges(self, mount_id: int, prefix: str) -> Edges:
        """The chained pages' edges of a prefix, for many keys at once."""
        db = self._db
        assert db is not None
        try:
            rows = db.execute(
                "SELECT after, hi, at FROM spans WHERE mount = ? AND prefix = ? AND chained = 1"
                " ORDER BY at",
                (mount_id, prefix),
            ).fetchall()
        except sqlite3.Error as exc:
            log.debug("listings: edges not read: %s", exc)
            rows = []
        # The newest page from each edge says where the next one begins, and when.
        return Edges(
            prefix,
            sorted({hi for _, hi, _ in rows if hi is not None}),
            {after: hi for after, hi, _ in rows},
            {after: at for after, _, at in rows},
        )

    def record(
        self,
        mount_id: int,
        prefix: str,
        after: str,
        hi: str | None,
        at: float,
        entries: Sequence[tuple[str, str, int]],
        chained: bool = False,
    ) -> None:
        """A listing asked at `at`: the keys (key, etag, size) after `after` to `hi` (None:
        to the prefix's end), in one transaction; `chained`: begun at an edge (`edge`)."""
        db = self._db
        assert db is not None
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(
                    "INSERT INTO spans (mount, prefix, after, hi, at, chained)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (mount_id, prefix, after, hi, at, int(chained)),
                )
                # A listing asked before one already recorded (it finished later) tells no
                # key's state after the newer one: a key's row keeps the newest listing's.
                db.executemany(
                    "INSERT INTO listed (mount, key, etag, size, at) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (mount, key) DO UPDATE SET etag = excluded.etag,"
                    " size = excluded.size, at = excluded.at WHERE excluded.at >= listed.at",
                    [(mount_id, key, etag, size, at) for key, etag, size in entries],
                )
                db.execute("DELETE FROM spans WHERE at < ?", (at - _KEEP,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            log.debug("listings: not kept: %s", exc)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def _open(path: str) -> sqlite3.Connection:
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    db = sqlite3.connect(path, timeout=0.1, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        _schema(db)
        db.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
    except BaseException:
        db.close()
        raise
    return db


def _schema(db: sqlite3.Connection) -> None:
    db.execute(
        "CREATE TABLE IF NOT EXISTS spans (mount INTEGER NOT NULL, prefix TEXT NOT NULL,"
        " after TEXT NOT NULL, hi TEXT, at REAL NOT NULL, chained INTEGER NOT NULL DEFAULT 0)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS spans_by_key ON spans (mount, prefix, after)")
    db.execute(
        "CREATE TABLE IF NOT EXISTS listed (mount INTEGER NOT NULL, key TEXT NOT NULL,"
        " etag TEXT NOT NULL, size INTEGER NOT NULL, at REAL NOT NULL,"
        " PRIMARY KEY (mount, key)) WITHOUT ROWID"
    )
