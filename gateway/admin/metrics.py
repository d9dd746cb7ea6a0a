"""Prometheus metrics of a node: requests, bytes and latency by operation, and the cache.

Request counters are bumped as plain numbers in each worker once per request after the reply
is sent (gateway/counters.py) and added to the Prometheus instruments when published; cache
figures are read from the cache's own statistics at scrape time, so the hit path pays for
nothing twice.

With several worker processes (`--workers`), a scrape reaches one of them but must answer for
the node: `gateway serve` then points PROMETHEUS_MULTIPROC_DIR at a folder of the node's
before the workers start, prometheus_client keeps every worker's counters and histograms in
files there (its multiprocess mode), and each worker publishes its request counters and its
page-store figures there every PUBLISH_INTERVAL, at its stop, and when a scrape asks (the
scraping worker signals its live siblings and waits, up to GATHER_WAIT, for each to have
published: figures are exact at scrape time); a scrape sums them all (counters of workers
that have exited included, gauges of live workers only).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway import counters
from gateway.cache import CacheFigures, Fills, JanitorStats, MountFigures, PageStore
from gateway.counters import BUCKET_READS, REGISTRY
from gateway.datadir import MULTIPROC_ENV

log = logging.getLogger(__name__)

PUBLISH_INTERVAL = 0.5  # seconds between a worker's publications of its figures
# A scrape asks each live sibling worker to publish at once with this signal (its default
# action is to ignore it: a process that has no handler for it is not harmed), and waits for
# them up to GATHER_WAIT seconds; a worker that has not published by then is read as it last
# published (at most PUBLISH_INTERVAL old).
GATHER_SIGNAL = signal.SIGURG
GATHER_WAIT = 0.5

_COUNTERS = (
    ("gateway_cache_hits", "Clients' block reads answered by the cache", "hits"),
    ("gateway_cache_memory_hits", "Block reads answered by the memory tier", "memory_hits"),
    ("gateway_cache_misses", "Clients' block reads that waited for the store", "misses"),
    ("gateway_cache_preload_fills", "Blocks preload jobs fetched (not misses)", "preload_fills"),
    ("gateway_cache_preload_hits", "Blocks preload jobs found cached", "preload_hits"),
    ("gateway_cache_joins", "Misses that joined a fill in flight (single flight)", "joins"),
    ("gateway_cache_hit_bytes", "Bytes answered from the cache", "hit_bytes"),
    ("gateway_cache_fills", "Blocks fetched from a store and kept", "fills"),
    ("gateway_cache_fill_failures", "Block fills that failed", "fill_failures"),
    ("gateway_cache_prefetches", "Block fills started by read-ahead", "prefetches"),
    ("gateway_cache_corrupt_blocks", "Damaged block files found and dropped", "corrupt"),
    ("gateway_cache_written_blocks", "Blocks entered by write-through", "written"),
    ("gateway_cache_unkept_blocks", "Blocks served from the store, not kept: disk full", "unkept"),
    ("gateway_cache_zero_copy", "Block reads sent from their files unread (sendfile)", "zero_copy"),
    ("gateway_cache_rechecks", "Zero-copy sends whose block was checked first", "rechecks"),
    (
        "gateway_cache_disk_sends",
        "Zero-copy sends whose block was read in from the disk on a thread first",
        "disk_sends",
    ),
    ("gateway_cache_sealed_sends", "Zero-copy sends of sealed (fs-verity) files", "sealed"),
    ("gateway_cache_thread_claims", "Fills claimed on a thread, not at once", "thread_claims"),
    ("gateway_cache_records_kept", "Key records put back for cached blocks", "records_kept"),
)
_GAUGES = (
    ("gateway_cache_fills_in_flight", "Block fills in flight", "fills_in_flight"),
    ("gateway_cache_memory_bytes", "Bytes in the memory tier", "memory_bytes"),
)
_GAUGE_FIELDS = frozenset(field for _, _, field in _GAUGES)


def shared_dir() -> Path | None:
    """The folder the workers share their figures in, when the node has several."""
    value = os.environ.get(MULTIPROC_ENV)
    return Path(value) if value else None


def _process_figures(pages: PageStore, fills: Fills) -> dict[str, float]:
    s = pages.stats
    figures: dict[str, float] = {field: getattr(s, field) for _, _, field in _COUNTERS}
    figures["fills_in_flight"] = fills.in_flight
    figures["memory_bytes"] = pages.memory.bytes_used
    return figures


# This process's reads by bucket (gateway/counters.py), as published: [bucket, cache, reads,
# bytes] each.
BucketReads = list[list[Any]]
# Block reads by mount id, as published: [hits, misses, preload hits, preload fills] each.
MountCounts = dict[int, list[int]]


def _process_bucket_reads() -> BucketReads:
    return [[bucket, cache, n, sent] for (bucket, cache), (n, sent) in BUCKET_READS.items()]


def _process_mount_counts(pages: PageStore) -> MountCounts:
    return {
        mount: [c.hits, c.misses, c.preload_hits, c.preload_fills]
        for mount, c in pages.stats.mounts.items()
    }


def publish(
    pages: PageStore, fills: Fills, folder: Path
) -> tuple[dict[str, float], BucketReads, MountCounts]:
    """Write this worker's cache figures and reads by bucket where the other workers' scrapes
    find them."""
    global _published
    counters.publish()  # the request metrics, into prometheus_client's files
    figures = _process_figures(pages, fills)
    buckets = _process_bucket_reads()
    mounts = _process_mount_counts(pages)
    path = folder / f"cache_{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    _published += 1
    doc = {"figures": figures, "buckets": buckets, "mounts": mounts, "published": _published}
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return figures, buckets, mounts


_published = 0  # this worker's publications so far: a scrape waits for a sibling's to grow


async def publish_forever(pages: PageStore, fills: Fills, folder: Path) -> None:
    """Publish this worker's figures every PUBLISH_INTERVAL, when a sibling's scrape signals
    (GATHER_SIGNAL), and once more when cancelled (the worker stops)."""

    def publish_now() -> None:
        try:
            publish(pages, fills, folder)
        except OSError as exc:
            log_once(f"figures not published: {exc}")

    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(GATHER_SIGNAL, publish_now)
        signalled = True
    except (RuntimeError, ValueError):  # not the main thread: published on the tick only
        signalled = False
    try:
        while True:
            publish_now()
            await asyncio.sleep(PUBLISH_INTERVAL)
    finally:
        if signalled:
            loop.remove_signal_handler(GATHER_SIGNAL)
        publish_now()


async def gather() -> None:
    """Before a scrape: this process's request metrics published, and with several workers
    each live sibling asked to publish its own, waited for up to GATHER_WAIT seconds."""
    counters.publish()
    folder = shared_dir()
    if folder is None:
        return
    asked: dict[int, int] = {}
    for pid, published in _siblings(folder).items():
        try:
            os.kill(pid, GATHER_SIGNAL)
        except OSError:
            continue
        asked[pid] = published
    deadline = time.monotonic() + GATHER_WAIT
    while asked and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
        now = _siblings(folder)
        asked = {pid: n for pid, n in asked.items() if now.get(pid, n) <= n and _alive(pid)}


def _siblings(folder: Path) -> dict[int, int]:
    """The other live workers of this node (processes of the same parent that published in
    `folder`) and how many times each has published."""
    found: dict[int, int] = {}
    me, parent = os.getpid(), os.getppid()
    for path in folder.glob("cache_*.json"):
        try:
            pid = int(path.stem.split("_", 1)[1])
            if pid == me or _parent(pid) != parent:
                continue
            found[pid] = int(json.loads(path.read_text()).get("published", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            continue  # being replaced, or gone
    return found


def _parent(pid: int) -> int | None:
    """The parent of process `pid` (Linux's /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


_logged: set[str] = set()


def log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.warning("%s", message)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _node_figures(
    pages: PageStore, fills: Fills, folder: Path
) -> tuple[dict[str, float], BucketReads, MountCounts]:
    """Counters of every worker that ever published; gauges of the live ones."""
    own = publish(pages, fills, folder)
    total = dict.fromkeys(own[0], 0.0)
    reads: dict[tuple[str, str], list[int]] = {}
    per_mount: MountCounts = {}
    for path in folder.glob("cache_*.json"):
        pid = int(path.stem.split("_", 1)[1])
        if pid == os.getpid():
            figures, buckets, mounts = own
        else:
            try:
                doc = json.loads(path.read_text())
                figures, buckets = doc["figures"], doc["buckets"]
                mounts = {int(m): counts for m, counts in doc.get("mounts", {}).items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # being replaced, or gone
        live = pid == os.getpid() or _alive(pid)
        for name, value in figures.items():
            if name in total and (live or name not in _GAUGE_FIELDS):
                total[name] += value
        for bucket, cache, n, sent in buckets:
            counted = reads.setdefault((bucket, cache), [0, 0])
            counted[0] += n
            counted[1] += sent
        for mount, counts in mounts.items():
            summed = per_mount.setdefault(mount, [0, 0, 0, 0])
            for i, n in enumerate(counts):
                summed[i] += n
    return total, [[b, c, n, sent] for (b, c), (n, sent) in reads.items()], per_mount


def _figures(pages: PageStore, fills: Fills) -> tuple[dict[str, float], BucketReads, MountCounts]:
    """The node's counts: every worker's summed when there are several, else this process's."""
    folder = shared_dir()
    if folder is not None:
        return _node_figures(pages, fills, folder)
    return _process_figures(pages, fills), _process_bucket_reads(), _process_mount_counts(pages)


def cache_figures(pages: PageStore, fills: Fills) -> CacheFigures:
    """The node's cache at a glance (`gateway status`, the console, the heartbeat): bytes
    held and pinned and the budget (the janitor's last pass), the clients' hits and misses and
    the preload's fills (every worker's), for the node and per mount. Blocking (small file
    reads): call it off the event loop's hot path, as a scrape does."""
    counts, _, per_mount = _figures(pages, fills)
    node = pages.janitor_stats()
    mount_ids = sorted(set(per_mount) | set(node.mounts if node else ()))
    mounts = tuple(
        _mount_figures(pages, node, mount, per_mount.get(mount, [0, 0, 0, 0]))
        for mount in mount_ids
    )
    return CacheFigures(
        cache_bytes=node.bytes_used if node else 0,
        pinned_bytes=node.pinned_bytes if node else 0,
        capacity_bytes=pages.capacity,
        hits=int(counts["hits"]),
        misses=int(counts["misses"]),
        preload_fills=int(counts["preload_fills"]),
        mounts=mounts,
    )


def _mount_figures(
    pages: PageStore, node: JanitorStats | None, mount: int, counts: list[int]
) -> MountFigures:
    hits, misses, _, preload_fills = counts
    return MountFigures(
        mount_id=mount,
        cache_bytes=node.mounts.get(mount, 0) if node else 0,
        pinned_bytes=node.mount_pinned.get(mount, 0) if node else 0,
        capacity_bytes=node.quotas.get(mount, pages.capacity) if node else pages.capacity,
        hits=hits,
        misses=misses,
        preload_fills=preload_fills,
    )


class CacheCollector(Collector):
    """The page store's counters and the janitor's figures (the whole node, read from the
    file it publishes); with several workers, every worker's page-store figures summed."""

    def __init__(self, pages: PageStore, fills: Fills) -> None:
        self._pages = pages
        self._fills = fills

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        figures, buckets, per_mount = _figures(self._pages, self._fills)
        for name, doc, field in _COUNTERS:
            yield CounterMetricFamily(name, doc, figures[field])
        for name, doc, field in _GAUGES:
            yield GaugeMetricFamily(name, doc, figures[field])
        reads = CounterMetricFamily(
            "gateway_bucket_reads",
            "Object reads (GET, HEAD) answered, by bucket and how the cache answered",
            labels=["bucket", "cache"],
        )
        sent = CounterMetricFamily(
            "gateway_bucket_read_bytes",
            "Body bytes of object reads sent, by bucket and how the cache answered",
            labels=["bucket", "cache"],
        )
        for bucket, cache, n, nbytes in sorted(buckets):
            reads.add_metric([bucket, cache], n)
            sent.add_metric([bucket, cache], nbytes)
        yield reads
        yield sent
        node = self._pages.janitor_stats()
        yield GaugeMetricFamily(
            "gateway_cache_bytes", "Bytes of blocks on disk", node.bytes_used if node else 0
        )
        yield GaugeMetricFamily(
            "gateway_cache_capacity_bytes", "The cache's byte budget", self._pages.capacity
        )
        yield GaugeMetricFamily(
            "gateway_cache_blocks", "Blocks on disk", node.entries if node else 0
        )
        yield GaugeMetricFamily(
            "gateway_cache_pinned_bytes",
            "Bytes of pinned blocks on disk (never evicted)",
            node.pinned_bytes if node else 0,
        )
        yield GaugeMetricFamily(
            "gateway_cache_protected_bytes",
            "Bytes of blocks used twice or more: evicted only after every block used once",
            node.protected_bytes if node else 0,
        )
        yield CounterMetricFamily(
            "gateway_cache_unpinned_blocks",
            "Pinned blocks whose pin an unpin (gateway load --unpin) took off",
            node.unpinned_blocks if node else 0,
        )
        yield CounterMetricFamily(
            "gateway_cache_evictions",
            "Blocks evicted by the janitor",
            node.evictions if node else 0,
        )
        mount_bytes = GaugeMetricFamily(
            "gateway_cache_mount_bytes", "Bytes of blocks on disk per mount", labels=["mount"]
        )
        for mount, used in sorted(node.mounts.items() if node else []):
            mount_bytes.add_metric([str(mount)], used)
        yield mount_bytes
        yield from self._per_mount(node, per_mount)

    def _per_mount(
        self, node: JanitorStats | None, counts: MountCounts
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The mounts' own figures, labelled by mount id as gateway_cache_mount_bytes is."""
        pinned = GaugeMetricFamily(
            "gateway_cache_mount_pinned_bytes", "Bytes of pinned blocks per mount",
            labels=["mount"],
        )  # fmt: skip
        for mount, n in sorted(node.mount_pinned.items() if node else []):
            pinned.add_metric([str(mount)], n)
        yield pinned
        capacity = GaugeMetricFamily(
            "gateway_cache_mount_capacity_bytes",
            "A mount's byte budget: its quota, else the cache's",
            labels=["mount"],
        )
        for mount in sorted(set(node.mounts) | set(counts) if node else counts):
            budget = node.quotas.get(mount, self._pages.capacity) if node else self._pages.capacity
            capacity.add_metric([str(mount)], budget)
        yield capacity
        names = (
            ("gateway_cache_mount_hits", "Clients' block reads answered by the cache, per mount"),
            (
                "gateway_cache_mount_misses",
                "Clients' block reads that waited for the store, per mount",
            ),
            ("gateway_cache_mount_preload_hits", "Blocks preload jobs found cached, per mount"),
            ("gateway_cache_mount_preload_fills", "Blocks preload jobs fetched, per mount"),
        )
        for i, (name, doc) in enumerate(names):
            family = CounterMetricFamily(name, doc, labels=["mount"])
            for mount, values in sorted(counts.items()):
                family.add_metric([str(mount)], values[i])
            yield family


_cache: CacheCollector | None = None


def watch_cache(pages: PageStore, fills: Fills) -> None:
    global _cache
    if _cache is not None:
        with contextlib.suppress(KeyError):
            REGISTRY.unregister(_cache)
    _cache = CacheCollector(pages, fills)
    REGISTRY.register(_cache)


def scrape() -> CollectorRegistry:
    """What /metrics answers: this process's registry, or with several workers every
    worker's request metrics (prometheus_client's multiprocess files) and the node's cache."""
    folder = shared_dir()
    if folder is None:
        counters.publish()
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(folder))
    if _cache is not None:
        registry.register(_cache)
    return registry
