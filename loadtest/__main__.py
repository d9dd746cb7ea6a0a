"""`python -m loadtest SCENARIO [options]`: see loadtest/README.md."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType, ModuleType
from typing import NoReturn

from loadtest import epochs, fleet, hits, inprocess, listing, ranges, rebuild, sequential
from loadtest.common import Options
from loadtest.origins import DEFAULT_ORIGIN, ORIGINS
from loadtest.report import RESULTS
from loadtest.servers import nginx_missing
from loadtest.wan import WanSettings, rate_bps

# Each scenario module has SUMMARY, add_arguments(parser) and run(options, args).
SCENARIOS: dict[str, ModuleType] = {
    "epochs": epochs,
    "hits": hits,
    "ranges": ranges,
    "sequential": sequential,
    "list": listing,
    "fleet": fleet,  # fleets of 1-3 nodes on PostgreSQL: hits over all nodes, one hop, epochs
    "rebuild": rebuild,  # no servers: the page store's index, by loadtest/rebuild.py
    "inprocess": inprocess,  # no servers: CPU per hit inside one node process
}
_NEEDS_NGINX = {"hits"}


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("common")
    g.add_argument(
        "--wan",
        choices=["auto", "netns", "proxy"],
        default="auto",
        help="netns: origin in a network namespace of its own (root); proxy: delay proxy on "
        "loopback; auto: netns when possible (default)",
    )
    g.add_argument("--rtt-ms", type=float, default=20.0, help="WAN round trip (20)")
    g.add_argument("--rate", default="1gbit", help="WAN bandwidth, tc notation; 0: none (1gbit)")
    g.add_argument(
        "--origin",
        choices=ORIGINS,
        help=f"the origin's S3 server ({DEFAULT_ORIGIN}; list: {listing.ORIGIN}; see "
        "loadtest/README.md, 'The origin')",
    )
    g.add_argument(
        "--stock-moto",
        action="store_true",
        help="--origin moto as shipped: every ranged GET reads the whole object "
        "(see moto_origin.py)",
    )
    g.add_argument("--processes", type=int, default=2, help="load client processes (2)")
    g.add_argument(
        "--gateway-args",
        default="",
        help="extra `gateway serve` arguments; write --gateway-args='--no-access-log ...'",
    )
    g.add_argument(
        "--metadata-ttl", default="-1", help="the mount's metadata_ttl (-1: immutable data)"
    )
    g.add_argument("--nginx-workers", type=int, default=1, help="nginx worker processes (1)")
    g.add_argument("--phase-timeout", type=float, default=600.0, help="seconds per load phase")
    g.add_argument(
        "--max-minutes", type=float, default=30.0, help="stop the whole run after this long"
    )
    g.add_argument("--results-dir", type=Path, default=RESULTS)
    g.add_argument("--workdir", type=Path, help="where temp folders go (default: $TMPDIR)")
    g.add_argument("--keep-workdir", action="store_true", help="keep data and server logs")
    g.add_argument(
        "--work-fs",
        choices=("folder", "image"),
        default="folder",
        help="the work folder: a plain one under --workdir (folder), or a journaled ext4 made "
        "for the run (image: a new file then costs what it costs on a node's disk, not this "
        "VM's journal-less root after deletions; loadtest/fsimage.py, root; removed at the "
        "end even with --keep-workdir)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest",
        description="Load scenarios for the gateway, with baselines measured in the same run.",
    )
    sub = parser.add_subparsers(dest="scenario", required=True)
    for name, module in SCENARIOS.items():
        p = sub.add_parser(name, help=module.SUMMARY)
        module.add_arguments(p)
        _common(p)
    p = sub.add_parser("all", help="every scenario in turn, with its defaults")
    _common(p)
    p = sub.add_parser("chart", help="redraw the newest result of each scenario into one PNG")
    p.add_argument("--results-dir", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, default=Path("docs/performance.png"))
    return parser


def _gateway_args(args: argparse.Namespace) -> tuple[str, ...]:
    """`--gateway-args`, with as many worker processes as nginx has (the goals compare like
    with like) unless they name --workers."""
    extra = tuple(shlex.split(args.gateway_args))
    if "--workers" in extra or any(a.startswith("--workers=") for a in extra):
        return extra
    return ("--workers", str(args.nginx_workers), *extra)


def _origin(args: argparse.Namespace, scenario: ModuleType) -> str:
    """--origin, else the scenario's own choice (its ORIGIN), else DEFAULT_ORIGIN."""
    if args.stock_moto:
        if args.origin not in (None, "moto"):
            raise SystemExit(f"--stock-moto is moto's; it does not go with --origin {args.origin}")
        return "moto"
    return str(args.origin or getattr(scenario, "ORIGIN", DEFAULT_ORIGIN))


def _options(args: argparse.Namespace) -> Options:
    rate_bps(args.rate)  # fail on a bad rate before anything starts
    return Options(
        wan=WanSettings(args.wan, args.rtt_ms, args.rate, args.stock_moto),
        processes=args.processes,
        gateway_args=_gateway_args(args),
        metadata_ttl=args.metadata_ttl,
        phase_timeout=args.phase_timeout,
        results_dir=args.results_dir,
        workdir=args.workdir,
        keep_workdir=args.keep_workdir,
        nginx_workers=args.nginx_workers,
        fs=args.work_fs,
    )


def _watchdog(minutes: float) -> None:
    def expire(signum: int, frame: FrameType | None) -> None:
        # Unwinds through every `finally`, so the servers and the namespace still go away.
        raise TimeoutError(f"run exceeded --max-minutes {minutes:g}")

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(max(1, int(minutes * 60)))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.scenario == "chart":
        from loadtest.charts import draw_latest

        draw_latest(args.results_dir, args.out)
        return 0
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    if any(n in _NEEDS_NGINX for n in names) and (problem := nginx_missing()):
        print(problem, file=sys.stderr)
        return 2
    options = _options(args)
    _watchdog(args.max_minutes * len(names))
    for name in names:
        defaults = argparse.ArgumentParser()
        SCENARIOS[name].add_arguments(defaults)
        scenario_args = args if args.scenario == name else defaults.parse_args([])
        wan = replace(options.wan, origin=_origin(args, SCENARIOS[name]))
        SCENARIOS[name].run(replace(options, wan=wan), scenario_args)
    return 0


def exit_with(entry: Callable[[], int]) -> NoReturn:
    """Run a command line's entry point: Ctrl-C and --max-minutes end it with their own exit
    codes, after every `finally` has stopped what the run started."""
    try:
        sys.exit(entry())
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        sys.exit(130)
    except TimeoutError as exc:
        print(f"{exc}; everything started was stopped", file=sys.stderr)
        sys.exit(124)


if __name__ == "__main__":
    exit_with(main)
