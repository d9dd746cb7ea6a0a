"""The console's sessions signed out before their expiry, by nonce (table console_signed_out):
the queries; what a process remembers of them is the console's (gateway/console/sessions.py)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from .store import transaction
from .tables import console_signed_out


class SignOuts:
    """The table every node and worker of the fleet reads, so that a session signed out
    anywhere ends everywhere at once."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"

    async def add(self, ended: dict[str, float], prune_before: float) -> None:
        """Record sessions (nonce -> expiry) as signed out, and forget those that expired
        before `prune_before`, in one transaction."""
        insert = (postgresql.insert if self._postgres else sqlite.insert)(console_signed_out)
        rows = [{"nonce": n, "expires": e} for n, e in ended.items()]
        async with transaction(self._engine) as conn:
            await conn.execute(
                sa.delete(console_signed_out).where(console_signed_out.c.expires <= prune_before)
            )
            await conn.execute(insert.values(rows).on_conflict_do_nothing())

    async def expires(self, nonce: str) -> float | None:
        """When the session signed out under `nonce` expires; None if it is not signed out.
        One primary-key lookup."""
        query = sa.select(console_signed_out.c.expires).where(console_signed_out.c.nonce == nonce)
        async with transaction(self._engine) as conn:
            found = (await conn.execute(query)).scalar_one_or_none()
        return None if found is None else float(found)
