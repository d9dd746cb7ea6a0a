"""The request path's Prometheus instruments: requests, bytes and latency by operation, bytes
read from under-stores, and what preload jobs loaded. Bumped by the S3 front end, the service
and the job loop; read out by gateway/admin/metrics.py, which adds the page store's figures
and the workers' sharing."""

from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter("gateway_requests", "S3 requests answered", ["op", "status"], registry=REGISTRY)
RESPONSE_BYTES = Counter(
    "gateway_response_bytes", "Body bytes sent to clients", ["op", "cache"], registry=REGISTRY
)
LATENCY = Histogram(
    "gateway_request_seconds",
    "Time from request to the last byte sent",
    ["op"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
    registry=REGISTRY,
)


# Object reads by bucket and how the cache answered them (hit, miss, forward, bypass): [reads,
# body bytes] per (bucket, cache), plain numbers, as cheap to bump on a hit as can be; /metrics
# reads them out (gateway/admin/metrics.py, every worker's summed). A bucket is counted only
# once an object read of it was answered, so there are as many as mounts read, whatever
# buckets clients name.
BUCKET_READS: dict[tuple[str, str], list[int]] = {}

# The request metrics are bumped as plain numbers in this process, and added to their
# Prometheus instruments when published (`publish`): with several workers each instrument is
# a value in a shared file behind a lock (prometheus_client's multiprocess mode), ~10 µs a
# request for the three of them, a quarter of a small hit. A worker publishes on a tick and
# whenever a scrape asks (gateway/admin/metrics.py), so a scrape reads exact figures.
_BOUNDS: tuple[float, ...] = tuple(LATENCY._upper_bounds)  # the buckets' bounds, +Inf last
# Per (op, status, cache): [requests, body bytes, seconds summed, then requests per bucket].
_pending: dict[tuple[str, int, str], list[Any]] = {}
_children: dict[tuple[str, int, str], tuple[Counter, Counter, Histogram]] = {}
_thread: int | None = None  # the thread that counts requests: the only one that publishes


class Deferred:
    """An unlabelled counter bumped as a plain number (`pending += 1`), added to its
    Prometheus counter when the request metrics are published."""

    __slots__ = ("counter", "pending")

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.pending = 0

    def publish(self) -> None:
        if self.pending:
            n, self.pending = self.pending, 0
            self.counter.inc(n)


_deferred: list[Deferred] = []


def deferred(counter: Counter) -> Deferred:
    """`counter` as a plain number published with the request metrics."""
    kept = Deferred(counter)
    _deferred.append(kept)
    return kept


def observe(
    op: str, status: int, cache: str, sent: int, seconds: float, bucket: str | None = None
) -> None:
    """Count one answered request, and with `bucket` (an object read that found its mount)
    that bucket's read: plain numbers, published later (see above)."""
    key = (op, status, cache)
    counts = _pending.get(key)
    if counts is None:
        global _thread
        _thread = threading.get_ident()
        counts = _pending[key] = [0, 0, 0.0] + [0] * len(_BOUNDS)
    counts[0] += 1
    counts[1] += sent
    counts[2] += seconds
    counts[3 + bisect_left(_BOUNDS, seconds)] += 1  # the first bound >= seconds, as observe()
    if bucket is not None:
        reads = BUCKET_READS.get((bucket, cache))
        if reads is None:
            reads = BUCKET_READS[(bucket, cache)] = [0, 0]
        reads[0] += 1
        reads[1] += sent


def publish() -> None:
    """Add what was counted since the last publication to the Prometheus instruments (with
    several workers, the node's shared files). Only from the thread that counts (the event
    loop's): a call from another thread leaves the numbers to the next tick."""
    if _thread is not None and threading.get_ident() != _thread:
        return
    for deferred_counter in _deferred:
        deferred_counter.publish()
    for key, counts in _pending.items():
        if not counts[0]:
            continue
        children = _children.get(key)
        if children is None:
            # prometheus_client's labels() costs microseconds: once per label set.
            op, status, cache = key
            children = (
                REQUESTS.labels(op, str(status)),
                RESPONSE_BYTES.labels(op, cache),
                LATENCY.labels(op),
            )
            _children[key] = children
        requests, sent_bytes, latency = children
        requests.inc(counts[0])
        if counts[1]:
            sent_bytes.inc(counts[1])
        # A histogram child's values, as observe() bumps them one request at a time.
        latency._sum.inc(counts[2])
        for i, n in enumerate(counts[3:]):
            if n:
                latency._buckets[i].inc(n)
        counts[:] = [0, 0, 0.0] + [0] * len(_BOUNDS)


def totals() -> tuple[int, int]:
    """Requests answered and body bytes sent by this process so far (the console's samples,
    taken with the heartbeat: never on the request path)."""
    publish()
    pending = [c for c in _pending.values()]
    requests = _total(REQUESTS) + sum(c[0] for c in pending)
    sent = _total(RESPONSE_BYTES) + sum(c[1] for c in pending)
    return requests, sent


def _total(counter: Counter) -> int:
    samples = (s for family in counter.collect() for s in family.samples)
    return int(sum(s.value for s in samples if s.name.endswith("_total")))


STORE_BYTES = Counter(
    "gateway_store_bytes", "Bytes read from under-stores", ["store"], registry=REGISTRY
)
_store_children: dict[str, Counter] = {}


def _labelled(children: dict[str, Any], metric: Any, kind: str) -> Any:
    """`metric` labelled with a store's kind, made once (labels() costs microseconds)."""
    child = children.get(kind)
    if child is None:
        child = children[kind] = metric.labels(kind)
    return child


def store_bytes(kind: str, n: int) -> None:
    _labelled(_store_children, STORE_BYTES, kind).inc(n)


STORE_FIRST_BYTE = Histogram(
    "gateway_store_first_byte_seconds",
    "Time from a store read's start to its first byte (an open's: to its answer's head)",
    ["store"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
    registry=REGISTRY,
)
_first_byte_children: dict[str, Histogram] = {}


def store_waited(kind: str, seconds: float) -> None:
    """One store read's time to its first byte (gateway/timing.py has the request's share)."""
    _labelled(_first_byte_children, STORE_FIRST_BYTE, kind).observe(seconds)


# Answers of under-stores that were not what was asked for (gateway/stores/base.check_answer):
# bytes an origin that ignores Range sent beyond the range asked, and answers of another
# version than the If-Match asked for (an origin that ignores If-Match); neither is kept.
STORE_WASTED_BYTES = Counter(
    "gateway_store_wasted_bytes",
    "Bytes under-stores sent that were not asked for (a ranged GET answered whole)",
    ["store"],
    registry=REGISTRY,
)
STORE_WRONG_VERSIONS = Counter(
    "gateway_store_wrong_versions",
    "Store answers of another version than the one asked for, refused",
    ["store"],
    registry=REGISTRY,
)


def store_answer(kind: str, wasted: int, wrong_version: bool) -> None:
    """What a store's answer check found (gateway/stores/base.answer_report)."""
    if wasted:
        STORE_WASTED_BYTES.labels(kind).inc(wasted)
    if wrong_version:
        STORE_WRONG_VERSIONS.labels(kind).inc()


# Preload jobs (gateway/jobs): what this node loaded into its cache, and the fleet's jobs by
# state as this node's job loop last read them from the database.
JOB_OBJECTS = Counter(
    "gateway_job_objects_loaded", "Objects whose first block a job loaded here", registry=REGISTRY
)
JOB_BYTES = Counter("gateway_job_bytes_loaded", "Bytes jobs loaded here", registry=REGISTRY)
JOBS = Gauge(
    "gateway_jobs", "Preload jobs by state", ["state"], registry=REGISTRY,
    multiprocess_mode="livemax",
)  # fmt: skip
JOB_STATES = ("queued", "listing", "running", "done", "partial", "failed", "cancelled")


def job_loaded(n: int, objects: int) -> None:
    """Bytes a preload loaded, and the objects whose first block was among them."""
    JOB_BYTES.inc(n)
    if objects:
        JOB_OBJECTS.inc(objects)


JOB_YIELDS = Counter(
    "gateway_job_yields",
    "Times preload waited for this node's clients' fetches from the store to end",
    registry=REGISTRY,
)


def job_yielded() -> None:
    JOB_YIELDS.inc()


def set_jobs(counts: dict[str, int]) -> None:
    for state in JOB_STATES:
        JOBS.labels(state).set(counts.get(state, 0))


REVALIDATIONS = Counter(
    "gateway_revalidations",
    "Versions revalidated with the store past their TTL, by how (a listing of their prefix, or"
    " a request of their own) and what was found (fresh, changed, gone)",
    ["how", "found"],
    registry=REGISTRY,
)
REVALIDATION_LISTINGS = Counter(
    "gateway_revalidation_listings",
    "Listings made to revalidate versions in bulk, by store kind",
    ["kind"],
    registry=REGISTRY,
)
REVALIDATION_LISTED = Counter(
    "gateway_revalidation_listed_keys",
    "Keys those listings told (their number over the listings': keys per listing)",
    ["kind"],
    registry=REGISTRY,
)


NEIGHBOURS_LEARNT = Counter(
    "gateway_versions_neighbours_learnt",
    "Versions of immutable mounts' keys taken from their rows in bulk, beside a key asked for"
    " that this node did not know (after a restart, or learnt by another node)",
    registry=REGISTRY,
)


def revalidation_listing(kind: str, keys: int) -> None:
    REVALIDATION_LISTINGS.labels(kind).inc()
    REVALIDATION_LISTED.labels(kind).inc(keys)


def revalidated(how: str, found: str, count: int = 1) -> None:
    """Held versions revalidated (one unless `count`): how ("listing", "head") and found
    ("fresh", "changed", "gone")."""
    REVALIDATIONS.labels(how, found).inc(count)
