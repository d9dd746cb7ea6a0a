"""Prometheus metrics of a node: requests, bytes and latency by operation, and the cache.

Counters are bumped once per request after the reply is sent; cache figures are read from
the cache's own statistics at scrape time, so the hit path pays for nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.cache import PageStore

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


_children: dict[tuple[str, int, str], tuple[Counter, Counter, Histogram]] = {}


def observe(op: str, status: int, cache: str, sent: int, seconds: float) -> None:
    """Count one answered request; the labelled children are looked up once per label set
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


STORE_BYTES = Counter(
    "gateway_store_bytes", "Bytes read from under-stores", ["store"], registry=REGISTRY
)
_store_children: dict[str, Counter] = {}


def store_bytes(kind: str, n: int) -> None:
    child = _store_children.get(kind)
    if child is None:
        child = _store_children[kind] = STORE_BYTES.labels(kind)
    child.inc(n)


class CacheCollector(Collector):
    """The page store's counters (this process) and the janitor's figures (the whole node,
    read from the file it publishes)."""

    def __init__(self, pages: PageStore) -> None:
        self._pages = pages

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._pages.stats
        counters = [
            ("gateway_cache_hits", "Block reads answered by the cache", s.hits),
            ("gateway_cache_memory_hits", "Block reads answered by the memory tier", s.memory_hits),
            ("gateway_cache_misses", "Block reads that waited for the store", s.misses),
            ("gateway_cache_joins", "Misses that joined a fill in flight (single flight)", s.joins),
            ("gateway_cache_hit_bytes", "Bytes answered from the cache", s.hit_bytes),
            ("gateway_cache_fills", "Blocks fetched from a store and kept", s.fills),
            ("gateway_cache_fill_failures", "Block fills that failed", s.fill_failures),
            ("gateway_cache_prefetches", "Block fills started by read-ahead", s.prefetches),
            ("gateway_cache_corrupt_blocks", "Damaged block files found and dropped", s.corrupt),
            ("gateway_cache_written_blocks", "Blocks entered by write-through", s.written),
        ]
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value)
        yield GaugeMetricFamily(
            "gateway_cache_fills_in_flight", "Block fills in flight", self._pages.fills_in_flight
        )
        yield GaugeMetricFamily(
            "gateway_cache_memory_bytes", "Bytes in the memory tier", self._pages.memory.bytes_used
        )
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


def watch_cache(pages: PageStore) -> None:
    REGISTRY.register(CacheCollector(pages))
