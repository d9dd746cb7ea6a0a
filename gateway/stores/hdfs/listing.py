"""Listing of the hdfs:// store: a depth-first walk of the mount's folder in S3 key order,
pruned by prefix, marker and delimiter, with the recorded ETags of the files it lists."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

import anyio

from gateway.stores.base import ListPage, ObjectInfo
from gateway.stores.file_meta import StoredMeta, is_internal
from gateway.stores.hdfs.client import RemoteFailure, Status
from gateway.stores.hdfs.tree import Tree
from gateway.stores.listing import encode_token, rollup


async def list_page(
    tree: Tree, prefix: str, delimiter: str | None, marker: str, max_keys: int
) -> ListPage:
    """One page of the listing (Store.list_page) of the store of `tree`, after `marker`;
    max_keys > 0."""
    try:
        found = await _walk(tree, _Walk(tree, prefix, delimiter, marker), max_keys)
    except RemoteFailure as exc:
        raise tree.error(exc, prefix) from None
    more, found = len(found) > max_keys, found[:max_keys]
    objects = await _infos(tree, [(key, s) for key, s in found if s is not None])
    prefixes = [key for key, s in found if s is None]
    return ListPage(objects, prefixes, encode_token(found[-1][0]) if more else None)


async def _walk(tree: Tree, walk: _Walk, limit: int) -> list[tuple[str, Status | None]]:
    """Up to limit + 1 entries after the marker: (key, status) of objects, (prefix, None)."""
    found: list[tuple[str, Status | None]] = []
    last = ""
    async with aclosing(walk.items("", tree.root)) as items:
        async for key, status, folder in items:
            if status is not None and (cp := walk.rollup(key)) is not None:
                key, status = cp, None
            if key == last or key <= walk.marker:
                continue
            if folder is not None and not await walk.any_file(folder):
                continue  # an empty directory is no prefix
            found.append((key, status))
            last = key
            if len(found) > limit:
                break
    return found


async def _infos(tree: Tree, files: list[tuple[str, Status]]) -> list[ObjectInfo]:
    """Infos of listed files, their xattrs fetched 16 at a time (one ETag per version)."""
    metas: dict[str, StoredMeta | None] = {}
    limit = anyio.Semaphore(16)

    async def fetch(key: str) -> None:
        async with limit:
            metas[key] = await tree.meta(f"{tree.root}/{key}")

    if tree.xattrs:
        async with anyio.create_task_group() as tg:
            for key, _ in files:
                tg.start_soon(fetch, key)
    return [tree.info(key, status, metas.get(key)) for key, status in files]


class _Walk:
    """A depth-first walk of the tree in S3 key order (UTF-8 bytes), pruned by prefix, marker and
    delimiter. HDFS lists children in *signed*-byte order, so each directory is sorted here."""

    def __init__(self, tree: Tree, prefix: str, delimiter: str | None, marker: str):
        self.tree, self.prefix, self.delimiter, self.marker = tree, prefix, delimiter, marker

    def rollup(self, key: str) -> str | None:
        return rollup(key, self.prefix, self.delimiter)

    async def items(
        self, dir_key: str, path: str
    ) -> AsyncGenerator[tuple[str, Status | None, str | None], None]:
        """(key, status, None) of files; (common prefix, None, path) of a directory all of
        whose keys roll up into that prefix."""
        entries = []
        for s in await self.tree.children(path):
            if not s.name or is_internal(s.name) or not (s.is_file or s.is_dir):
                continue  # symlinks are not followed
            key = f"{dir_key}{s.name}/" if s.is_dir else dir_key + s.name
            if not key.startswith(self.prefix) and not (s.is_dir and self.prefix.startswith(key)):
                continue
            # Whatever lies wholly at or before the marker is pruned, subtrees included.
            if key <= self.marker and not (s.is_dir and self.marker.startswith(key)):
                continue
            entries.append((key, s))
        entries.sort(key=lambda e: e[0])  # code point order is UTF-8 byte order
        for key, s in entries:
            if s.is_file:
                yield key, s, None
            elif (cp := self.rollup(key)) is not None:
                yield cp, None, f"{path}/{s.name}"
            else:
                async with aclosing(self.items(key, f"{path}/{s.name}")) as inner:
                    async for item in inner:
                        yield item

    async def any_file(self, path: str) -> bool:
        """Whether a file lies anywhere below `path` (depth-first, stopping at the first)."""
        children = [s for s in await self.tree.children(path) if not is_internal(s.name)]
        if any(s.is_file for s in children):
            return True
        for s in children:
            if s.is_dir and await self.any_file(f"{path}/{s.name}"):
                return True
        return False
