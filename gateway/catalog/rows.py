"""ObjectInfo to a catalog row and back."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from gateway.stores import ObjectInfo

# ObjectInfo fields kept in the `attrs` JSON text, when set.
_TEXT_FIELDS = (
    "content_type",
    "content_encoding",
    "content_disposition",
    "content_language",
    "cache_control",
    "expires",
)


def entry_row(
    mount_id: int, info: ObjectInfo, complete: bool, written_at: datetime
) -> dict[str, Any]:
    attrs: dict[str, Any] = {n: getattr(info, n) for n in _TEXT_FIELDS if getattr(info, n)}
    if info.metadata:
        attrs["metadata"] = dict(info.metadata)
    if info.checksums:
        attrs["checksums"] = dict(info.checksums)
    if info.storage_class != "STANDARD":
        attrs["storage_class"] = info.storage_class
    return {
        "mount_id": mount_id,
        "key": info.key,
        "size": info.size,
        "etag": info.etag,
        "last_modified": info.last_modified,
        "attrs": json.dumps(attrs, ensure_ascii=False, separators=(",", ":")) if attrs else "{}",
        "complete": complete,
        "written_at": written_at,
    }


def entry_info(row: sa.RowMapping | sa.Row[Any]) -> ObjectInfo:
    values = row._mapping if isinstance(row, sa.Row) else row
    attrs = json.loads(values["attrs"]) if values["attrs"] != "{}" else {}
    return ObjectInfo(
        key=values["key"],
        size=values["size"],
        etag=values["etag"],
        last_modified=values["last_modified"],
        metadata=attrs.get("metadata", {}),
        checksums=attrs.get("checksums", {}),
        storage_class=attrs.get("storage_class", "STANDARD"),
        **{name: attrs[name] for name in _TEXT_FIELDS if name in attrs},
    )
