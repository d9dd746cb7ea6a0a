"""The harness ends every process it started, however a test ends: here a test that times
out while its gateway node (a supervisor and its workers) serves, under both of
pytest-timeout's methods (signal: an exception in the test; thread: os._exit of pytest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gateway import _running
from tests.support.net import eventually

ROOT = Path(__file__).resolve().parents[2]

TIMING_OUT = """
import json, os, time
from pathlib import Path

import pytest

from tests.support.gateway import start_gateway


@pytest.fixture
def node(tmp_path):
    node = start_gateway(tmp_path / "node", args=("--workers", "2"))
    node.wait_workers()
    yield node
    node.stop()


def test_times_out(node):
    Path(os.environ["PIDS_FILE"]).write_text(json.dumps([node.proc.pid, *node.workers()]))
    time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["signal", "thread"])
def test_a_timed_out_test_leaves_no_process_it_started(tmp_path: Path, method: str) -> None:
    (tmp_path / "test_inner.py").write_text(TIMING_OUT)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    pids_file = tmp_path / "pids.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIDS_FILE": str(pids_file)}
    out = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
            "--basetemp", str(tmp_path / "inner"), "--timeout", "5",
            "-o", f"timeout_method={method}", "-o", "timeout_func_only=true",
            str(tmp_path / "test_inner.py"),
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert "Timeout" in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
    started = json.loads(pids_file.read_text())
    assert len(started) == 3, started  # the node and its two workers
    # The thread method's os._exit leaves the reaper to end them, a moment after pytest.
    eventually(lambda: not any(_running(pid) for pid in started), timeout=15)


def test_a_cleanup_left_registered_runs_when_the_test_process_dies(tmp_path: Path) -> None:
    """What is no process of the harness's (a container) is ended by its registered command,
    even when the process that registered it ends by os._exit: the reaper runs it."""
    left, done = tmp_path / "left", tmp_path / "done"
    script = (
        "import os\n"
        "from tests.support import procs\n"
        f"procs.cleanup_at_end('left', ['touch', {str(left)!r}])\n"
        f"procs.cleanup_at_end('done', ['touch', {str(done)!r}])\n"
        "procs.ended('done')\n"
        "os._exit(1)\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=60)
    eventually(left.exists, timeout=15)
    assert not done.exists()
