"""Hardening, second round (issue 23), from outside: another user of the host reads nothing of
the node's data dir (only the short-circuit socket lets it in), ..."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from gateway.cache.layout import file_size
from gateway.s3.local import PER_UID
from tests.support.gateway import (
    ACCESS_KEY,
    BIN,
    SECRET_KEY,
    GatewayNode,
    run_cli,
    server_args,
    start_gateway,
)
from tests.support.net import eventually
from tests.support.postgres import temp_database

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


def _walk_with_block(data: Path, prefix: bytes) -> list[str] | None:
    """Every path under `data`, when a committed block among them starts with `prefix`."""
    paths = [str(data)]
    for root, dirs, names in os.walk(data):
        paths += [os.path.join(root, n) for n in dirs + names]
    for path in paths:
        if "/cache/blocks/" in path and os.path.isfile(path):
            with contextlib.suppress(FileNotFoundError):
                if Path(path).read_bytes().startswith(prefix):
                    return paths
    return None


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
        # Every path under the data dir, as the node sees it, once secret.txt's block is
        # committed: the client has its bytes before the fill's file is put into place (a
        # walk during the rename sees it in neither folder).
        paths = eventually(lambda: _walk_with_block(data, b"TENANT"))
        assert any(p.endswith("gateway.db") for p in paths) and any(
            p.endswith("secret.key") for p in paths
        )
        probe = _as_nobody(SYSTEM_PYTHON, "-c", _PROBE, stdin=json.dumps(paths))
        assert probe.returncode == 0, probe.stderr
        got: dict[str, str] = json.loads(probe.stdout)
        sock = str(data / "gateway.sock")
        # The short-circuit socket is the one way in, and it is the node who says no.
        assert '"scope":"uid"' in got.pop(sock)
        leaked = {p: r for p, r in got.items() if not r.startswith(("refused", "stat"))}
        assert leaked == {}
        for path in paths:
            try:
                mode = stat.S_IMODE(os.lstat(path).st_mode)
            except FileNotFoundError:
                continue  # a fill's or a write's file in inflight/, done since the walk
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
        str(BIN / "gateway"), "serve", "--data-dir", str(data), "--port", "1", "--workers", "1",
        *server_args(),
    )  # fmt: skip
    assert out.returncode != 0
    assert f"{data} is mode 0755" in out.stderr and "chmod -R go=" in out.stderr, out.stderr


# -- a module's node: policies, the short-circuit socket, the console -------------------------

CONSOLE = "/_gateway/console"


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    homes = module_dir / "homes"
    (homes / "home" / "alice").mkdir(parents=True)
    (homes / "home" / "alice" / "notes.txt").write_bytes(b"alice's notes")
    buckets = module_dir / "buckets"
    buckets.mkdir()
    args = ("--metadata-ttl", "-1", "--bucket-store", buckets.as_uri())
    node = start_gateway(module_dir / "node", args=args)
    node.cli("mount", "add", "homes", homes.as_uri())
    policy = module_dir / "home.json"
    policy.write_text(json.dumps(HOME_FOLDERS))
    node.cli("policies", "create", "home-folders", str(policy))
    for user in ("alice", "bob"):
        node.cli("users", "create", user, "--policy", "home-folders")
    eventually(lambda: "homes" in node.buckets())
    try:
        yield node
    finally:
        node.stop()


# AWS's documented home-folder policy.
HOME_FOLDERS = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": "arn:aws:s3:::homes",
            "Condition": {"StringLike": {"s3:prefix": ["home/${aws:username}/*"]}},
        },
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject"],
            "Resource": "arn:aws:s3:::homes/home/${aws:username}/*",
        },
    ],
}


def _key(node: GatewayNode, *args: str) -> tuple[str, str]:
    out = node.cli("keys", "create", *args).stdout
    return out.split("access key:")[1].split()[0], out.split("secret key:")[1].split()[0]


def _code(call: Callable[[], object]) -> str:
    try:
        call()
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])
    return "OK"


def test_the_home_folder_policy_gives_each_user_its_own_folder(node: GatewayNode) -> None:
    alice = node.client(*_key(node, "--user", "alice"))
    bob = node.client(*_key(node, "--user", "bob"))
    alice.put_object(Bucket="homes", Key="home/alice/a.txt", Body=b"mine")
    assert alice.get_object(Bucket="homes", Key="home/alice/a.txt")["Body"].read() == b"mine"
    listed = alice.list_objects_v2(Bucket="homes", Prefix="home/alice/")
    assert {o["Key"] for o in listed["Contents"]} == {"home/alice/a.txt", "home/alice/notes.txt"}
    # The variable is never its own text: bob cannot drop a file where alice would read it.
    put = lambda: bob.put_object(Bucket="homes", Key="home/${aws:username}/drop.txt", Body=b"x")  # noqa: E731
    assert _code(put) == "AccessDenied"
    assert _code(lambda: bob.get_object(Bucket="homes", Key="home/alice/a.txt")) == "AccessDenied"
    assert (
        _code(lambda: bob.list_objects_v2(Bucket="homes", Prefix="home/alice/")) == "AccessDenied"
    )
    bob.put_object(Bucket="homes", Key="home/bob/b.txt", Body=b"bob's")
    assert _code(lambda: alice.get_object(Bucket="homes", Key="home/bob/b.txt")) == "AccessDenied"


def test_a_policy_the_gateway_cannot_evaluate_is_refused(node: GatewayNode, tmp_path: Path) -> None:
    tagged = dict(HOME_FOLDERS)
    tagged["Statement"] = [
        {"Effect": "Allow", "Action": "s3:GetObject",
         "Resource": "arn:aws:s3:::homes/${aws:PrincipalTag/team}/*"},
    ]  # fmt: skip
    document = tmp_path / "tagged.json"
    document.write_text(json.dumps(tagged))
    out = node.cli("policies", "create", "tagged", str(document), check=False)
    assert out.returncode != 0 and "cannot evaluate" in out.stderr, out.stderr
    bucket_policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject",
                       "Resource": "arn:aws:s3:::homes/*",
                       "Condition": {"StringEquals": {"aws:PrincipalTag/x": "y"}}}],
    }  # fmt: skip
    admin = node.client()
    refused = _code(
        lambda: admin.put_bucket_policy(Bucket="homes", Policy=json.dumps(bucket_policy))
    )
    assert refused == "MalformedPolicy"


def _socket_worker(node: GatewayNode) -> int:
    """The worker process that serves the short-circuit socket (it holds its lock file)."""
    lock = str(node.data_dir / "gateway.sock.lock")
    for pid in node.workers():
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == lock:
                    return pid
    raise AssertionError("no worker holds the short-circuit socket")


def _greeting(sock: socket.socket) -> dict[str, Any]:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        assert chunk, "closed before its greeting"
        head += chunk
    body = b""
    while len(body) < int.from_bytes(head, "big"):
        body += sock.recv(int.from_bytes(head, "big") - len(body))
    answer: dict[str, Any] = json.loads(body)
    return answer


def _connect(node: GatewayNode) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(30)
    sock.connect(str(node.data_dir / "gateway.sock"))
    return sock


def test_a_connection_without_a_hello_is_closed(node: GatewayNode) -> None:
    with _connect(node) as sock:
        assert "nonce" in _greeting(sock)
        assert sock.recv(1) == b""  # the node hangs up (HELLO_TIMEOUT), nothing was sent


def test_one_uid_holds_at_most_its_share_of_connections(node: GatewayNode) -> None:
    held = []
    try:
        for _ in range(PER_UID):
            held.append(_connect(node))
            assert "nonce" in _greeting(held[-1])
        with _connect(node) as extra:
            refused = _greeting(extra)
            assert refused["error"] == "SlowDown" and refused["scope"] == "connection"
    finally:
        for sock in held:
            sock.close()
    with _connect(node) as sock:
        assert "nonce" in _greeting(sock)


def test_the_socket_survives_running_out_of_descriptors(node: GatewayNode) -> None:
    pid = _socket_worker(node)
    limits = subprocess.run(
        ["prlimit", f"--pid={pid}", "--nofile", "--output=SOFT,HARD", "--noheadings"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    open_now = len(os.listdir(f"/proc/{pid}/fd"))
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={open_now + 4}:{limits[1]}"], check=True)
    held = []
    try:
        for _ in range(12):  # more than the worker may open: accept() meets EMFILE
            held.append(_connect(node))
        eventually(lambda: "cannot accept a connection" in node.log(), timeout=30)
    finally:
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={limits[0]}:{limits[1]}"], check=True)
        for sock in held:
            sock.close()
    # The accept loop lives on: a new connection is greeted.
    with _connect(node) as sock:
        assert "nonce" in _greeting(sock)
    s3 = node.client()
    assert s3.list_objects_v2(Bucket="homes")["KeyCount"] >= 1


def _console(node: GatewayNode, address: str = "127.0.0.1") -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=node.url + CONSOLE, timeout=30, transport=transport)


def _sign_in(client: httpx.Client, access_key: str, secret_key: str) -> httpx.Response:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
    assert found is not None
    form = {"csrf": found.group(1), "access_key": access_key, "secret_key": secret_key}
    return client.post("/login", data=form)


def test_wrong_secrets_for_the_admin_key_never_lock_out_its_right_secret(
    node: GatewayNode,
) -> None:
    admin_key, admin_secret = _key(node, "--admin", "--description", "guessed at")
    with _console(node, "127.0.0.2") as guesser:
        answers = [_sign_in(guesser, admin_key, f"wrong-{i}").status_code for i in range(20)]
        # Five failures, whichever worker answered each, and then no more tries from there.
        assert answers[:5] == [401] * 5 and set(answers[5:]) == {429}, answers
        assert _sign_in(guesser, admin_key, admin_secret).status_code == 429
    with _console(node, "127.0.0.3") as admin:
        assert _sign_in(admin, admin_key, admin_secret).status_code == 303
        assert admin.get("/fleet").status_code == 200


@pytest.mark.parametrize("path", ["/", "/fleet", "/static/console.css", "/nowhere", "/login"])
def test_every_console_answer_has_the_security_headers(node: GatewayNode, path: str) -> None:
    with _console(node) as client:
        answer = client.get(path)
    assert answer.status_code in {200, 303, 404}
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert answer.headers["referrer-policy"] == "same-origin"


def test_logout_ends_a_copied_session(node: GatewayNode) -> None:
    with _console(node) as client:
        assert _sign_in(client, ACCESS_KEY, SECRET_KEY).status_code == 303
        copied = client.cookies.get("gateway_console")
        assert copied
        found = re.search(r'name="csrf" value="([^"]+)"', client.get("/fleet").text)
        token = found.group(1) if found else ""
        assert client.post("/logout", data={"csrf": token}).status_code == 303
    for _ in range(4):  # whichever worker answers
        with _console(node) as thief:
            thief.cookies.set("gateway_console", copied, path=CONSOLE)
            assert thief.get("/fleet").status_code == 303


# -- bad input at the jobs API and the console: 4xx, never a 500 (on PostgreSQL) -------------


@pytest.fixture(scope="module")
def pg_node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "pg-files"
    files.mkdir()
    (files / "a.bin").write_bytes(b"a" * 1000)
    with temp_database() as url:
        node = start_gateway(module_dir / "pg-node", database_url=url)
        try:
            node.cli("mount", "add", "data", files.as_uri())
            eventually(lambda: "data" in node.buckets())
            yield node
        finally:
            node.stop()


def _jobs(node: GatewayNode, method: str, path: str, body: bytes = b"") -> httpx.Response:
    url = f"{node.url}/_gateway/jobs{path}"
    request = AWSRequest(method=method, url=url, data=body)
    request.headers["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    return httpx.request(method, url, headers=dict(request.headers.items()), content=body)


def test_the_jobs_api_answers_bad_numbers_nul_and_deep_json_with_4xx(pg_node: GatewayNode) -> None:
    huge = "9" * 26
    assert _jobs(pg_node, "GET", f"/{huge}").status_code == 404
    assert _jobs(pg_node, "POST", f"/{huge}/cancel").status_code == 404
    bodies = [
        {"bucket": "data", "prefix": "a\x00b"},
        {"bucket": "data\x00"},
        {"bucket": "data", "bandwidth": int("9" * 400)},
        {"bucket": "data", "bandwidth": 1 << 62},
        {"bucket": "data", "concurrency": 1 << 70},
    ]
    for options in bodies:
        answer = _jobs(pg_node, "POST", "", json.dumps(options).encode())
        assert answer.status_code == 400, (options, answer.text)
        assert answer.json()["error"] == "InvalidArgument"
    deep = b'{"bucket": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = _jobs(pg_node, "POST", "", deep)
    assert answer.status_code == 400 and answer.json()["error"] == "InvalidArgument"
    # And the API still works.
    assert _jobs(pg_node, "GET", "").status_code == 200


def test_the_console_answers_nul_and_huge_ids_without_a_500(pg_node: GatewayNode) -> None:
    with _console(pg_node) as client:
        found = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
        assert found is not None
        form = {"csrf": found.group(1), "access_key": "GK\x00", "secret_key": "x"}
        refused = client.post("/login", data=form)  # no key holds a NUL: a malformed form
        assert refused.status_code == 400 and "NUL" in refused.text
        assert _sign_in(client, ACCESS_KEY, SECRET_KEY).status_code == 303
        page = client.get("/cache/9223372036854775808/live")
        assert page.status_code == 200 and "no job" in page.text
        token = re.search(r'name="csrf" value="([^"]+)"', client.get("/users").text)
        assert token is not None
        made = client.post("/users", data={"csrf": token.group(1), "name": "x\x00y"})
        assert made.status_code == 400 and "NUL" in made.text
        cancel = client.post("/jobs/9223372036854775808/cancel", data={"csrf": token.group(1)})
        assert cancel.status_code == 200
    # The short-circuit socket: deep JSON closes that connection, not the socket's task.
    with _connect(pg_node) as sock:
        assert "nonce" in _greeting(sock)
        deep = b"[" * 100_000 + b"]" * 100_000
        sock.sendall(len(deep).to_bytes(4, "big") + deep)
        assert sock.recv(1) == b""
    with _connect(pg_node) as sock:
        assert "nonce" in _greeting(sock)


def test_an_admin_key_of_a_user_without_admin_cannot_raise_its_own_rights(
    node: GatewayNode,
) -> None:
    node.cli("users", "create", "climber")  # holds `own` only
    key, secret = _key(node, "--admin", "--user", "climber")
    with _console(node, "127.0.0.5") as client:
        refused = _sign_in(client, key, secret)
        assert refused.status_code == 403 and "admin policy" in refused.text
        assert client.get("/users").status_code == 303  # no session: to the login page
    request = AWSRequest(method="GET", url=f"{node.url}/_gateway/jobs")
    request.headers["x-amz-content-sha256"] = hashlib.sha256(b"").hexdigest()
    S3SigV4Auth(Credentials(key, secret), "s3", "us-east-1").add_auth(request)
    answer = httpx.get(f"{node.url}/_gateway/jobs", headers=dict(request.headers.items()))
    assert answer.status_code == 403
    # Its S3 rights are its user's: no mount it does not own.
    s3 = node.client(key, secret)
    assert _code(lambda: s3.list_objects_v2(Bucket="homes")) == "AccessDenied"
    # Given `admin` by an operator, the same key operates.
    node.cli("policies", "attach", "admin", "--user", "climber")
    with _console(node, "127.0.0.5") as client:
        assert _sign_in(client, key, secret).status_code == 303


def _placement(node: GatewayNode, key: str, secret: str) -> dict[str, Any]:
    url = f"{node.url}/_gateway/placement"
    request = AWSRequest(method="GET", url=url)
    request.headers["x-amz-content-sha256"] = hashlib.sha256(b"").hexdigest()
    S3SigV4Auth(Credentials(key, secret), "s3", "us-east-1").add_auth(request)
    answer = httpx.get(url, headers=dict(request.headers.items()), timeout=30)
    assert answer.status_code == 200, answer.text
    document: dict[str, Any] = answer.json()
    return document


def test_the_placement_document_shows_a_key_only_the_buckets_it_may_see(
    node: GatewayNode,
) -> None:
    node.cli("users", "create", "outsider")  # `own`: no bucket yet
    key, secret = _key(node, "--user", "outsider")
    assert _placement(node, key, secret)["mounts"] == {}
    assert "homes" in _placement(node, ACCESS_KEY, SECRET_KEY)["mounts"]
    outsider = node.client(key, secret)
    outsider.create_bucket(Bucket="outsiders")
    assert set(_placement(node, key, secret)["mounts"]) == {"outsiders"}


def test_a_user_name_made_again_does_not_inherit_the_old_users_bucket_grants(
    node: GatewayNode,
) -> None:
    node.cli("users", "create", "temp")
    first = node.client(*_key(node, "--user", "temp"))
    grant = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam:::user/temp"},
                       "Action": "s3:GetObject",
                       "Resource": "arn:aws:s3:::homes/home/alice/notes.txt"}],
    }  # fmt: skip
    node.client().put_bucket_policy(Bucket="homes", Policy=json.dumps(grant))
    try:
        read = first.get_object(Bucket="homes", Key="home/alice/notes.txt")["Body"].read()
        assert read == b"alice's notes"
        node.cli("users", "delete", "temp")
        node.cli("users", "create", "temp")
        second = node.client(*_key(node, "--user", "temp"))
        get = lambda: second.get_object(Bucket="homes", Key="home/alice/notes.txt")  # noqa: E731
        assert _code(get) == "AccessDenied"
        # Stored again, the policy names the user of that name now.
        node.client().put_bucket_policy(Bucket="homes", Policy=json.dumps(grant))
        eventually(lambda: _code(get) == "OK")
    finally:
        node.client().delete_bucket_policy(Bucket="homes")


def test_the_config_file_is_kept_out_of_mounts(tmp_path: Path) -> None:
    conf = tmp_path / "etc"
    conf.mkdir()
    toml = conf / "gateway.toml"
    toml.write_text(f'admin_access_key = "{ACCESS_KEY}"\nadmin_secret_key = "{SECRET_KEY}"\n')
    node = start_gateway(tmp_path / "data", args=("--config", str(toml), "--workers", "1"))
    try:
        refused = node.cli(
            "mount", "add", "conf", conf.as_uri(), "--config", str(toml), check=False
        )
        assert refused.returncode != 0 and "config file" in refused.stderr, refused.stderr
        # Added by a CLI that did not know the file: the node, which does, serves it not.
        node.cli("mount", "add", "conf", conf.as_uri())
        get = lambda: node.client().get_object(Bucket="conf", Key="gateway.toml")  # noqa: E731
        assert _code(get) != "OK"
        assert "config file" in node.log()
    finally:
        node.stop()


@pytest.mark.parametrize(
    ("count", "size", "capacity"),
    [
        (640, 64 << 10, 8 << 20),  # a lease (1/256 of the budget) is less than a block: exact
        (1600, 16 << 10, 16 << 20),  # 64 KiB leases: blocks counted in memory, given back
    ],
)
def test_a_preloads_cache_budget_is_the_nodes_across_its_workers(
    tmp_path: Path, count: int, size: int, capacity: int
) -> None:
    files = tmp_path / "many"
    files.mkdir()
    for i in range(count):  # five batches or more: both workers take some
        (files / f"{i:04d}.bin").write_bytes(bytes([i % 251]) * size)
    args = (
        "--cache-capacity", str(capacity), "--cache-memory", "0", "--cache-block-size", "1MiB",
    )  # fmt: skip
    node = start_gateway(tmp_path / "data", args=args)
    try:
        assert len(node.workers()) >= 2
        node.cli("mount", "add", "many", files.as_uri(), "-o", "metadata_ttl=600")
        eventually(lambda: "many" in node.buckets())
        out = node.cli("load", "many/", "--format", "json", check=False)
        ended = json.loads(out.stdout)
        assert ended["state"] == "partial" and "full" in ended["message"], ended
        assert 0 < ended["loaded_bytes"] <= capacity, ended
        # The node's count of the job's bytes is exactly its blocks' files: every worker's
        # unused lease was given back when its share ended (said as the job's file goes).
        line = f"jobs: job {ended['id']} ended: its blocks counted "
        said = eventually(lambda: [x for x in node.log().splitlines() if line in x])
        counted = int(said[0].split(line, 1)[1].split()[0])
        assert counted == ended["loaded_objects"] * file_size(size), (said, ended)
        verify = json.loads(node.cli("load", "many/", "--verify", "--format", "json").stdout)
        assert verify["cached_bytes"] == ended["loaded_bytes"], (ended, verify)
    finally:
        node.stop()


def test_a_deny_of_plain_http_holds_over_plain_http(node: GatewayNode, tmp_path: Path) -> None:
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
            {"Effect": "Deny", "Action": "s3:*", "Resource": "*",
             "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        ],
    }  # fmt: skip
    document = tmp_path / "tls-only.json"
    document.write_text(json.dumps(policy))
    node.cli("policies", "create", "tls-only", str(document))
    node.cli("users", "create", "careful", "--policy", "tls-only")
    careful = node.client(*_key(node, "--user", "careful"))
    get = lambda: careful.get_object(Bucket="homes", Key="home/alice/notes.txt")  # noqa: E731
    assert _code(get) == "AccessDenied"  # this node serves plain HTTP
