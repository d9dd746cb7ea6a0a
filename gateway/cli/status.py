"""`gateway status`: the fleet's nodes as the database knows them (or the lone node serving
over this data dir), and what each one's cache holds."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import click

from gateway.cli.door import run, with_meta
from gateway.cli.options import DB_OPTIONS, settings_from, settings_options
from gateway.cli.serve import serving_file
from gateway.config import Settings
from gateway.meta import MetaStore

if TYPE_CHECKING:
    from gateway.cluster import NodeFigures


_STATUS_OPTIONS = [
    *DB_OPTIONS,
    ("heartbeat_timeout", "Seconds of silence after which a node counts as lapsed."),
]


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@settings_options(_STATUS_OPTIONS)
def status(as_json: bool, **kwargs: Any) -> None:
    """List the fleet's nodes as the database knows them: live, lapsed or left."""
    from gateway.cluster import NodeRegistry
    from gateway.meta import MetaUnavailable

    settings = settings_from(kwargs)

    async def read(meta: MetaStore) -> tuple[list[dict[str, Any]], dict[int, str]]:
        records = await NodeRegistry(meta.engine, settings.heartbeat_timeout).read()
        buckets = {m.id: m.bucket for m in await meta.list_mounts()}
        return [record.summary() for record in records], buckets

    try:
        rows, buckets = run(with_meta(settings, read))
    except MetaUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    if not rows and (alone := _lone_node(settings, buckets)) is not None:
        rows = [alone]  # a node in no fleet (no --fleet-secret) writes no heartbeats
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        click.echo(
            f"no node serves over {settings.data_dir.absolute()}, and none has joined a fleet"
            " on its database (nodes join when `gateway serve --fleet-secret ...` starts)"
        )
    else:
        click.echo(_status_table(rows))


_CACHE_COLUMNS = ("CACHED", "PINNED", "CAPACITY", "HITS", "MISSES", "PRELOADED", "HIT RATIO")


def _cache_cells(figures: dict[str, Any]) -> tuple[str, ...]:
    """A node's or a mount's cache figures as _CACHE_COLUMNS shows them. PRELOADED: blocks
    preload fetched, which are neither hits nor misses (HIT RATIO is the clients')."""
    if figures.get("cache_bytes") is None:
        return ("-",) * len(_CACHE_COLUMNS)
    ratio = figures["hit_ratio"]
    return (
        _size(figures["cache_bytes"]),
        _size(figures["pinned_bytes"]),
        _size(figures["capacity_bytes"]) if figures["capacity_bytes"] else "-",
        str(figures["hits"]),
        str(figures["misses"]),
        str(figures["preload_fills"]),
        "-" if ratio is None else f"{ratio:.1%}",
    )


def _status_table(rows: list[dict[str, Any]]) -> str:
    """The nodes, then their mounts: what each holds and how it answered."""
    head = ("NODE", "ADDRESS", "ZONE", "WEIGHT", "STATE", "HEARTBEAT")
    table: list[tuple[str, ...]] = [head + _CACHE_COLUMNS]
    for row in rows:
        table.append(
            (
                row["id"],
                row["address"],
                row["zone"] or "-",
                f"{row['weight']:g}",
                row["state"],
                "-" if row["heartbeat_age"] is None else f"{row['heartbeat_age']:.1f}s ago",
                *_cache_cells(row),
            )
        )
    lines = _aligned(table)
    live = sum(1 for row in rows if row["live"])
    lines.append(f"{live} of {len(rows)} nodes live")
    mounts = [(row["id"], m) for row in rows for m in row.get("mounts") or ()]
    if mounts:
        lines.append("")
        per_mount: list[tuple[str, ...]] = [("NODE", "MOUNT", *_CACHE_COLUMNS)]
        per_mount += [(node, m["mount"], *_cache_cells(m)) for node, m in mounts]
        lines += _aligned(per_mount)
    return "\n".join(lines)


def _aligned(table: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]


def _size(count: int) -> str:
    """Bytes in binary units, as the size settings take them (64MiB, 10GiB)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _lone_node(settings: Settings, buckets: dict[int, str]) -> dict[str, Any] | None:
    """The node serving over this data dir, as `gateway serve` recorded it, if its process
    still runs and it answers: a row like a fleet member's, as the console shows it, its
    cache figures read from its /metrics (a node in no fleet writes no heartbeats)."""
    import urllib.request

    from gateway.cluster import NodeFigures

    try:
        record = json.loads(serving_file(settings).read_text())
        os.kill(record["pid"], 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    figures: dict[str, Any] = {**NodeFigures().summary(), "cache_bytes": None, "hit_ratio": None}
    try:
        with urllib.request.urlopen(record["health"], timeout=3) as answer:
            live = answer.status == 200
        metrics_url = record["health"].rsplit("/", 1)[0] + "/metrics"
        with urllib.request.urlopen(metrics_url, timeout=5) as answer:
            figures = _figures_from_metrics(answer.read().decode(), buckets).summary()
    except OSError:
        live = False
    return {
        "id": "this node", "address": record["address"], "zone": None, "weight": 1.0,
        "state": "alone" if live else "not answering", "live": live,
        "heartbeat_age": None, "started_at": record["started_at"], "pid": record["pid"],
        "workers": record["workers"], **figures,
    }  # fmt: skip


def _figures_from_metrics(text: str, buckets: dict[int, str]) -> NodeFigures:
    """A node's cache figures out of its Prometheus exposition (gateway/admin/metrics.py),
    its mounts named by `buckets` (mount id: bucket)."""
    from prometheus_client.parser import text_string_to_metric_families

    from gateway.cluster import MountLine, NodeFigures

    node: dict[str, int] = {}
    mounts: dict[str, dict[str, int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("gateway_cache_").removesuffix("_total")
            mount = sample.labels.get("mount")
            if mount is None:
                node[name] = int(sample.value)
            elif name.startswith("mount_"):
                mounts.setdefault(mount, {})[name.removeprefix("mount_")] = int(sample.value)
    lines = tuple(
        MountLine(
            buckets.get(int(mount), f"mount {mount}"),
            cache_bytes=m.get("bytes", 0),
            pinned_bytes=m.get("pinned_bytes", 0),
            capacity_bytes=m.get("capacity_bytes", 0),
            hits=m.get("hits", 0),
            misses=m.get("misses", 0),
            preload_fills=m.get("preload_fills", 0),
        )
        for mount, m in sorted(mounts.items(), key=lambda item: int(item[0]))
    )
    return NodeFigures(
        cache_bytes=node.get("bytes", 0),
        hits=node.get("hits", 0),
        misses=node.get("misses", 0),
        capacity_bytes=node.get("capacity_bytes", 0),
        pinned_bytes=node.get("pinned_bytes", 0),
        preload_fills=node.get("preload_fills", 0),
        mounts=lines,
    )
