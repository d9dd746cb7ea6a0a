"""Listings of the GCS store, in S3's order and paging: GCS pages (and the emulator's, which
page differently) merged into pages of exactly max_keys entries, uploads kept out of sight."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from gateway.stores.base import ListPage, ObjectInfo
from gateway.stores.gcs.client import Client
from gateway.stores.gcs.resources import HIDDEN, object_info
from gateway.stores.listing import encode_token, rollup


async def list_page(
    client: Client, prefix: str, delimiter: str | None, after: str, max_keys: int
) -> ListPage:
    """One page of the listing (Store.list_page) of the objects of `client`, after `after`;
    max_keys > 0."""
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    last = ""
    walk = _walk(client, prefix, delimiter or None, after, max_keys + 1)
    async with contextlib.aclosing(walk) as entries:
        async for name, info in entries:
            if len(objects) + len(prefixes) == max_keys:
                return ListPage(objects, prefixes, encode_token(last))
            last = name
            if info is None:
                prefixes.append(name)
            else:
                objects.append(info)
    return ListPage(objects, prefixes, None)


async def _walk(
    client: Client, prefix: str, delimiter: str | None, after: str, want: int
) -> AsyncGenerator[tuple[str, ObjectInfo | None], None]:
    """Entries (key, info) or (common prefix, None) after `after`, in UTF-8 order.

    GCS pages are merged here, since neither GCS nor its emulator pages as S3 does: GCS may
    return a page's prefixes beyond its last object, fake-gcs-server returns every prefix
    on every page (and rolls up only one-character delimiters right: longer ones are
    rolled up here). An entry is given once no later page can bring one before it.
    """
    cut = len(client.prefix)
    server_rolls = delimiter is not None and len(delimiter) == 1
    query = {"prefix": client.prefix + prefix, "maxResults": str(min(1000, want))}
    if server_rolls:
        query["delimiter"] = str(delimiter)
    start = _start_offset(prefix, delimiter, after)
    if start is None:
        return
    if start:
        query["startOffset"] = client.prefix + start
    pending: dict[str, ObjectInfo | None] = {}
    while True:
        page = await client.list_objects(query)
        items, rolled = page.get("items") or [], page.get("prefixes") or []
        for item in items:
            key = item["name"][cut:]
            if not key.startswith(HIDDEN):
                entry = rollup(key, prefix, delimiter) or key
                pending[entry] = object_info(key, item) if entry == key else None
        for common in rolled:
            if not HIDDEN.startswith(common[cut:]) or await _shows(client, common[cut:]):
                pending[common[cut:]] = None
        more = page.get("nextPageToken")
        frontier = None  # the last page: everything pending is final
        if more:
            # Nothing before the page's last object can come later; with no objects on
            # the page, nothing before its last prefix (and fake-gcs-server never pages so).
            last = items[-1]["name"] if items else max(rolled, default=client.prefix + after)
            frontier = last[cut:]
        for name in sorted(n for n in pending if frontier is None or n <= frontier):
            info = pending.pop(name)
            if name > after:
                after = name
                yield name, info
        if not more:
            return
        query["pageToken"] = more


async def _shows(client: Client, common: str) -> bool:
    """Whether a common prefix that the hidden folder falls under holds other keys."""
    if common == HIDDEN:
        return False
    bounds = ({"endOffset": HIDDEN}, {"startOffset": ".s3gw-uploads0"})  # around it
    for bound in bounds:
        query = {"prefix": client.prefix + common, "maxResults": "1"}
        query.update({k: client.prefix + v for k, v in bound.items()})
        if (await client.list_objects(query)).get("items"):
            return True
    return False


def _successor(name: str) -> str | None:
    """The least string above every string that starts with `name` (None: there is none)."""
    while name:
        last = ord(name[-1])
        if last < 0x10FFFF:
            following = 0xE000 if 0xD800 <= last + 1 <= 0xDFFF else last + 1
            return name[:-1] + chr(following)
        name = name[:-1]
    return None


def _start_offset(prefix: str, delimiter: str | None, after: str) -> str | None:
    """Where GCS can start for entries above `after` (inclusive): past the whole common
    prefix that `after` falls under, whose keys all roll up to an entry at or below it.
    None: nothing can follow."""
    common = rollup(after, prefix, delimiter)
    return after if common is None else _successor(common)
