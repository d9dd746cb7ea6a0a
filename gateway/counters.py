"""The request path's Prometheus instruments: requests, bytes and latency by operation, bytes
read from under-stores, and what preload jobs loaded. Bumped by the S3 front end, the service
and the job loop; read out by gateway/admin/metrics.py, which adds the page store's figures
and the workers' sharing."""

from __future__ import annotations

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

_children: dict[tuple[str, int, str], tuple[Counter, Counter, Histogram]] = {}


def observe(
    op: str, status: int, cache: str, sent: int, seconds: float, bucket: str | None = None
) -> None:
    """Count one answered request, and with `bucket` (an object read that found its mount)
    that bucket's read. The labelled children are looked up once per label set
    (prometheus_client's labels() costs microseconds a call, the hit path cannot spare them)."""
    key = (op, status, cache)
    children = _children.get(key)
    if children is None:
        children = (
            REQUESTS.labels(op, str(status)),
            RESPONSE_BYTES.labels(op, cache),
            LATENCY.labels(op),
        )
        _children[key] = children
    requests, sent_bytes, latency = children
    requests.inc()
    sent_bytes.inc(sent)
    latency.observe(seconds)
    if bucket is not None:
        reads = BUCKET_READS.get((bucket, cache))
        if reads is None:
            reads = BUCKET_READS[(bucket, cache)] = [0, 0]
        reads[0] += 1
        reads[1] += sent


def totals() -> tuple[int, int]:
    """Requests answered and body bytes sent by this process so far (the console's samples,
    taken with the heartbeat: never on the request path)."""
    return _total(REQUESTS), _total(RESPONSE_BYTES)


def _total(counter: Counter) -> int:
    samples = (s for family in counter.collect() for s in family.samples)
    return int(sum(s.value for s in samples if s.name.endswith("_total")))


STORE_BYTES = Counter(
    "gateway_store_bytes", "Bytes read from under-stores", ["store"], registry=REGISTRY
)
_store_children: dict[str, Counter] = {}


def store_bytes(kind: str, n: int) -> None:
    child = _store_children.get(kind)
    if child is None:
        child = _store_children[kind] = STORE_BYTES.labels(kind)
    child.inc(n)


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


def revalidation_listing(kind: str, keys: int) -> None:
    REVALIDATION_LISTINGS.labels(kind).inc()
    REVALIDATION_LISTED.labels(kind).inc(keys)


def revalidated(how: str, found: str, count: int = 1) -> None:
    """Held versions revalidated (one unless `count`): how ("listing", "head") and found
    ("fresh", "changed", "gone")."""
    REVALIDATIONS.labels(how, found).inc(count)
