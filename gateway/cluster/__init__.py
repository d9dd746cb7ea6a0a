"""The fleet: who is in it (membership by heartbeats in the database) and which nodes own a key
(weighted rendezvous hashing over partitions)."""

from .identity import local_node, node_id
from .membership import Membership
from .placement import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_PARTITIONS,
    Node,
    Placement,
    block_key,
    object_key,
    partition_of,
)
from .registry import NodeFigures, NodeRecord, NodeRegistry

__all__ = [
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_PARTITIONS",
    "Membership",
    "Node",
    "NodeFigures",
    "NodeRecord",
    "NodeRegistry",
    "Placement",
    "block_key",
    "local_node",
    "node_id",
    "object_key",
    "partition_of",
]
