"""The fleet: who is in it (membership by heartbeats in the database), which nodes own a key
(weighted rendezvous hashing over partitions), and how nodes read blocks from each other (the
peer client, the peer API it calls, and the signature both check)."""

from .identity import local_node, node_id
from .membership import Membership
from .peer_api import BlockServer, PeerApi
from .peers import Fleet, PeerUnavailable
from .placement import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_PARTITIONS,
    Node,
    Placement,
    block_key,
    object_key,
    partition_of,
)
from .registry import MountLine, NodeFigures, NodeRecord, NodeRegistry

__all__ = [
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_PARTITIONS",
    "BlockServer",
    "Fleet",
    "Membership",
    "MountLine",
    "Node",
    "NodeFigures",
    "NodeRecord",
    "NodeRegistry",
    "PeerApi",
    "PeerUnavailable",
    "Placement",
    "block_key",
    "local_node",
    "node_id",
    "object_key",
    "partition_of",
]
