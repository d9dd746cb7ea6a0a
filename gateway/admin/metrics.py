"""Prometheus metrics of a node: requests, bytes and latency by operation, and the cache.

Counters are bumped once per request after the reply is sent; cache figures are read from
the cache's own statistics at scrape time, so the hit path pays for nothing twice.

With several worker processes (`--workers`), a scrape reaches one of them but must answer for
the node: `gateway serve` then points PROMETHEUS_MULTIPROC_DIR at a folder of the node's
before the workers start, prometheus_client keeps every worker's counters and histograms in
files there (its multiprocess mode), and each worker publishes its page-store figures there
once a second; a scrape sums them all (counters of workers that have exited included, gauges
of live workers only).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.cache import PageStore
from gateway.counters import BUCKET_READS, REGISTRY
from gateway.datadir import MULTIPROC_ENV

log = logging.getLogger(__name__)

PUBLISH_INTERVAL = 1.0  # seconds between a worker's publications of its cache figures

_COUNTERS = (
    ("gateway_cache_hits", "Block reads answered by the cache", "hits"),
    ("gateway_cache_memory_hits", "Block reads answered by the memory tier", "memory_hits"),
    ("gateway_cache_misses", "Block reads that waited for the store", "misses"),
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
    ("gateway_cache_sealed_sends", "Zero-copy sends of sealed (fs-verity) files", "sealed"),
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


def _process_figures(pages: PageStore) -> dict[str, float]:
    s = pages.stats
    figures: dict[str, float] = {field: getattr(s, field) for _, _, field in _COUNTERS}
    figures["fills_in_flight"] = pages.fills_in_flight
    figures["memory_bytes"] = pages.memory.bytes_used
    return figures


# This process's reads by bucket (gateway/counters.py), as published: [bucket, cache, reads,
# bytes] each.
BucketReads = list[list[Any]]


def _process_bucket_reads() -> BucketReads:
    return [[bucket, cache, n, sent] for (bucket, cache), (n, sent) in BUCKET_READS.items()]


def publish(pages: PageStore, folder: Path) -> tuple[dict[str, float], BucketReads]:
    """Write this worker's cache figures and reads by bucket where the other workers' scrapes
    find them."""
    figures = _process_figures(pages)
    buckets = _process_bucket_reads()
    path = folder / f"cache_{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"figures": figures, "buckets": buckets}))
    os.replace(tmp, path)
    return figures, buckets


async def publish_forever(pages: PageStore, folder: Path) -> None:
    while True:
        try:
            publish(pages, folder)
        except OSError as exc:
            log_once(f"cache figures not published: {exc}")
        await asyncio.sleep(PUBLISH_INTERVAL)


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


def _node_figures(pages: PageStore, folder: Path) -> tuple[dict[str, float], BucketReads]:
    """Counters of every worker that ever published; gauges of the live ones."""
    own = publish(pages, folder)
    total = dict.fromkeys(own[0], 0.0)
    reads: dict[tuple[str, str], list[int]] = {}
    for path in folder.glob("cache_*.json"):
        pid = int(path.stem.split("_", 1)[1])
        if pid == os.getpid():
            figures, buckets = own
        else:
            try:
                doc = json.loads(path.read_text())
                figures, buckets = doc["figures"], doc["buckets"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being replaced, or gone
        live = pid == os.getpid() or _alive(pid)
        for name, value in figures.items():
            if name in total and (live or name not in _GAUGE_FIELDS):
                total[name] += value
        for bucket, cache, n, sent in buckets:
            counted = reads.setdefault((bucket, cache), [0, 0])
            counted[0] += n
            counted[1] += sent
    return total, [[b, c, n, sent] for (b, c), (n, sent) in reads.items()]


class CacheCollector(Collector):
    """The page store's counters and the janitor's figures (the whole node, read from the
    file it publishes); with several workers, every worker's page-store figures summed."""

    def __init__(self, pages: PageStore) -> None:
        self._pages = pages

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        folder = shared_dir()
        figures, buckets = (
            _node_figures(self._pages, folder)
            if folder is not None
            else (_process_figures(self._pages), _process_bucket_reads())
        )
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
        per_mount = GaugeMetricFamily(
            "gateway_cache_mount_bytes", "Bytes of blocks on disk per mount", labels=["mount"]
        )
        for mount, used in sorted(node.mounts.items() if node else []):
            per_mount.add_metric([str(mount)], used)
        yield per_mount


_cache: CacheCollector | None = None


def watch_cache(pages: PageStore) -> None:
    global _cache
    if _cache is not None:
        with contextlib.suppress(KeyError):
            REGISTRY.unregister(_cache)
    _cache = CacheCollector(pages)
    REGISTRY.register(_cache)


def scrape() -> CollectorRegistry:
    """What /metrics answers: this process's registry, or with several workers every
    worker's request metrics (prometheus_client's multiprocess files) and the node's cache."""
    folder = shared_dir()
    if folder is None:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(folder))
    if _cache is not None:
        registry.register(_cache)
    return registry
