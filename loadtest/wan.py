"""The origin (an S3 server: rclone by default, SeaweedFS or moto; see origins.py) behind an
emulated WAN: latency and a bandwidth cap.

Preferred: the origin in a network namespace of its own, reached over a veth pair whose both
ends carry `tc netem` delay and rate. Kernels without netem (this machine's) still get the
namespace, a kernel `tbf` rate limit on the veth, and the delay from `wan_proxy` running
inside the namespace. Without namespaces (not root, no iproute2), `wan_proxy` on loopback
does both. Traffic never leaves 127.0.0.0/8 and the namespace made here.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loadtest.origins import DEFAULT_ORIGIN, start_rclone, start_seaweedfs
from loadtest.procs import Cleanup, free_port, run, wait_http

_REPO = Path(__file__).resolve().parent.parent
_NS_PREFIX = "ltwan"
# RFC 2544's benchmarking range: never routed anywhere, and it lives only on our veth.
_BENCH_NET = ipaddress.IPv4Network("198.18.0.0/15")
_ORIGIN_PORT, _WAN_PORT, _STATS_PORT = 9000, 9001, 9002


@dataclass(frozen=True, slots=True)
class WanSettings:
    mode: str  # auto | netns | proxy
    rtt_ms: float
    rate: str  # tc notation: 1gbit, 200mbit; "0" for no cap
    stock_moto: bool = False  # True: moto as shipped, whose ranged GETs read the whole object
    origin: str = DEFAULT_ORIGIN  # the S3 server: rclone | seaweedfs | moto (origins.py)


def rate_bps(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)?", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: use tc notation such as 1gbit or 500mbit")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return value * 8 if m.group(3) == "bps" else value


@dataclass
class Origin:
    """Where the origin answers: `url` behind the WAN, `seed_url` without (for loading data)."""

    url: str
    seed_url: str
    pid: int  # the S3 server's, for its CPU use
    description: str
    _stats_url: str | None = None
    _rx_counter: Path | None = None
    proxy_pid: int | None = None  # loadtest.wan_proxy's, where it adds the delay
    kind: str = DEFAULT_ORIGIN  # rclone | seaweedfs | moto

    def watch(self, gateway_pid: int | None = None) -> dict[str, int | None]:
        """The processes whose CPU each row reports per request (procs.CpuMeter's `watch`):
        the row's gateway (None where the row reads no gateway), the origin, the WAN proxy."""
        return {"gateway": gateway_pid, "origin": self.pid, "WAN proxy": self.proxy_pid}

    def _stats(self) -> dict[str, int]:
        assert self._stats_url is not None
        with urllib.request.urlopen(self._stats_url, timeout=5) as resp:
            return dict(json.load(resp))

    def bytes_sent(self) -> int:
        """Bytes the origin has sent towards clients so far (compare two readings)."""
        if self._stats_url:
            return self._stats()["bytes_from_origin"]
        assert self._rx_counter is not None
        return int(self._rx_counter.read_text())

    def requests(self) -> int | None:
        """Requests sent to the origin so far, where the delay proxy sees them (their heads)."""
        return self._stats()["requests"] if self._stats_url else None

    def connections(self) -> int | None:
        """TCP connections made to the origin so far, where the delay proxy sees them; moto
        closes every connection after one response, so for moto this counts its requests
        too (SeaweedFS and rclone keep connections open)."""
        return self._stats()["connections"] if self._stats_url else None


def _netem_available(dev: str) -> bool:
    out = run(["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms"], check=False)
    if out.returncode == 0:
        run(["tc", "qdisc", "del", "dev", dev, "root"], check=False)
    return out.returncode == 0


def _remove_stale_namespaces() -> None:
    """Namespaces left by a harness killed with SIGKILL: ours by name, their owner PID gone."""
    out = run(["ip", "netns", "list"], check=False).stdout
    for name in re.findall(rf"^({_NS_PREFIX}(\d+))\b", out, re.M):
        if not Path(f"/proc/{name[1]}").exists():
            run(["ip", "netns", "del", name[0]], check=False)


def _pick_subnet() -> ipaddress.IPv4Network:
    used = run(["ip", "-o", "-4", "addr", "show"]).stdout
    base = int(_BENCH_NET.network_address) + (os.getpid() % 32768) * 4
    for i in range(64):
        net = ipaddress.IPv4Network((base + 4 * i, 30))
        if net.subnet_of(_BENCH_NET) and str(net.network_address + 1) not in used:
            return net
    raise RuntimeError("no free /30 in 198.18.0.0/15 for the WAN veth")


def _module_env() -> dict[str, str]:
    """`python -m loadtest.x` finds this package from any working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH")) if p)
    return env


def _start_moto(
    cleanup: Cleanup, workdir: Path, prefix: list[str], host: str, port: int, stock: bool
) -> int:
    # loadtest.moto_origin: moto's server with ranged GETs that read only their range,
    # ListObjectsV2 pages that cost a page, and a seeding endpoint (data.seed_objects).
    launcher = ["-m", "loadtest.moto_origin", *(["--stock"] if stock else [])]
    cmd = [*prefix, sys.executable, *launcher, "-H", host, "-p", str(port)]
    proc = cleanup.spawn("moto", cmd, workdir / "moto.log", _module_env())
    wait_http(f"http://{host}:{port}/moto-api/", proc, timeout=60)
    return proc.pid


def _start_proxy(
    cleanup: Cleanup,
    workdir: Path,
    prefix: list[str],
    listen: str,
    upstream: str,
    stats: str,
    settings: WanSettings,
    rate: float | None,
) -> int:
    cmd = [
        *prefix, sys.executable, "-m", "loadtest.wan_proxy", "--listen", listen,
        "--upstream", upstream, "--rtt-ms", str(settings.rtt_ms),
        "--rate-bps", str(rate or 0), "--stats", stats,
    ]  # fmt: skip
    proc = cleanup.spawn("wan proxy", cmd, workdir / "wan_proxy.log", _module_env())
    wait_http(f"http://{stats}/", proc, timeout=30)
    return proc.pid


def _tc_shape(ns: str | None, dev: str, settings: WanSettings, netem: bool) -> str:
    """Shape the egress of one veth end: half the RTT each way, and the rate cap."""
    where = ["-n", ns] if ns else []
    rate = rate_bps(settings.rate)
    if netem:
        spec = ["netem", "delay", f"{settings.rtt_ms / 2}ms", "limit", "100000"]
        if rate:
            spec += ["rate", f"{int(rate)}bit"]
    elif rate:
        # burst: 10 ms of traffic (at least 256 KiB, so GSO segments pass whole).
        burst = max(256 * 1024, int(rate / 8 / 100))
        spec = ["tbf", "rate", f"{int(rate)}bit", "burst", str(burst), "latency", "50ms"]
    else:
        return "none"
    run(["tc", *where, "qdisc", "replace", "dev", dev, "root", *spec])
    return " ".join(spec)


class NetnsWan:
    """The namespace, its veth pair and addresses; `shape()` is applied after seeding data."""

    def __init__(self, cleanup: Cleanup, workdir: Path, settings: WanSettings) -> None:
        _remove_stale_namespaces()
        self.settings = settings
        self.ns = f"{_NS_PREFIX}{os.getpid()}"
        self.host_dev, self.ns_dev = f"ltw{os.getpid()}h", f"ltw{os.getpid()}n"
        net = _pick_subnet()
        self.host_ip, self.ns_ip = str(net.network_address + 1), str(net.network_address + 2)
        run(["ip", "netns", "add", self.ns])
        cleanup.push(f"delete namespace {self.ns}", self._del_ns)
        run(["ip", "link", "add", self.host_dev, "type", "veth", "peer", "name", self.ns_dev])
        cleanup.push(f"delete veth {self.host_dev}", self._del_link)
        run(["ip", "link", "set", self.ns_dev, "netns", self.ns])
        run(["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_dev])
        run(["ip", "link", "set", self.host_dev, "up"])
        run(["ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_dev])
        run(["ip", "-n", self.ns, "link", "set", self.ns_dev, "up"])
        run(["ip", "-n", self.ns, "link", "set", "lo", "up"])
        route = run(["ip", "-o", "route", "get", self.ns_ip]).stdout
        if f"dev {self.host_dev}" not in route:  # never let load leak to a real interface
            raise RuntimeError(f"{self.ns_ip} does not route over {self.host_dev}: {route}")
        self.netem = _netem_available(self.host_dev)
        self.exec = ["ip", "netns", "exec", self.ns]

    def _del_ns(self) -> None:
        run(["ip", "netns", "del", self.ns])

    def _del_link(self) -> None:
        if Path(f"/sys/class/net/{self.host_dev}").exists():
            run(["ip", "link", "del", self.host_dev])

    def shape(self) -> str:
        out = _tc_shape(None, self.host_dev, self.settings, self.netem)
        _tc_shape(self.ns, self.ns_dev, self.settings, self.netem)
        return out


def _moto_kind(settings: WanSettings) -> str:
    if settings.stock_moto:
        return (
            "stock moto (a ranged GET reads the whole object, a list page sorts every key; "
            "seeded over HTTP)"
        )
    return (
        "moto with ranged GETs reading only their range and list pages costing a page, "
        "seeded in its own process (loadtest.moto_origin)"
    )


def start_server(
    cleanup: Cleanup,
    workdir: Path,
    prefix: list[str],
    host: str,
    port: int,
    settings: WanSettings,
    own_netns: bool,
) -> tuple[int, str]:
    """The chosen S3 server listening on host:port: its PID and what it is."""
    if settings.origin == "seaweedfs":
        server = start_seaweedfs(cleanup, workdir, prefix, host, port, own_netns)
    elif settings.origin == "rclone":
        server = start_rclone(cleanup, workdir, prefix, host, port)
    elif settings.origin == "moto":
        return _start_moto(cleanup, workdir, prefix, host, port, settings.stock_moto), (
            _moto_kind(settings)
        )
    else:
        raise ValueError(f"unknown origin {settings.origin!r}")
    return server.pid, f"{server.description}, seeded by PUTs over HTTP"


def can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def start_origin(
    cleanup: Cleanup, workdir: Path, settings: WanSettings
) -> tuple[Origin, Callable[[], None]]:
    """Start the origin behind the WAN; returns it and a `shape` callable for after seeding.

    Shaping waits until the data is in: seeding thousands of objects through a 20 ms RTT
    would only make the harness slow, not the measurement truer.
    """
    mode = settings.mode
    if mode == "auto":
        mode = "netns" if can_make_namespaces() else "proxy"
    rate = rate_bps(settings.rate) or None
    if mode == "netns":
        wan = NetnsWan(cleanup, workdir, settings)
        pid, kind = start_server(
            cleanup, workdir, wan.exec, wan.ns_ip, _ORIGIN_PORT, settings, own_netns=True
        )
        seed = f"http://{wan.ns_ip}:{_ORIGIN_PORT}"
        if wan.netem:
            origin = Origin(seed, seed, pid, "", None, None, kind=settings.origin)
            origin._rx_counter = Path(f"/sys/class/net/{wan.host_dev}/statistics/rx_bytes")
        else:
            listen, stats = f"{wan.ns_ip}:{_WAN_PORT}", f"{wan.ns_ip}:{_STATS_PORT}"
            proxy_pid = _start_proxy(
                cleanup,
                workdir,
                wan.exec,
                listen,
                f"{wan.ns_ip}:{_ORIGIN_PORT}",
                stats,
                settings,
                None,
            )
            origin = Origin(
                f"http://{listen}", seed, pid, "", f"http://{stats}/", None, proxy_pid,
                settings.origin,
            )  # fmt: skip

        def shape() -> None:
            spec = wan.shape()
            how = (
                f"tc netem on both veth ends: {spec}"
                if wan.netem
                else f"kernel has no netem: tc {spec} on both veth ends for the rate, "
                f"{settings.rtt_ms:g} ms RTT added by loadtest.wan_proxy inside the namespace"
            )
            origin.description = (
                f"netns {wan.ns}, veth {wan.host_dev} {wan.host_ip} <-> {wan.ns_ip}; {how}; "
                f"origin: {kind}"
            )

        return origin, shape
    origin_port, wan_port, stats_port = free_port(), free_port(), free_port()
    pid, kind = start_server(
        cleanup, workdir, [], "127.0.0.1", origin_port, settings, own_netns=False
    )
    listen, stats = f"127.0.0.1:{wan_port}", f"127.0.0.1:{stats_port}"
    proxy_pid = _start_proxy(
        cleanup, workdir, [], listen, f"127.0.0.1:{origin_port}", stats, settings, rate
    )
    origin = Origin(
        f"http://{listen}",
        f"http://127.0.0.1:{origin_port}",
        pid,
        f"loopback delay proxy (loadtest.wan_proxy): {settings.rtt_ms:g} ms RTT, "
        f"rate {settings.rate} paced in user space; origin: {kind}",
        f"http://{stats}/",
        None,
        proxy_pid,
        settings.origin,
    )
    return origin, lambda: None
