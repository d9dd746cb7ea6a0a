"""Results of one scenario run: the printed table, the JSON file, the same in markdown (to
paste into docs/performance.md) and the PNG chart.

A scenario fills a `Report` (rows are plain column -> value records, because they go to
JSON as they are); the chart is drawn from the JSON, so `python -m loadtest chart` can
redraw any earlier run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Row = dict[str, Any]
REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "loadtest" / "results"


def git_commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    commit = out.stdout.strip() or "unknown"
    return commit + ("+dirty" if dirty.stdout.strip() else "")


@dataclass
class Report:
    scenario: str
    columns: list[str]
    rows: list[Row] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    wan: str = ""
    load_generator: str = ""
    commit: str = field(default_factory=git_commit)
    started: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S"))
    cores: int = field(default_factory=lambda: os.cpu_count() or 0)
    # Other work on the machine skews every figure: the 1-minute load average at the start.
    loadavg_at_start: float = field(default_factory=lambda: round(os.getloadavg()[0], 2))

    def add(self, **row: Any) -> Row:
        self.rows.append(row)
        return row


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}" if abs(value) >= 0.01 else f"{value:.2g}"
    return str(value)


def format_table(columns: list[str], rows: list[Row]) -> str:
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for row in cells:
        out.append(
            "  ".join(
                v.rjust(w) if i else v.ljust(w)
                for i, (v, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(out)


def format_markdown(report: Report) -> str:
    """The report as markdown: what ran, the table, the ratios and the notes."""
    head = [
        f"`{report.scenario}`, run {report.started}, commit `{report.commit}`, "
        f"{report.cores} cores, load average {report.loadavg_at_start} at the start.",
        "",
        f"WAN: {report.wan}",
        "",
        f"Load generator: {report.load_generator}",
        "",
        "| " + " | ".join(report.columns) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(report.columns))) + "|",
    ]
    for row in report.rows:
        head.append("| " + " | ".join(_cell(row.get(c, "")) for c in report.columns) + " |")
    if report.ratios:
        head.append("")
        head += [f"- {name}: **{value:.2f}x**" for name, value in report.ratios.items()]
    if report.notes:
        head.append("")
        head += [f"- {note}" for note in report.notes]
    return "\n".join(head) + "\n"


def print_report(report: Report) -> None:
    print()
    print(
        f"== {report.scenario} (commit {report.commit}, {report.cores} cores, "
        f"load average {report.loadavg_at_start} at the start) =="
    )
    print(f"WAN: {report.wan}")
    print(f"load generator: {report.load_generator}")
    print(format_table(report.columns, report.rows))
    if report.ratios:
        print()
        width = max(len(k) for k in report.ratios)
        for name, value in report.ratios.items():
            print(f"  {name.ljust(width)}  {value:.2f}x")
    for note in report.notes:
        print(f"note: {note}")


def save(report: Report, results_dir: Path = RESULTS) -> tuple[Path, Path | None]:
    """Write results/<scenario>-<timestamp>.json, .md and .png; returns the JSON's and the
    PNG's paths (the markdown is beside the JSON)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stem = results_dir / f"{report.scenario}-{report.started}"
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(asdict(report), indent=2) + "\n")
    stem.with_suffix(".md").write_text(format_markdown(report))
    png_path = stem.with_suffix(".png")
    try:
        from loadtest.charts import draw_one
    except ImportError as exc:
        print(f"no chart ({exc}): pip install -e '.[loadtest]'")
        return json_path, None
    draw_one(asdict(report), png_path)
    return json_path, png_path


def latest(results_dir: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """The newest saved result of each scenario."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(results_dir.glob("*.json")):
        data = json.loads(path.read_text())
        found[data["scenario"]] = data  # sorted by timestamp: later files win
    return found
