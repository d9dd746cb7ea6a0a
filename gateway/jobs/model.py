"""A job as the rest of the gateway sees it: its options, its states, and the view of it that
the API, the CLI and the progress bar show."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Protocol

QUEUED = "queued"
LISTING = "listing"
RUNNING = "running"
DONE = "done"
PARTIAL = "partial"
FAILED = "failed"
CANCELLED = "cancelled"
STATES = (QUEUED, LISTING, RUNNING, DONE, PARTIAL, FAILED, CANCELLED)
ACTIVE = frozenset({QUEUED, LISTING, RUNNING})
END_STATES = frozenset({DONE, PARTIAL, FAILED, CANCELLED})

# How `gateway load` and `gateway jobs wait` exit, by the state the job ended in.
EXIT_STATUS = {DONE: 0, FAILED: 1, PARTIAL: 3, CANCELLED: 4}

# Blocks in flight per node. A load of small objects over a WAN is bound by its round trip:
# each fetch holds its slot for about one (a 20 ms WAN: 8 in flight moved ~300 objects of
# 100 KiB a second, 0.23x of 1 Gbit/s; 32 moved ~560, docs/performance.md). A node holds the
# bytes of at most twice that many blocks (those not yet committed: share.Slots), ~256 MiB
# of 4 MiB blocks.
DEFAULT_CONCURRENCY = 32
MAX_CONCURRENCY = 256
MAX_REPLICAS = 8

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_BINARY = {"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


MAX_BANDWIDTH = 1 << 60  # bytes/s: past any fleet, and within the database's 64 bits


def parse_bandwidth(text: str) -> int:
    """Bytes per second from '200MiB/s', '1.5GB/s', '500k' (per second when no unit of time)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?)?b?(?:/s)?\s*", text.lower())
    if m is None:
        raise ValueError(f"not a bandwidth: {text!r} (e.g. 200MiB/s)")
    unit = m.group(2) or ""
    value = float(m.group(1)) * (_BINARY[unit] if unit.endswith("i") else _UNITS[unit])
    if value < 1:
        raise ValueError(f"bandwidth must be at least 1 byte/s: {text!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What was asked: the prefix and how to load it."""

    bucket: str
    prefix: str = ""
    include: tuple[str, ...] = ()  # fnmatch globs on the key after the prefix; any may match
    exclude: tuple[str, ...] = ()  # ... and none of these
    replicas: int = 1  # fill the first N owners of each block
    concurrency: int = DEFAULT_CONCURRENCY  # blocks in flight per node
    bandwidth: int | None = None  # bytes/s for the whole fleet
    pin: bool = False
    verify: bool = False  # count what is cached, load nothing
    metadata_only: bool = False  # learn versions and sizes, no bytes
    refresh: bool = False  # reload objects whose version changed
    unpin: bool = False  # load nothing: take the pins off what every node has cached

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be 1 to {MAX_REPLICAS}")
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be 1 to {MAX_CONCURRENCY}")
        if self.bandwidth is not None and not 1 <= self.bandwidth <= MAX_BANDWIDTH:
            raise ValueError("bandwidth must be at least 1 byte/s and at most 1 EiB/s")
        if self.verify and (self.metadata_only or self.refresh or self.pin):
            raise ValueError("--verify loads nothing: it goes with no --pin, --refresh or "
                             "--metadata-only")  # fmt: skip
        if self.unpin and (
            self.pin or self.verify or self.metadata_only or self.refresh or self.replicas != 1
            or self.bandwidth is not None
        ):  # fmt: skip
            raise ValueError("--unpin loads nothing and looks at every node: it goes with no "
                             "--pin, --verify, --metadata-only, --refresh, --replicas or "
                             "--bandwidth")  # fmt: skip

    def wants(self, key: str) -> bool:
        """Whether a listed key is in the job, by --include and --exclude."""
        rest = key[len(self.prefix) :] if key.startswith(self.prefix) else key
        if self.include and not any(fnmatch.fnmatchcase(rest, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(rest, p) for p in self.exclude)

    @property
    def kind(self) -> str:
        if self.unpin:
            return "unpin"
        return "verify" if self.verify else "metadata" if self.metadata_only else "load"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["include"], out["exclude"] = list(self.include), list(self.exclude)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobSpec:
        """From the API's JSON or the database's; unknown fields are refused."""
        known = set(cls.__dataclass_fields__)
        extra = set(raw) - known
        if extra:
            raise ValueError(f"unknown job options: {', '.join(sorted(extra))}")
        if not isinstance(raw.get("bucket"), str) or not raw["bucket"]:
            raise ValueError("a job needs a bucket")
        values = dict(raw)
        for name in ("include", "exclude"):
            value = values.get(name, ())
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name} is a list of glob patterns")
            values[name] = tuple(value)
        for name in ("replicas", "concurrency"):
            if name in values and (type(values[name]) is not int):
                raise ValueError(f"{name} is a whole number")
        bandwidth = values.get("bandwidth")
        if bandwidth is not None and type(bandwidth) is not int:
            raise ValueError("bandwidth is a whole number of bytes per second")
        for name in ("pin", "verify", "metadata_only", "refresh", "unpin"):
            if name in values and type(values[name]) is not bool:
                raise ValueError(f"{name} is true or false")
        if not isinstance(values.get("prefix", ""), str):
            raise ValueError("prefix is a string")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class NodeProgress:
    """One node's part of a job, summed over the batches: done (as a first owner), loaded from
    the store, found cached, skipped, failed; `full` when its cache could take no more."""

    node: str
    objects: int = 0
    bytes: int = 0
    loaded_objects: int = 0
    loaded_bytes: int = 0
    cached_objects: int = 0
    cached_bytes: int = 0
    skipped: int = 0
    failures: int = 0
    unkept_bytes: int = 0
    full: bool = False
    batches_done: int = 0
    batches: int = 0


@dataclass(frozen=True, slots=True)
class JobError:
    node: str
    key: str
    message: str


@dataclass(frozen=True, slots=True)
class JobView:
    """A job with its progress, as shown by the API and the CLI."""

    id: int
    spec: JobSpec
    state: str
    message: str
    submitted_by: str
    submitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    total_objects: int
    total_bytes: int
    listed: bool  # the listing is complete: the totals are final
    nodes: tuple[NodeProgress, ...] = ()
    errors: tuple[JobError, ...] = field(default=())

    # A block whose owner changed by a node joining mid-job is loaded (and counted) at its old
    # owner and its new one: the sums may pass the totals by those, never the job.
    @property
    def objects_done(self) -> int:
        return min(self.total_objects, sum(n.objects for n in self.nodes))

    @property
    def bytes_done(self) -> int:
        return min(self.total_bytes, sum(n.bytes for n in self.nodes))

    @property
    def cached_bytes(self) -> int:
        return sum(n.cached_bytes for n in self.nodes)

    @property
    def cached_objects(self) -> int:
        return sum(n.cached_objects for n in self.nodes)

    @property
    def loaded_bytes(self) -> int:
        return sum(n.loaded_bytes for n in self.nodes)

    @property
    def loaded_objects(self) -> int:
        return sum(n.loaded_objects for n in self.nodes)

    @property
    def failures(self) -> int:
        return sum(n.failures for n in self.nodes)

    @property
    def ended(self) -> bool:
        return self.state in END_STATES

    def to_json(self) -> dict[str, Any]:
        def when(t: datetime | None) -> str | None:
            return None if t is None else t.isoformat()

        out = {
            "id": self.id,
            "bucket": self.spec.bucket,
            "prefix": self.spec.prefix,
            "kind": self.spec.kind,
            "state": self.state,
            "message": self.message,
            "options": self.spec.to_json(),
            "submitted_by": self.submitted_by,
            "submitted_at": when(self.submitted_at),
            "started_at": when(self.started_at),
            "ended_at": when(self.ended_at),
            "listed": self.listed,
            "total_objects": self.total_objects,
            "total_bytes": self.total_bytes,
            "objects_done": self.objects_done,
            "bytes_done": self.bytes_done,
            "loaded_objects": self.loaded_objects,
            "loaded_bytes": self.loaded_bytes,
            "cached_objects": self.cached_objects,
            "cached_bytes": self.cached_bytes,
            "failures": self.failures,
            "nodes": {n.node: {k: v for k, v in asdict(n).items() if k != "node"}
                      for n in self.nodes},
            "errors": [asdict(e) for e in self.errors],
        }  # fmt: skip
        if self.spec.unpin:  # its nodes count the blocks they unpinned as cached_*
            out["unpinned_blocks"], out["unpinned_bytes"] = self.cached_objects, self.cached_bytes
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobView:
        """What the API sent back (the CLI over --endpoint)."""

        def when(t: str | None) -> datetime | None:
            return None if t is None else datetime.fromisoformat(t)

        submitted = when(raw["submitted_at"])
        assert submitted is not None
        return cls(
            id=raw["id"],
            spec=JobSpec.from_json(raw["options"]),
            state=raw["state"],
            message=raw["message"],
            submitted_by=raw["submitted_by"],
            submitted_at=submitted,
            started_at=when(raw["started_at"]),
            ended_at=when(raw["ended_at"]),
            total_objects=raw["total_objects"],
            total_bytes=raw["total_bytes"],
            listed=raw["listed"],
            nodes=tuple(NodeProgress(node=k, **v) for k, v in sorted(raw["nodes"].items())),
            errors=tuple(JobError(**e) for e in raw["errors"]),
        )


class JobWrites(Protocol):
    """Where jobs are submitted and cancelled: the one door for administration
    (gateway/admin/ops.py), handed to the jobs API and the CLI's database client by whoever
    builds them, since it sits above this package."""

    async def submit_job(self, spec: JobSpec | dict[str, Any], submitted_by: str) -> int: ...

    async def cancel_job(self, job_id: int) -> JobView | None: ...
