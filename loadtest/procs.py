"""Processes the harness starts, and undoing everything it set up, even on Ctrl-C or error.

Every server and namespace is registered with one `Cleanup` as it is made; the cleanup runs
from `finally`, from atexit and on SIGTERM/SIGHUP, and ends processes by PID only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

_TICKS = os.sysconf("SC_CLK_TCK")


class Cleanup:
    """A stack of undo actions, run once, newest first."""

    def __init__(self) -> None:
        self._actions: list[tuple[str, Callable[[], None]]] = []
        self._done = False
        atexit.register(self.run)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        # A shell starts background jobs with SIGINT ignored; Ctrl-C (or kill -INT) must still
        # stop the run and clean up.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # SystemExit unwinds through every `finally`, as Ctrl-C's KeyboardInterrupt does.
        raise SystemExit(128 + signum)

    def push(self, what: str, action: Callable[[], None]) -> None:
        self._actions.append((what, action))

    def run(self) -> None:
        if self._done:
            return
        self._done = True
        # Ctrl-C pressed again while cleaning must not leave namespaces behind.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            while self._actions:
                what, action = self._actions.pop()
                try:
                    action()
                except Exception as exc:
                    print(f"cleanup: {what}: {exc}")
        finally:
            signal.signal(signal.SIGINT, old)

    def spawn(
        self,
        name: str,
        cmd: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `cmd` with output to `log_path`; it is stopped (by its PID) at cleanup."""
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                list(cmd),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the harness only; it stops them in order
            )
        self.push(f"stop {name} (pid {proc.pid})", lambda: stop_process(proc))
        return proc


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=120)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 60.0) -> None:
    """Poll `url` until it answers with any HTTP status, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                resp.read()
            return
        except urllib.error.HTTPError:
            return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout}s: {last}")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                tree.setdefault(ppid, []).append(int(entry))
    return tree


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` and its live descendants (nginx workers, say), and
    of the children they have reaped (a worker that died and was forked again)."""
    tree = _children()
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(tree.get(p, []))
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            # utime, stime, cutime, cstime: fields 14-17 of proc(5)
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / _TICKS


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / _TICKS, sum(fields[:8]) / _TICKS


@dataclass(frozen=True, slots=True)
class CpuUse:
    """CPU over one measurement: the server's in cores (1.0 = one core), the machine's in %,
    and the CPU seconds of each watched group of processes (`CpuMeter`'s `watch`)."""

    server_cores: float
    machine_pct: float
    seconds: Mapping[str, float | None] = field(default_factory=dict)

    def per_request(self, requests: int) -> dict[str, float | str]:
        """`<group> us/req`: each watched group's CPU microseconds per request ("-" for a
        group with no process in this measurement)."""
        out: dict[str, float | str] = {}
        for name, secs in self.seconds.items():
            out[f"{name} us/req"] = secs / requests * 1e6 if requests and secs is not None else "-"
        return out


class CpuMeter:
    """Reads the server's and the machine's CPU counters around a measurement, and those of
    the processes in `watch` (name -> PID, and its descendants; None: no such process in
    this measurement), such as the gateway, the origin and the WAN proxy."""

    def __init__(self, pid: int | None, watch: Mapping[str, int | None] | None = None) -> None:
        self._pid = pid
        self._watch = dict(watch or {})
        self._t0 = time.monotonic()
        self._cpu0 = cpu_seconds(pid) if pid else 0.0
        self._watch0 = {n: cpu_seconds(p) for n, p in self._watch.items() if p}
        self._busy0, _ = machine_busy_seconds()

    def stop(self) -> CpuUse:
        wall = max(time.monotonic() - self._t0, 1e-9)
        cpu = cpu_seconds(self._pid) - self._cpu0 if self._pid else 0.0
        busy, _ = machine_busy_seconds()
        seconds = {
            n: cpu_seconds(p) - self._watch0[n] if p else None for n, p in self._watch.items()
        }
        pct = 100.0 * (busy - self._busy0) / (wall * (os.cpu_count() or 1))
        return CpuUse(round(cpu / wall, 2), round(min(pct, 100.0), 1), seconds)
