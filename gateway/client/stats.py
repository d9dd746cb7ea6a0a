"""The client's counters, readable in process (`fs.stats`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClientStats:
    """What the client did, readable in process (`fs.stats`)."""

    short_circuit_reads: int = 0  # blocks read from a descriptor the node handed over
    short_circuit_bytes: int = 0
    http_reads: int = 0  # ranged GETs
    http_bytes: int = 0
    routed_reads: int = 0  # ranged GETs sent straight to the block's owner
    fallbacks: int = 0  # reads that fell back: short-circuit to HTTP, an owner to the endpoint
    leases: int = 0  # objects the node answered for (a version, and descriptors if it held any)
    lease_requests: int = 0  # round trips on the node's socket (one asks for many objects)
    leases_reused: int = 0  # objects found leased already: no round trip
    leases_renewed: int = 0  # leases past their time kept: the node said the version holds
    leases_renewed_ahead: int = 0  # leases renewed before their time (the renewer thread)
    connections: int = 0  # connections to the node's socket (each with its signed hello)
    leases_lost: int = 0  # leases dropped because the node on this host stopped answering
    failovers: int = 0  # moves to another node when the one in use stopped answering
