"""PNG charts of saved results (matplotlib, no display needed): one per run, or the newest
result of every scenario on one page (`python -m loadtest chart`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never look for a display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from loadtest.report import latest

Data = dict[str, Any]
_COLORS = {
    "direct": "#9e9e9e",
    "gateway": "#1f77b4",
    "local": "#2ca02c",
    "nginx static": "#ff7f0e",
    "nginx proxy_cache": "#d62728",
}


def _color(name: str) -> str:
    return next((c for k, c in _COLORS.items() if name.startswith(k)), "#9467bd")


def _bars(ax: Axes, groups: list[str], series: dict[str, list[float]], log: bool) -> None:
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name, color=_color(name))
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def _epochs(ax: Axes, data: Data) -> None:
    rows = data["rows"]
    paths = list(dict.fromkeys(r["path"] for r in rows))
    epochs = sorted({r["epoch"] for r in rows})
    series = {
        p: [next((r["objects/s"] for r in rows if r["path"] == p and r["epoch"] == e), 0.0)
            for e in epochs]
        for p in paths
    }  # fmt: skip
    _bars(ax, [f"epoch {e}" for e in epochs], series, log=True)
    s = data["settings"]
    ax.set_title(f"epochs: {s['objects']} objects x {s['object_size'] // 1024} KiB, "
                 f"{s['readers']} readers", fontsize=9)  # fmt: skip
    ax.set_ylabel("objects/s (log)")


def _hits(ax: Axes, data: Data) -> None:
    rows = data["rows"]
    groups = list(dict.fromkeys(f"{r['size']}\nc={r['conns']}" for r in rows))
    servers = list(dict.fromkeys(r["server"] for r in rows))
    series = {
        s: [next(r["MB/s"] for r in rows if f"{r['size']}\nc={r['conns']}" == g
                 and r["server"] == s) for g in groups]
        for s in servers
    }  # fmt: skip
    _bars(ax, [g.replace(" of ", "\nof ") for g in groups], series, log=True)
    ax.set_title("hits: MB/s per object size (or range) and connections", fontsize=9)
    ax.set_ylabel("MB/s (log)")


def _passes(ax: Axes, rows: list[Data], note: Callable[[Data], str]) -> None:
    """MB/s per path (groups), one bar per pass the path has (colour by pass), annotated."""
    paths = list(dict.fromkeys(r["path"] for r in rows))
    passes = list(dict.fromkeys(r["pass"] for r in rows))
    palette = ["#ff9896", "#1f77b4", "#aec7e8", "#98df8a", "#c5b0d5", "#c49c94"]
    colors = {label: palette[i % len(palette)] for i, label in enumerate(passes)}
    width = 0.8 / max(max(sum(r["path"] == p for r in rows) for p in paths), 1)
    labelled: set[str] = set()
    for g, path in enumerate(paths):
        mine = [r for r in rows if r["path"] == path]
        for j, row in enumerate(mine):
            x = g + (j - (len(mine) - 1) / 2) * width
            label = row["pass"] if row["pass"] not in labelled else None
            labelled.add(row["pass"])
            ax.bar([x], [row["MB/s"]], width, label=label, color=colors[row["pass"]])
            if text := note(row):
                ax.annotate(text, (x, row["MB/s"]), xytext=(0, 3), textcoords="offset points",
                            ha="center", fontsize=6)  # fmt: skip
    ax.set_xticks(range(len(paths)), [p.replace(", ", ",\n") for p in paths], fontsize=7)
    ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_ylabel("MB/s served (log)")


def _origin_note(row: Data) -> str:
    ratio = row.get("origin B / served B")
    cold = isinstance(ratio, float) and ratio > 0 and row["pass"] == "cold"
    return f"{ratio:.1f}" if cold else ""


def _ranges(ax: Axes, data: Data) -> None:
    rows = data["rows"]
    _passes(ax, rows, _origin_note)
    s = data["settings"]
    ax.set_title(f"ranges: {s['ranges_per_pass']} x {s['range_size'] // 1024} KiB ranges of a "
                 f"{s['object_size'] >> 20} MiB object (over cold bars: origin B / served B)",
                 fontsize=9)  # fmt: skip


def _sequential(ax: Axes, data: Data) -> None:
    rows = data["rows"]
    _passes(ax, rows, _origin_note)
    s = data["settings"]
    ax.set_title(f"sequential: one {s['object_size'] >> 20} MiB object read whole", fontsize=9)


def _list(ax: Axes, data: Data) -> None:
    rows = data["rows"]
    paths = list(dict.fromkeys(r["path"] for r in rows))
    medians = [statistics.median(r["seconds"] for r in rows if r["path"] == p) for p in paths]
    ax.bar(paths, medians, color=[_color(p) for p in paths])
    ax.grid(axis="y", alpha=0.3)
    s = data["settings"]
    ax.set_title(f"list: {s['keys']} keys, {s['page_size']} a page (median)", fontsize=9)
    ax.set_ylabel("seconds per full listing")


DRAW: dict[str, Callable[[Axes, Data], None]] = {
    "epochs": _epochs,
    "hits": _hits,
    "ranges": _ranges,
    "sequential": _sequential,
    "list": _list,
}


def draw_one(data: Data, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    DRAW[data["scenario"]](ax, data)
    fig.suptitle(f"commit {data['commit']}, {data['cores']} cores, WAN: {_wan(data)}", fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _wan(data: Data) -> str:
    wan = str(data.get("wan", ""))
    return wan if len(wan) < 110 else wan[:107] + "..."


def draw_latest(results_dir: Path, out: Path) -> None:
    found = latest(results_dir)
    names = [n for n in DRAW if n in found]
    if not names:
        raise SystemExit(f"no results in {results_dir}; run a scenario first")
    cols = 2 if len(names) > 1 else 1
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        DRAW[name](ax, found[name])
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    commits = sorted({found[n]["commit"] for n in names})
    fig.suptitle(f"gateway load tests, commit {', '.join(commits)}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"chart: {out} ({', '.join(names)})")
