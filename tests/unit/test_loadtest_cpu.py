"""What loadtest's rows say about who did the work: the CPU of a process and of the children it
has reaped, CPU per request of each watched process, and the origin requests the WAN proxy
counts on connections that carry many of them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from loadtest.procs import CpuMeter, CpuUse, cpu_seconds
from loadtest.report import Report, format_markdown
from loadtest.wan_proxy import HeadCounter

# A child that burns 0.4 s of CPU (process time, whatever the machine's load) and is reaped
# by its parent, which then says so and waits to be stopped.
_PARENT = """
import subprocess, sys
spin = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass"
subprocess.run([sys.executable, "-c", spin], check=True)
print("reaped", flush=True)
sys.stdin.read()
"""


def test_cpu_of_a_process_counts_the_children_it_has_reaped() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        meter = CpuMeter(None, {"server": parent.pid, "absent": None})
        assert parent.stdout is not None
        assert parent.stdout.readline() == b"reaped\n"
        # The child is gone from /proc; its CPU is in the parent's cutime/cstime.
        assert cpu_seconds(parent.pid) >= 0.35
        use = meter.stop()
        assert use.seconds["absent"] is None
        server = use.seconds["server"]
        assert server is not None and server >= 0.35
    finally:
        parent.kill()
        parent.wait()


def test_cpu_per_request_of_each_watched_process() -> None:
    use = CpuUse(0.5, 50.0, {"gateway": None, "origin": 0.002, "WAN proxy": 0.0005})
    cells = use.per_request(10)
    assert cells == {"gateway us/req": "-", "origin us/req": 200.0, "WAN proxy us/req": 50.0}
    assert use.per_request(0)["origin us/req"] == "-"


def test_request_heads_are_counted_across_chunks_of_one_connection() -> None:
    heads = HeadCounter()
    first = b"GET /a HTTP/1.1\r\nHost: o\r\n\r"
    second = b"\nGET /b HTTP/1.1\r\nHost: o\r\n\r\nGET /c HTTP/1.1\r\n"
    third = b"Range: bytes=0-9\r\n\r\n"
    assert [heads.feed(first), heads.feed(second), heads.feed(third)] == [0, 2, 1]


def test_markdown_report_has_the_rows_cpu_columns() -> None:
    report = Report(scenario="epochs", columns=["path", "origin us/req", "WAN proxy us/req"])
    report.add(path="direct", **{"origin us/req": 512.5, "WAN proxy us/req": "-"})
    report.ratios["gateway cold / direct (objects/s)"] = 0.5
    text = format_markdown(report)
    assert "| path | origin us/req | WAN proxy us/req |" in text
    assert "| direct | 512 | - |" in text
    assert "- gateway cold / direct (objects/s): **0.50x**" in text


def test_a_meter_without_watched_processes_reports_none() -> None:
    meter = CpuMeter(os.getpid())
    time.sleep(0.01)
    assert meter.stop().seconds == {}
