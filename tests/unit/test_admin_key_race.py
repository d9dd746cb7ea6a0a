"""The configured admin key when nodes of a fleet start at once on a fresh database: each finds
it missing, and all but the first to create it find it made when they create it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.admin import Administration
from gateway.meta import AccessKeyExists, MetaStore, SecretBox

ACCESS = "GKRACEACCESSKEY00001"
SECRET = "race-secret-0123456789abcdefghijklmnopq"


class OtherNodeFirst(MetaStore):
    """A real store where another node's create of the key lands between this node's look
    for it (which finds none) and its own create."""

    other_secret = SECRET
    raced = False

    async def get_key(self, access_key: str):  # type: ignore[no-untyped-def]
        if not self.raced:
            self.raced = True
            await self.create_key(access_key, self.other_secret, "admin (configured)", admin=True)
            return None
        return await super().get_key(access_key)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[OtherNodeFirst]:
    async with OtherNodeFirst(database_url, SecretBox([SecretBox.generate_key()])) as meta:
        await meta.migrate()
        yield meta


@pytest.mark.anyio
async def test_a_node_whose_create_comes_second_finds_the_same_key_and_starts(
    store: OtherNodeFirst,
) -> None:
    await Administration(store).ensure_key(ACCESS, SECRET, "admin (configured)")
    made = await store.get_key(ACCESS)
    assert made is not None and made.secret_key == SECRET and made.admin


@pytest.mark.anyio
async def test_a_key_made_meanwhile_with_another_secret_is_still_an_error(
    store: OtherNodeFirst,
) -> None:
    store.other_secret = "another-secret-0123456789abcdefghijklm"
    with pytest.raises(AccessKeyExists):
        await Administration(store).ensure_key(ACCESS, SECRET, "admin (configured)")
