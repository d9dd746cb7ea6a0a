"""A page store and the fills over it, opened and closed together as a node's worker holds
them (gateway/service/shared.py): for the page store's unit tests."""

from __future__ import annotations

import os
from typing import Any

from gateway.cache import Fills, PageStore


class Cache(Fills):
    """Fills over their own PageStore at `root`; the store's verbs (invalidate, hold,
    begin_write...) are reached through it as well."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fill_concurrency: int = 16,
        sub_block_size: int = 0,
        **page_options: Any,
    ) -> None:
        super().__init__(
            PageStore(root, **page_options),
            fill_concurrency=fill_concurrency,
            sub_block_size=sub_block_size,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pages, name)

    async def open(self) -> None:
        await self.pages.open()

    async def close(self) -> None:
        await super().close()
        await self.pages.close()
