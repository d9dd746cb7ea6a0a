"""Where a block of a listed version goes: its owners under a placement (the fleet's now, or the
one a batch was shared out under, with a departed node)."""

from __future__ import annotations

from gateway.cluster import Node, Placement, placement
from gateway.stores import ObjectInfo


def owners(
    where: Placement, mount_id: int, info: ObjectInfo, index: int, replicas: int
) -> tuple[Node, ...]:
    """As Fleet.owners, under any placement (the fleet's, or one with a departed node)."""
    placed = placement.owner_key(mount_id, info.key, info.etag, index)
    return where.owners(placed, min(replicas, where.max_replicas))
