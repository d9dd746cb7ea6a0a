"""Preload jobs on one node (SQLite), through the command line and the HTTP API: the progress
bar in a pseudo-terminal, JSON for scripts, Ctrl-C, admin keys, a client's miss ahead of
queued preload work, a job larger than the cache, and --pin under cache pressure."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.jobs.model import STATES
from tests.support.gateway import (
    ACCESS_KEY,
    BIN,
    SECRET_KEY,
    GatewayNode,
    _env,
    start_gateway,
)
from tests.support.net import eventually
from tests.support.origin import CountingProxy

ORIGIN = "origin-jobs-node"
KiB, MiB = 1 << 10, 1 << 20


def blob(n: int, seed: str) -> bytes:
    block = hashlib.sha256(seed.encode()).digest() * 64
    return (block * (n // len(block) + 1))[:n]


@pytest.fixture(scope="module")
def dataset(origin_s3: Any) -> dict[str, bytes]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    data = {f"ds/{i:03d}": blob(16 * KiB, f"ds/{i}") for i in range(40)}
    data.update({f"slow/{i:03d}": blob(16 * KiB, f"slow/{i}") for i in range(20)})
    data.update({f"big/{i}": blob(3 * MiB // 2, f"big/{i}") for i in range(3)})
    data.update({f"other/{i}": blob(MiB, f"other/{i}") for i in range(4)})
    data["pin/kept"] = blob(MiB // 2, "pin/kept")
    for key, body in data.items():
        origin_s3.put_object(Bucket=ORIGIN, Key=key, Body=body)
    return data


def mounted(node: GatewayNode, origin: CountingProxy) -> GatewayNode:
    node.cli(
        "mount", "add", "data", f"s3://{ORIGIN}", "-o", f"endpoint_url={origin.url}",
        "-o", "access_key=origin-ak", "-o", "secret_key=origin-sk", "-o", "metadata_ttl=600",
    )  # fmt: skip
    eventually(lambda: "data" in node.buckets())
    return node


@pytest.fixture(scope="module")
def node(
    module_dir: Path, origin: CountingProxy, dataset: dict[str, bytes]
) -> Iterator[GatewayNode]:
    n = start_gateway(module_dir / "n", args=("--cache-block-size", "1MiB"))
    try:
        yield mounted(n, origin)
    finally:
        n.stop()


@pytest.fixture
def small_node(
    tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes]
) -> Iterator[GatewayNode]:
    """A node whose cache holds 2 MiB."""
    args = ("--cache-block-size", "1MiB", "--cache-capacity", "2MiB", "--cache-memory", "0")
    n = start_gateway(tmp_path / "small", args=args)
    try:
        yield mounted(n, origin)
    finally:
        n.stop()


def cli_args(node: GatewayNode, *args: str) -> list[str]:
    return [str(BIN / "gateway"), *args, "--data-dir", str(node.data_dir)]


# A command typed at a shell runs with Ctrl-C at its default; one started in the background
# inherits SIGINT ignored, and rightly goes on ignoring it. The suite may itself run in the
# background (`scripts/test &`, a CI runner), so the commands Ctrl-C is sent to are started
# as a shell starts a foreground command: SIGINT back to its default, then exec.
_FOREGROUND = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);"
    " os.execv(sys.argv[1], sys.argv[1:])"
)


def foreground(args: list[str]) -> list[str]:
    return [sys.executable, "-c", _FOREGROUND, *args]


class Terminal:
    """A command on a pseudo-terminal, as a person runs it."""

    def __init__(self, args: list[str]) -> None:
        self.master, slave = pty.openpty()
        env = _env({"COLUMNS": "160", "LINES": "40", "TERM": "xterm-256color"})
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env)
        os.close(slave)
        self.output = b""

    def read(self, timeout: float = 0.1) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            try:
                self.output += os.read(self.master, 65536)
            except OSError as exc:  # EIO: the other end closed
                if exc.errno != errno.EIO:
                    raise

    def until(self, text: bytes, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert time.monotonic() < deadline, self.output.decode(errors="replace")
            self.read()

    def finish(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, self.output.decode(errors="replace")
            self.read()
        self.read(0)
        os.close(self.master)
        return self.proc.returncode


def test_load_in_a_terminal_shows_a_live_progress_bar(node: GatewayNode) -> None:
    term = Terminal(cli_args(node, "load", "data/ds/"))
    assert term.finish() == 0
    out = term.output.decode(errors="replace")
    assert "━" in out and "objects" in out  # rich's bar and the objects column
    assert "40/40 objects" in out
    assert "done: loaded 40 objects, 640.0 KiB" in out


def test_json_output_for_scripts(node: GatewayNode) -> None:
    out = node.cli("load", "data/ds/", "--include", "00*", "--detach", "--format", "json")
    submitted = json.loads(out.stdout)
    # The job as it stands when read back: the node may have begun listing it already.
    assert submitted["state"] in STATES and submitted["options"]["include"] == ["00*"]
    waited = node.cli("jobs", "wait", str(submitted["id"]), "--format", "json")
    ended = json.loads(waited.stdout)
    assert ended["state"] == "done" and ended["total_objects"] == 10  # ds/000 ... ds/009
    listed = json.loads(node.cli("jobs", "list", "--format", "json").stdout)
    assert submitted["id"] in [j["id"] for j in listed]


def test_the_api_takes_an_admin_key_and_refuses_others(node: GatewayNode) -> None:
    endpoint = ("--endpoint", node.url, "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY)
    out = node.cli("load", "data/ds/", "--exclude", "00*", *endpoint, "--format", "json")
    done = json.loads(out.stdout)
    assert done["state"] == "done" and done["submitted_by"] == ACCESS_KEY
    assert done["total_objects"] == 30
    shown = node.cli("jobs", "show", str(done["id"]), *endpoint).stdout
    assert f"job {done['id']}: load s3://data/ds/" in shown and "state:      done" in shown

    key = node.cli("keys", "create").stdout.split()
    plain = ("--endpoint", node.url, "--access-key", key[2], "--secret-key", key[5])
    refused = node.cli("jobs", "list", *plain, check=False)
    assert refused.returncode == 1 and "is not an admin key" in refused.stderr
    assert httpx.get(node.url + "/_gateway/jobs").status_code == 403  # unsigned

    # Signed, but the body is not the one signed.
    url = node.url + "/_gateway/jobs"
    request = AWSRequest("POST", url, data=b'{"bucket": "data"}', headers={})
    request.context["payload_signing_enabled"] = True
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    swapped = httpx.post(url, content=b'{"bucket": "data", "prefix": "x"}',
                         headers=dict(request.headers.items()))  # fmt: skip
    assert swapped.status_code == 403
    metrics = httpx.get(node.url + "/metrics").text
    assert 'gateway_jobs{state="done"}' in metrics
    assert node.metric("gateway_job_bytes_loaded") > 0


def test_ctrl_c_in_a_terminal_asks_and_can_cancel(node: GatewayNode) -> None:
    term = Terminal(foreground(cli_args(node, "load", "data/slow/", "--bandwidth", "8KiB/s")))
    term.until(b"objects")
    term.proc.send_signal(signal.SIGINT)
    term.until(b"cancel it, or detach from it?")
    os.write(term.master, b"cancel\n")
    assert term.finish() == 4  # cancelled
    jobs = json.loads(node.cli("jobs", "list", "--format", "json").stdout)
    assert jobs[0]["prefix"] == "slow/" and jobs[0]["state"] == "cancelled"


def test_ctrl_c_without_a_terminal_detaches(node: GatewayNode) -> None:
    proc = subprocess.Popen(
        foreground(cli_args(node, "load", "data/slow/", "--bandwidth", "1KiB/s", "--refresh")),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env({}),
    )  # fmt: skip

    def running() -> dict[str, Any]:
        jobs = json.loads(node.cli("jobs", "list", "--format", "json").stdout)
        assert jobs[0]["options"]["refresh"] and jobs[0]["state"] == "running"
        return dict(jobs[0])

    started = eventually(running, timeout=30)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and b"detached" in err
    assert node.job(started["id"])["state"] == "running"  # it goes on without us
    node.cli("jobs", "cancel", str(started["id"]))
    assert node.job(started["id"])["state"] == "cancelled"


def test_a_clients_miss_is_served_ahead_of_queued_preload_work(
    tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    n = mounted(start_gateway(tmp_path / "n", args=("--cache-block-size", "1MiB")), origin)
    try:
        origin.reset()
        # Slow enough (two seconds an object: the node's rate, which its worker holding the
        # job's one share has whole) that the looks and the GET below, which may take seconds
        # on a busy machine, do not outlast the job's queue.
        out = n.cli("load", "data/slow/", "--concurrency", "1", "--bandwidth", "8KiB/s",
                    "--detach", "--format", "json")  # fmt: skip
        job_id = json.loads(out.stdout)["id"]
        eventually(lambda: n.job(job_id)["loaded_objects"] >= 1, timeout=30)
        last = "slow/019"
        body = n.client().get_object(Bucket="data", Key=last)["Body"].read()
        assert body == dataset[last]
        eventually(lambda: n.job(job_id)["state"] == "done", timeout=120)
        with origin._lock:
            order = [
                r.path.rsplit("/", 2)[-2] + "/" + r.path.rsplit("/", 1)[-1]
                for r in origin.requests
                if r.method == "GET" and "/slow/" in r.path
            ]
        # The client's read went out before the preload's queue had got near it, and the
        # job found it cached afterwards: every object fetched once.
        assert order.index(last) < order.index("slow/010")
        assert sorted(order) == sorted(set(order)) and len(order) == 20
    finally:
        n.stop()


def test_a_throttled_jobs_waits_end_at_its_cancel_and_at_its_nodes_stop(
    tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    """Found by trying: a job at a low --bandwidth holds each slot in its bucket's wait (a
    1 MiB object at 1 KiB/s: ~17 minutes). A cancel left those waits to run out, and a node's
    stop waited its grace of 5 s for them, then cancelled the share without writing it down.
    Both now end the waits at once: the cancelled job's share ends, and a stopped node hands
    its share back (for its restart) as it does for loads in flight."""
    n = mounted(start_gateway(tmp_path / "n"), origin)
    waits = tmp_path / "n" / "cache" / "job-bandwidth"

    def throttled() -> int:
        out = n.cli("load", "data/other/", "--bandwidth", "1KiB/s", "--refresh", "--detach",
                    "--format", "json")  # fmt: skip
        job_id = int(json.loads(out.stdout)["id"])
        eventually(lambda: (waits / str(job_id)).exists(), timeout=30)  # a slot took its bytes
        return job_id

    try:
        cancelled = throttled()
        n.cli("jobs", "cancel", str(cancelled))
        eventually(lambda: f"job {cancelled} batch 0: the job is no longer active" in n.log())
        stopped = throttled()
    finally:
        assert n.stop(wait=60)
    assert f"job {stopped} batch 0: the node is stopping" in n.log()


def test_a_jobs_files_on_the_node_go_when_it_ends(
    tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    """Found by trying: each job left its usage count and bandwidth bucket under the cache
    folder for good, and a cache that outlived its database (SQLite replaced, a move to
    PostgreSQL) gave a new job of the same id the old one's count. A job's files go with its
    end; those of jobs the database does not have as active are swept at the start."""
    cache = tmp_path / "n" / "cache"
    stale = cache / "job-usage" / "7"  # a count a database before this one left
    stale.parent.mkdir(parents=True)
    stale.write_text(str(10 * MiB).rjust(20))
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    n = mounted(start_gateway(tmp_path / "n"), origin)
    try:
        eventually(lambda: not stale.exists())
        out = n.cli("load", "data/ds/00", "--bandwidth", "64MiB/s", "--format", "json")
        job = json.loads(out.stdout)
        assert job["state"] == "done" and job["total_objects"] == 10, job
        files = [cache / folder / str(job["id"]) for folder in ("job-usage", "job-bandwidth")]
        eventually(lambda: not any(f.exists() for f in files))
    finally:
        n.stop()


def test_a_job_larger_than_the_cache_ends_partial(small_node: GatewayNode) -> None:
    out = small_node.cli("load", "data/big/", "--format", "json", check=False)
    ended = json.loads(out.stdout)
    assert out.returncode == 3 and ended["state"] == "partial", ended
    assert "full" in ended["message"] and "of 4.5 MiB loaded" in ended["message"], ended
    loaded = ended["loaded_bytes"]
    assert 0 < loaded <= 2 * MiB, ended
    # What it loaded is still there: it made no room for more of itself.
    verify = json.loads(small_node.cli("load", "data/big/", "--verify", "--format", "json").stdout)
    assert verify["cached_bytes"] == loaded, (ended, verify)


def test_pinned_data_survives_cache_pressure(
    small_node: GatewayNode, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    out = small_node.cli("load", "data/pin/", "--pin", "--format", "json")
    assert json.loads(out.stdout)["state"] == "done"
    s3 = small_node.client()
    for i in range(4):  # 4 MiB through a 2 MiB cache
        assert s3.get_object(Bucket="data", Key=f"other/{i}")["Body"].read()
    eventually(lambda: small_node.metric("gateway_cache_evictions") >= 2, timeout=30)
    origin.reset()
    assert s3.get_object(Bucket="data", Key="pin/kept")["Body"].read() == dataset["pin/kept"]
    assert origin.count("GET", "/pin/") == 0


def test_a_job_fills_only_the_room_beside_pinned_data(
    small_node: GatewayNode, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    # 0.5 MiB pinned in a 2 MiB cache: 1.5 MiB (with checksums, a little more) of big/ would
    # not fit beside it, and the job would evict its own blocks to make room for more.
    out = small_node.cli("load", "data/pin/", "--pin", "--format", "json")
    assert json.loads(out.stdout)["state"] == "done"
    eventually(lambda: small_node.metric("gateway_cache_pinned_bytes") >= MiB // 2, timeout=30)
    out = small_node.cli("load", "data/big/", "--format", "json", check=False)
    ended = json.loads(out.stdout)
    assert out.returncode == 3 and ended["state"] == "partial", ended
    loaded = ended["loaded_bytes"]
    assert 0 < loaded <= 2 * MiB - MiB // 2, ended
    verify = json.loads(small_node.cli("load", "data/big/", "--verify", "--format", "json").stdout)
    assert verify["cached_bytes"] == loaded, (ended, verify)
    origin.reset()
    assert (
        small_node.client().get_object(Bucket="data", Key="pin/kept")["Body"].read()
        == (dataset["pin/kept"])
    )
    assert origin.count("GET", "/pin/") == 0


@pytest.fixture
def fresh_node(
    tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes]
) -> Iterator[GatewayNode]:
    n = start_gateway(tmp_path / "fresh", args=("--cache-block-size", "1MiB"))
    try:
        yield mounted(n, origin)
    finally:
        n.stop()


def test_metadata_only_learns_versions_and_loads_no_bytes(
    fresh_node: GatewayNode, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    origin.reset()
    out = fresh_node.cli("load", "data/ds/", "--metadata-only", "--format", "json")
    ended = json.loads(out.stdout)
    assert (ended["state"], ended["objects_done"]) == ("done", 40), ended
    assert origin.count("HEAD", "/ds/") == 40 and origin.count("GET", "/ds/") == 0
    origin.reset()
    body = fresh_node.client().get_object(Bucket="data", Key="ds/007")["Body"].read()
    assert body == dataset["ds/007"]
    assert origin.count("HEAD") == 0  # the version was known: only the bytes were fetched


def test_refresh_reloads_what_changed_and_without_it_the_job_says_so(
    fresh_node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    for i in range(3):
        origin_s3.put_object(Bucket=ORIGIN, Key=f"ref/{i}", Body=blob(KiB, f"ref/{i}"))
    assert (
        json.loads(fresh_node.cli("load", "data/ref/", "--format", "json").stdout)["state"]
        == "done"
    )
    new = blob(KiB, "ref/1 again")
    origin_s3.put_object(Bucket=ORIGIN, Key="ref/1", Body=new)  # behind the gateway's back
    out = fresh_node.cli("load", "data/ref/", "--format", "json", check=False)
    stale = json.loads(out.stdout)
    assert out.returncode == 3 and "1 objects changed" in stale["message"], stale
    s3 = fresh_node.client()
    assert s3.get_object(Bucket="data", Key="ref/1")["Body"].read() != new  # its TTL runs
    out = fresh_node.cli("load", "data/ref/", "--refresh", "--format", "json")
    assert json.loads(out.stdout)["state"] == "done"
    origin.reset()
    assert s3.get_object(Bucket="data", Key="ref/1")["Body"].read() == new
    assert origin.count("GET", "/ref/") == 0  # the new version was loaded, and known
