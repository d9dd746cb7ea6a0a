"""The fleet page's figures: each node's rates over the last hour from its samples (the
running totals its heartbeats write, gateway/cluster/registry.py), and the small SVG
sparklines that draw them, rendered here rather than by a script in the browser."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from gateway.cluster.registry import SAMPLE_INTERVAL

WINDOW = 3600.0  # seconds charted
BINS = 120  # points per chart: one per 30 s


@dataclass(slots=True)
class NodeSeries:
    """One node's last hour, a value (or None: no sample) per bin, oldest first."""

    requests_per_s: list[float | None] = field(default_factory=lambda: [None] * BINS)
    hit_ratio: list[float | None] = field(default_factory=lambda: [None] * BINS)
    cache_bytes: list[float | None] = field(default_factory=lambda: [None] * BINS)
    requests_now: float | None = None  # over the newest samples, if they are recent
    capacity_bytes: int | None = None


@dataclass(slots=True)
class _Bin:
    """A bin's sums over one node's workers: their rates add up, the cache is shared."""

    rates: dict[int, tuple[int, float]] = field(default_factory=dict)  # worker -> (delta, dt)
    hits: int = 0
    misses: int = 0
    cache_bytes: int = 0


def series(now: float, rows: Sequence[dict[str, Any]]) -> dict[str, NodeSeries]:
    """Each node's series from samples ordered by node, worker and time (NodeRegistry.samples):
    a rate is the difference of two consecutive samples of one worker over their distance; a
    total that went down (the process restarted under the same pid) counts from zero."""
    start = now - WINDOW
    bins: dict[str, dict[int, _Bin]] = defaultdict(dict)
    out: dict[str, NodeSeries] = {}
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        node, worker = row["node_id"], row["worker"]
        found = out.setdefault(node, NodeSeries())
        found.capacity_bytes = row["capacity_bytes"]
        before = last.get((node, worker))
        last[(node, worker)] = row
        if before is None or row["at"] <= before["at"]:
            continue
        index = min(BINS - 1, max(0, int((row["at"] - start) / WINDOW * BINS)))
        bucket = bins[node].setdefault(index, _Bin())
        dt = row["at"] - before["at"]
        delta, spent = bucket.rates.get(worker, (0, 0.0))
        bucket.rates[worker] = (delta + _grown(before, row, "requests"), spent + dt)
        bucket.hits += _grown(before, row, "hits")
        bucket.misses += _grown(before, row, "misses")
        bucket.cache_bytes = max(bucket.cache_bytes, row["cache_bytes"])
        if row["at"] >= now - 3 * SAMPLE_INTERVAL:
            rate = _grown(before, row, "requests") / dt
            found.requests_now = (found.requests_now or 0.0) + rate
    for node, by_index in bins.items():
        found = out[node]
        for index, bucket in by_index.items():
            found.requests_per_s[index] = sum(d / t for d, t in bucket.rates.values() if t > 0)
            lookups = bucket.hits + bucket.misses
            found.hit_ratio[index] = bucket.hits / lookups if lookups else None
            found.cache_bytes[index] = float(bucket.cache_bytes)
    return out


def _grown(before: dict[str, Any], after: dict[str, Any], name: str) -> int:
    grown = int(after[name]) - int(before[name])
    return grown if grown >= 0 else int(after[name])


def sparkline(
    values: Sequence[float | None], *, width: int = 160, height: int = 28, top: float | None = None
) -> Markup:
    """An inline SVG of the values (None: a gap), scaled to `top` (default: their maximum)."""
    known = [v for v in values if v is not None]
    if not known:
        return Markup(
            f'<svg class="spark" width="{width}" height="{height}" role="img">'
            "<title>no samples yet</title></svg>"
        )
    peak = top if top is not None else max(known)
    peak = peak if peak > 0 else 1.0
    step = width / max(1, len(values) - 1)
    runs: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            if runs[-1]:
                runs.append([])
            continue
        y = height - 1 - (min(value, peak) / peak) * (height - 2)
        runs[-1].append(f"{i * step:.1f},{y:.1f}")
    lines = "".join(
        f'<polyline points="{" ".join(run)}"/>' if len(run) > 1
        else f'<circle cx="{run[0].split(",")[0]}" cy="{run[0].split(",")[1]}" r="1.5"/>'
        for run in runs if run
    )  # fmt: skip
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
        f' role="img"><title>last hour, peak {peak:.3g}</title>{lines}</svg>'
    )
