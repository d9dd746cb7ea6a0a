"""Listings of the GCS store, in S3's order and paging: GCS pages (and the emulator's, which
page differently) merged into pages of exactly max_keys entries, uploads kept out of sight."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from gateway.stores.base import ListPage, ObjectInfo, VersionEntry, VersionsPage
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


async def list_versions(
    client: Client,
    prefix: str,
    delimiter: str | None,
    key_marker: str | None,
    version_marker: str | None,
    max_keys: int,
) -> VersionsPage:
    """A page of every generation under `prefix` (ListObjectVersions), in S3's order: by key,
    each key's newest first, its live one IsLatest (GCS keeps no delete markers). The markers
    are a key and a generation; common prefixes are rolled up here, not by the server."""
    entries: list[VersionEntry] = []
    prefixes: list[str] = []
    cut = len(client.prefix)
    query = {"prefix": client.prefix + prefix, "versions": "true", "maxResults": "1000"}
    if key_marker:
        common = rollup(key_marker, prefix, delimiter)
        start = key_marker if common is None else _successor(common)
        if start is None:
            return VersionsPage([], [], None, None)
        query["startOffset"] = client.prefix + start
    name: str | None = None  # the key whose generations are gathered in `held`
    held: list[dict[str, Any]] = []

    def past_marker(key: str, generation: int) -> bool:
        if not key_marker or key > key_marker:
            return True
        return key == key_marker and version_marker is not None and generation < int(version_marker)

    def take(key: str, items: list[dict[str, Any]]) -> bool:
        """Entries of one key's generations; False once the page is full."""
        items.sort(key=lambda i: -int(i["generation"]))
        for item in items:
            if not past_marker(key, int(item["generation"])):
                continue
            common = rollup(key, prefix, delimiter)
            if common is not None:
                if (not prefixes or prefixes[-1] != common) and common > (key_marker or ""):
                    if len(entries) + len(prefixes) == max_keys:
                        return False
                    prefixes.append(common)
                continue
            if len(entries) + len(prefixes) == max_keys:
                return False
            info = replace(object_info(key, item), version_id=str(item["generation"]))
            entries.append(VersionEntry(info, not item.get("timeDeleted")))
        return True

    def page() -> VersionsPage:
        last_entry = entries[-1].info if entries else None
        if prefixes and (last_entry is None or prefixes[-1] > last_entry.key):
            return VersionsPage(entries, prefixes, prefixes[-1], None)
        assert last_entry is not None
        return VersionsPage(entries, prefixes, last_entry.key, last_entry.version_id)

    while True:
        listed = await client.list_objects(query)
        for item in listed.get("items") or []:
            key = item["name"][cut:]
            if key.startswith(HIDDEN):
                continue
            if key != name:
                if name is not None and not take(name, held):
                    return page()
                name, held = key, []
            held.append(item)
        more = listed.get("nextPageToken")
        if not more:
            break
        query["pageToken"] = more
    if name is not None and not take(name, held):
        return page()
    return VersionsPage(entries, prefixes, None, None)


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
