"""The console's signed-out sessions in the database (gateway/console/sessions.py, SignedOut),
on SQLite and PostgreSQL: a sign-out written through one process's SignedOut holds for every
other over the same database (another worker, another node); rows are pruned an hour past
their session's expiry as sign-outs are written (the clock moved on, nothing sleeps); a
node's file of sign-outs from before migration 0009 is taken into the table once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from gateway.console.sessions import PRUNE_AFTER, Sessions, SignedOut
from gateway.meta import MetaStore
from gateway.meta.tables import console_signed_out

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def nonces(meta: MetaStore) -> set[str]:
    async with meta.engine.connect() as conn:
        return set((await conn.execute(sa.select(console_signed_out.c.nonce))).scalars())


async def test_a_sign_out_holds_for_every_process_over_the_database(meta: MetaStore) -> None:
    clock = Clock()
    sessions = Sessions(b"k" * 32, clock)
    here, elsewhere = SignedOut(meta.engine, clock), SignedOut(meta.engine, clock)
    mine, _ = sessions.issue("GKADMIN")
    other, _ = sessions.issue("GKADMIN")
    assert not await elsewhere.holds(mine)  # looked up, and not remembered as such
    await here.add(mine)
    assert await here.holds(mine) and await elsewhere.holds(mine)
    assert not await elsewhere.holds(other)
    await elsewhere.add(mine)  # twice (two tabs signing out): no error
    assert await nonces(meta) == {mine.nonce}


async def test_rows_are_pruned_an_hour_past_their_sessions_expiry(meta: MetaStore) -> None:
    clock = Clock()
    sessions = Sessions(b"k" * 32, clock)
    signed_out = SignedOut(meta.engine, clock)
    old, _ = sessions.issue("GKADMIN", ttl=60)
    await signed_out.add(old)
    clock.now += 60 + PRUNE_AFTER - 1
    new, _ = sessions.issue("GKADMIN", ttl=60)
    await signed_out.add(new)
    assert await nonces(meta) == {old.nonce, new.nonce}  # a slow clock elsewhere: kept
    clock.now += 1
    newer, _ = sessions.issue("GKADMIN", ttl=60)
    await signed_out.add(newer)
    assert await nonces(meta) == {new.nonce, newer.nonce}


async def test_the_file_of_sign_outs_before_0009_is_taken_in_once(
    meta: MetaStore, tmp_path: Path
) -> None:
    clock = Clock()
    sessions = Sessions(b"k" * 32, clock)
    ended, _ = sessions.issue("GKADMIN")
    expired, _ = sessions.issue("GKADMIN", ttl=60)
    legacy = tmp_path / "console-signed-out"
    legacy.write_text(json.dumps({ended.nonce: ended.expires, expired.nonce: clock.now - 1}))
    worker = SignedOut(meta.engine, clock, str(legacy))
    assert await worker.holds(ended)
    assert not legacy.exists()
    assert await nonces(meta) == {ended.nonce}  # what had expired is not written
    sibling = SignedOut(meta.engine, clock, str(legacy))  # finds no file: nothing to do
    assert await sibling.holds(ended) and not await sibling.holds(expired)
