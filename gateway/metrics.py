"""Prometheus metrics of a node: requests, bytes and latency by operation, and the cache.

Counters are bumped once per request after the reply is sent; cache figures are read from
the cache's own statistics at scrape time, so the hit path pays for nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.cache import CacheStats

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


class CacheCollector(Collector):
    def __init__(self, stats: Callable[[], CacheStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._stats()
        yield GaugeMetricFamily("gateway_cache_entries", "Objects in the disk cache", s.entries)
        yield GaugeMetricFamily("gateway_cache_bytes", "Bytes in the disk cache", s.bytes_used)
        yield GaugeMetricFamily(
            "gateway_cache_memory_bytes", "Bytes in the memory tier", s.memory_bytes_used
        )
        yield CounterMetricFamily("gateway_cache_hits", "Cache lookups that hit", s.hits)
        yield CounterMetricFamily("gateway_cache_misses", "Cache lookups that missed", s.misses)
        yield CounterMetricFamily(
            "gateway_cache_memory_hits", "Hits served by the memory tier", s.memory_hits
        )
        yield CounterMetricFamily(
            "gateway_cache_evictions", "Objects evicted from the disk cache", s.evictions
        )


def watch_cache(stats: Callable[[], CacheStats]) -> None:
    REGISTRY.register(CacheCollector(stats))
