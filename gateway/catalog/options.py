"""The mount options that turn the catalog on and keep it fresh."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

OPTIONS = {
    "catalog": "on|off: listings, HEAD and cold GETs from the catalog once a prefix is synced",
    "catalog_ttl": "seconds between re-crawls of the synced prefixes (0, the default: none)",
    "catalog_queue": "SQS queue URL of the origin's S3 event notifications (s3:// mounts)",
}
_ON = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class CatalogOptions:
    ttl: float  # seconds between re-crawls; 0: none
    queue: str | None  # SQS queue URL the origin's change notifications arrive on


def catalog_options(options: Mapping[str, str]) -> CatalogOptions | None:
    """The catalog's options of a mount; None when its catalog is off. ValueError, saying
    why, for options that make no sense."""
    if options.get("catalog", "off").lower() not in _ON:
        return None
    try:
        ttl = float(options.get("catalog_ttl", 0))
    except ValueError:
        raise ValueError(f"catalog_ttl must be seconds, not {options['catalog_ttl']!r}") from None
    if not ttl >= 0:
        raise ValueError(f"catalog_ttl must be 0 or more seconds, not {ttl}")
    return CatalogOptions(ttl, options.get("catalog_queue") or None)
