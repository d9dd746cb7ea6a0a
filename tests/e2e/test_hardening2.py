"""Hardening, second round (issue 23), from outside: another user of the host reads nothing of
the node's data dir (only the short-circuit socket lets it in), ..."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from tests.support.gateway import ACCESS_KEY, BIN, SECRET_KEY, GatewayNode, run_cli, start_gateway

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # one a second user may run (not a shim in /root)
# What a second user of the host tries on each path it is given: list a folder, read a file,
# connect to a socket (whose first message says whether it was let in).
_PROBE = r"""
import json, os, socket, stat, sys
got = {}
for path in json.load(sys.stdin):
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        got[path] = "stat: " + exc.strerror
        continue
    try:
        if stat.S_ISDIR(mode):
            got[path] = "listed %d" % len(os.listdir(path))
        elif stat.S_ISSOCK(mode):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(path)
            head = s.recv(4)
            got[path] = "socket: " + s.recv(int.from_bytes(head, "big")).decode()
        else:
            with open(path, "rb") as f:
                got[path] = "read %r" % f.read(24)
    except OSError as exc:
        got[path] = "refused: " + exc.strerror
print(json.dumps(got))
"""


def _as_nobody(*cmd: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A folder any user of the host may pass through (pytest's own are 0700, which would
    hide the node's data dir from a second user whatever the node did)."""
    path = Path(tempfile.mkdtemp(prefix="gw-hardening2-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _s3(node: GatewayNode) -> object:
    return boto3.client(
        "s3", endpoint_url=node.url, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )  # fmt: skip


def test_a_second_user_of_the_host_reads_nothing_under_the_data_dir(host_dir: Path) -> None:
    files = host_dir / "files"
    files.mkdir()
    (files / "secret.txt").write_bytes(b"TENANT-SECRET " * 100)
    data = host_dir / "data"
    # What an older version left: a readable data dir, a readable cache file and folder.
    (data / "cache" / "old").mkdir(parents=True)
    (data / "cache" / "old" / "block").write_bytes(b"OLD-CACHED-BLOCK")
    for path in (data, data / "cache", data / "cache" / "old"):
        path.chmod(0o755)
    (data / "cache" / "old" / "block").chmod(0o644)
    own_key = {"GATEWAY_ENCRYPTION_KEY": ""}  # the node makes <data>/secret.key
    run_cli(data, None, "mount", "add", "files", files.as_uri(), env=own_key)
    node = start_gateway(data, args=("--workers", "1"), env=own_key)
    try:
        s3 = _s3(node)
        assert s3.get_object(Bucket="files", Key="secret.txt")["Body"].read().startswith(b"TENANT")  # type: ignore[attr-defined]
        assert s3.put_object(Bucket="files", Key="new.txt", Body=b"NEW " * 50)  # type: ignore[attr-defined]
        assert s3.get_object(Bucket="files", Key="new.txt")["Body"].read() == b"NEW " * 50  # type: ignore[attr-defined]
        # Every path under the data dir, as the node sees it.
        paths = [str(data)]
        for root, dirs, names in os.walk(data):
            paths += [os.path.join(root, n) for n in dirs + names]
        blocks = [p for p in paths if "/cache/" in p and os.path.isfile(p)]
        assert any(Path(p).read_bytes().startswith(b"TENANT") for p in blocks), "no block"
        assert any(p.endswith("gateway.db") for p in paths) and any(
            p.endswith("secret.key") for p in paths
        )
        probe = _as_nobody(
            SYSTEM_PYTHON, "-c", _PROBE, stdin=json.dumps(paths)
        )
        assert probe.returncode == 0, probe.stderr
        got: dict[str, str] = json.loads(probe.stdout)
        sock = str(data / "gateway.sock")
        # The short-circuit socket is the one way in, and it is the node who says no.
        assert '"scope":"uid"' in got.pop(sock)
        leaked = {p: r for p, r in got.items() if not r.startswith(("refused", "stat"))}
        assert leaked == {}
        for path in paths:
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if path == sock or os.path.islink(path):
                continue
            expected = 0o711 if path == str(data) else 0o700 if os.path.isdir(path) else 0o600
            assert mode & 0o077 == expected & 0o077, (path, oct(mode))
    finally:
        node.stop()


def test_a_node_that_cannot_make_its_data_dir_private_says_so(host_dir: Path) -> None:
    data = host_dir / "data"
    data.mkdir()
    data.chmod(0o755)  # root's, readable by all: a process of another uid cannot repair it
    out = _as_nobody(
        str(BIN / "gateway"), "serve", "--data-dir", str(data), "--port", "1", "--workers", "1"
    )
    assert out.returncode != 0
    assert f"{data} is mode 0755" in out.stderr and "chmod -R go=" in out.stderr, out.stderr
