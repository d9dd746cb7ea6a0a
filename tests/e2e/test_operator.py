"""The operator's first hour (issue 29), as a new user meets it: the node started as the
README starts it (`scripts/serve`), the CLI run from another folder, a node whose database or
cache folder goes away under it."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.gateway import BIN, GatewayNode, _env, server_args, start_gateway
from tests.support.net import eventually, free_port
from tests.support.postgres import database_outage, temp_database

REPO = Path(__file__).resolve().parents[2]


class Served:
    """`scripts/serve` as the README runs it, its standard output read line by line."""

    def __init__(self, data_dir: Path, port: int) -> None:
        env = _env({"GATEWAY_DATA_DIR": str(data_dir)})
        env.pop("GATEWAY_ENCRYPTION_KEY")  # as a new user: the key is made in the data dir
        self.url = f"http://127.0.0.1:{port}"
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [str(REPO / "scripts" / "serve"), "--port", str(port), "--workers", "2",
             *server_args()],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.said: list[str] = []
        self.errors: list[str] = []
        threading.Thread(
            target=self._read, args=(self.proc.stdout, self.lines), daemon=True
        ).start()
        threading.Thread(target=self._drain, daemon=True).start()

    @staticmethod
    def _read(stream: object, into: queue.Queue[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.put(line.rstrip("\n"))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors.append(line)

    def next_line(self, timeout: float = 120) -> str:
        line = self.lines.get(timeout=timeout)
        self.said.append(line)
        return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    node = Served(tmp_path_factory.mktemp("operator") / "data", free_port())
    try:
        while not node.next_line().startswith("gateway: serving"):
            pass
        # The line says it serves: it does, at that moment (no waiting here).
        assert httpx.get(node.url + "/healthz").status_code == 200
        yield node
    finally:
        node.stop()


def gateway(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = _env(env)
    full.pop("GATEWAY_ENCRYPTION_KEY")
    return subprocess.run(
        [str(BIN / "gateway"), *args], cwd=cwd, env=full, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_the_node_says_it_serves_once_it_answers(served: Served) -> None:
    line = next(x for x in served.said if x.startswith("gateway: serving"))
    assert served.url in line and f"data dir {served.data_dir}" in line
    assert "mounts: demo" in line and "2 workers" in line
    # uvicorn's own line, printed at bind before the workers answer, is gone.
    assert not any("Uvicorn running" in x for x in served.said + served.errors)


def test_a_command_from_another_folder_refuses_and_says_where_it_looked(
    served: Served, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = gateway("jobs", "list", cwd=elsewhere)
    assert out.returncode == 1, out
    assert "no gateway node" in out.stderr and str(elsewhere / "data") in out.stderr
    for place in ("--data-dir: not given", "GATEWAY_DATA_DIR: not set", "config file: none"):
        assert place in out.stderr
    assert list(elsewhere.iterdir()) == []  # no database, no secret key made here
    # A data dir named that holds no node is refused too (a command that reads).
    out = gateway("mount", "list", "--data-dir", str(tmp_path / "typo"), cwd=elsewhere)
    assert out.returncode == 1 and f"{tmp_path / 'typo'} holds no gateway.db" in out.stderr
    assert not (tmp_path / "typo").exists()
    # Found by flag, by environment, by the config file: the node's demo mount.
    by_flag = gateway("mount", "list", "--data-dir", str(served.data_dir), cwd=elsewhere)
    by_env = gateway("mount", "list", cwd=elsewhere, env={"GATEWAY_DATA_DIR": str(served.data_dir)})
    config = tmp_path / "gateway.toml"
    config.write_text(f'data_dir = "{served.data_dir}"\n')
    by_file = gateway("mount", "list", "--config", str(config), cwd=elsewhere)
    for out in (by_flag, by_env, by_file):
        assert out.returncode == 0 and out.stdout.startswith("demo\tfile://"), out
    assert "GATEWAY_DATA_DIR" in gateway("--help", cwd=elsewhere).stdout


def test_status_shows_a_lone_node(served: Served, tmp_path: Path) -> None:
    out = gateway("status", "--data-dir", str(served.data_dir), cwd=tmp_path)
    assert out.returncode == 0, out
    assert "this node" in out.stdout and served.url in out.stdout and "alone" in out.stdout
    assert out.stdout.rstrip().endswith("1 of 1 nodes live")


def test_keys_create_says_what_the_key_may_do(served: Served, tmp_path: Path) -> None:
    plain = gateway("keys", "create", "--data-dir", str(served.data_dir), cwd=tmp_path)
    assert "user: admin" in plain.stdout
    assert "may: S3 as user admin (its policies); not the operator API or the console" in (
        plain.stdout
    )
    admin = gateway("keys", "create", "--admin", "--data-dir", str(served.data_dir), cwd=tmp_path)
    assert "may: S3 as user admin (its policies), and the operator API and the console" in (
        admin.stdout
    )
    # The console takes the admin key, and refuses the other, as the lines say.
    for out, status in ((admin, 303), (plain, 403)):
        key, secret = (out.stdout.split(f"{w} key: ")[1].split()[0] for w in ("access", "secret"))
        assert eventually(lambda k=key, s=secret, w=status: _sign_in(served.url, k, s) == w)


def _sign_in(url: str, access_key: str, secret_key: str) -> int:
    with httpx.Client(base_url=url + "/_gateway/console") as client:
        token = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
        assert token is not None
        form = {"csrf": token.group(1), "access_key": access_key, "secret_key": secret_key}
        return client.post("/login", data=form).status_code


@pytest.fixture
def pg_node(tmp_path: Path) -> Iterator[tuple[GatewayNode, str]]:
    with temp_database() as url:
        node = start_gateway(tmp_path / "node", database_url=url)
        try:
            yield node, url
        finally:
            node.stop()


def _readyz(node: GatewayNode) -> tuple[int, dict[str, str]]:
    answer = httpx.get(node.url + "/readyz", timeout=10)
    return answer.status_code, answer.json().get("checks", {})


def test_readyz_fails_while_the_database_or_cache_folder_is_unusable(
    pg_node: tuple[GatewayNode, str],
) -> None:
    node, url = pg_node
    assert _readyz(node) == (200, {"database": "ok", "secrets": "ok", "cache": "ok"})
    with database_outage(url):
        status, checks = eventually(lambda: (r := _readyz(node))[0] == 503 and r, timeout=30)
        assert checks["database"] == "unreachable" and checks["cache"] == "ok"
        assert httpx.get(node.url + "/healthz").status_code == 200  # alive: not restarted
        assert "127.0.0.1" not in str(checks) and "5432" not in str(checks)
    eventually(lambda: _readyz(node)[0] == 200, timeout=30)
    cache = node.data_dir / "cache"
    cache.rename(node.data_dir / "cache-away")
    try:
        status, checks = _readyz(node)
        assert status == 503 and checks["cache"] != "ok" and checks["database"] == "ok"
        assert str(node.data_dir) not in str(checks)
    finally:
        (node.data_dir / "cache-away").rename(cache)
    assert _readyz(node)[0] == 200


def test_mount_add_checks_the_store_first(served: Served, tmp_path: Path) -> None:
    data = ("--data-dir", str(served.data_dir))
    missing = tmp_path / "no-such-folder"
    out = gateway("mount", "add", "scratch", missing.as_uri(), *data, cwd=tmp_path)
    assert out.returncode == 1 and "not mounted" in out.stderr and ": not found:" in out.stderr
    assert "--no-check" in out.stderr
    port = free_port()  # nothing listens there
    out = gateway(
        "mount", "add", "remote", "s3://datasets", "-o", f"endpoint_url=http://127.0.0.1:{port}",
        "-o", "access_key=a", "-o", "secret_key=s", "-o", "max_attempts=1", *data, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1 and ": connection refused:" in out.stderr, out
    assert "secret_key" not in out.stderr and "=s" not in out.stderr
    listed = gateway("mount", "list", *data, cwd=tmp_path).stdout
    assert "scratch" not in listed and "remote" not in listed
    # Unchecked, it is mounted as asked; a folder made later is served.
    out = gateway("mount", "add", "scratch", missing.as_uri(), "--no-check", *data, cwd=tmp_path)
    assert out.returncode == 0, out
    missing.mkdir()
    (missing / "k.txt").write_text("later")
    out = gateway("mount", "add", "checked", missing.as_uri(), *data, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("mounted checked ->"), out


def test_mount_add_says_credentials_were_refused(served: Served, tmp_path: Path) -> None:
    import base64

    from tests.support.azurite import AzuriteServer, sdk_client

    azurite = AzuriteServer(tmp_path / "azurite")
    try:
        sdk_client(azurite).create_container("datasets")
        wrong = base64.b64encode(b"not the account's key, 32 bytes!").decode()
        uri = f"az://{azurite.account}/datasets"
        out = gateway(
            "mount", "add", "azure", uri, "-o", f"endpoint={azurite.url}",
            "-o", f"account_key={wrong}", "--data-dir", str(served.data_dir), cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 1 and ": credentials refused (auth):" in out.stderr, out
        assert wrong not in out.stderr
        out = gateway(
            "mount", "add", "azure", f"az://{azurite.account}/no-such-container",
            "-o", f"endpoint={azurite.url}", "-o", f"account_key={azurite.key}",
            "--data-dir", str(served.data_dir), cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 1 and ": not found:" in out.stderr, out
    finally:
        azurite.stop()
