"""The operator console (docs/console.md) on three gateway processes over one PostgreSQL
database: in headless Chromium (Debian's, driven by playwright), an admin signs in, sees the
three nodes, starts a preload through the form and watches its bar reach 100 %, cancels
another job, makes a read-only user and a key whose secret is shown once (boto3: a GET
allowed, a PUT refused; disabled with its button, refused), checks what of a prefix is
cached, and signs out; a screenshot of each page goes to test-artifacts/console/. Over plain
HTTP: sign-in refused for a non-admin
key and for a wrong secret, a POST without the CSRF token or with a wrong one refused, no
session, a forged cookie or an expired one (issued under an injected clock) refused. Disabled
keys: one disabled with the CLI is refused on every node (SigV4, SigV2, a presigned URL, the
jobs API, the console) until enabled; the console's disable and enable buttons; a disabled admin
key's session ends. Failed sign-ins: 429 past five, per key and client address together (other
loopback addresses)."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
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

from gateway.console.sessions import COOKIE, Sessions
from gateway.meta import SecretBox
from tests.e2e.test_jobs_fleet import JobsFleet
from tests.support.gateway import ACCESS_KEY, SECRET_KEY, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy
from tests.support.postgres import temp_database

playwright = pytest.importorskip("playwright.sync_api")

# Three gateway processes on PostgreSQL, and a browser.
pytestmark = pytest.mark.slow

ORIGIN = "origin-console"
CONSOLE = "/_gateway/console"
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
PRELOAD = 24  # objects under pre/
SLOW = 64  # objects under slow/, loaded at 1 KiB/s: a job still running when it is cancelled
SIZE = 2048


def blob(key: str) -> bytes:
    return (hashlib.sha256(key.encode()).digest() * (SIZE // 32 + 1))[:SIZE]


@pytest.fixture(scope="module")
def fleet(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[JobsFleet]:
    """Three nodes with bucket `data` mounted over the origin's pre/ and slow/ objects."""
    origin_s3.create_bucket(Bucket=ORIGIN)
    keys = [f"pre/{i:03d}" for i in range(PRELOAD)] + [f"slow/{i:03d}" for i in range(SLOW)]
    for key in keys:
        origin_s3.put_object(Bucket=ORIGIN, Key=key, Body=blob(key))
    with temp_database() as url:
        fleet = JobsFleet(module_dir, url, origin, takeover=60)
        try:
            opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=origin-ak"]
            opts += ["-o", "secret_key=origin-sk", "-o", "metadata_ttl=600"]
            fleet.nodes[0].cli("mount", "add", "data", f"s3://{ORIGIN}", *opts)
            for node in fleet.nodes:
                eventually(lambda n=node: "data" in n.buckets())
            ids = {f"node-{i}" for i in range(3)}
            eventually(lambda: fleet.settled(ids), timeout=30)
            yield fleet
        finally:
            fleet.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_an_admin_runs_the_fleet_from_the_browser(fleet: JobsFleet, browser: Any) -> None:
    node = fleet.nodes[0]
    expect = playwright.expect
    page = browser.new_page()
    page.set_default_timeout(30_000)

    # Signing in; the console greets with the fleet: three nodes, each live.
    page.goto(node.url + CONSOLE + "/")
    expect(page).to_have_url(re.compile(r"/login$"))
    page.fill("input[name=access_key]", ACCESS_KEY)
    page.fill("input[name=secret_key]", SECRET_KEY)
    page.click("#login button[type=submit]")
    expect(page).to_have_url(re.compile(r"/fleet$"))
    expect(page.locator("#live-count")).to_have_text("3 of 3 nodes live")
    expect(page.locator("tr.node[data-state=up]")).to_have_count(3)
    shot(page, "fleet")

    # Mounts: the store's secret masked as `gateway mount list` masks it.
    page.click("#nav-mounts")
    row = page.locator("tr.mount[data-bucket=data]")
    expect(row).to_contain_text("secret_key=***")
    assert "origin-sk" not in page.content()
    shot(page, "mounts")

    # Jobs: one running slowly (submitted by the CLI) is cancelled; a preload started through
    # the form is followed to 100 %.
    _, slow = fleet.load("data/slow/", "--detach", "--bandwidth", "1KiB/s")
    page.click("#nav-jobs")
    slow_row = page.locator(f"tr.job[data-job='{slow['id']}']")
    expect(slow_row).to_be_visible()
    slow_row.locator("button.cancel").click()
    expect(slow_row).to_have_attribute("data-state", "cancelled")

    page.select_option("#start-job select[name=bucket]", "data")
    page.fill("#start-job input[name=prefix]", "pre/")
    page.click("#start-job button[type=submit]")
    expect(page.locator("#jobs-message")).to_contain_text("submitted")
    job_id = page.locator("#jobs-message").inner_text().split()[1]
    bar = page.locator(f"tr.job[data-job='{job_id}']")
    expect(bar).to_have_attribute("data-state", "done")
    expect(bar.locator(".pct")).to_have_text("100%")
    expect(bar.locator("[role=progressbar]")).to_have_attribute("aria-valuenow", "100")
    shot(page, "jobs")

    # Users and keys: a read-only user and its key, shown once.
    page.click("#nav-users")
    page.fill("#create-user input[name=name]", "reader")
    page.select_option("#create-user select[name=policy]", "readonly")
    page.click("#create-user button[type=submit]")
    expect(page.locator("#result-message")).to_have_text("created user reader with policy readonly")
    page.fill("#create-key input[name=user]", "reader")
    page.click("#create-key button[type=submit]")
    expect(page.locator("#new-secret-key")).to_be_visible()
    access_key = page.locator("#new-access-key").inner_text()
    secret_key = page.locator("#new-secret-key").inner_text()
    expect(page.locator("tr.user[data-user=reader]")).to_contain_text(access_key)
    expect(page.locator("tr.user[data-user=reader]")).to_contain_text("readonly")
    shot(page, "users")

    s3 = fleet.nodes[1].client(access_key, secret_key)
    got = eventually(lambda: s3.get_object(Bucket="data", Key="pre/000")["Body"].read())
    assert got == blob("pre/000")
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket="data", Key="pre/new", Body=b"no")
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    # Its disable button (an htmx POST with the session's CSRF header): refused at once.
    key_row = page.locator(f"div.key[data-key='{access_key}']")
    key_row.locator("button.disable-key").click()
    expect(page.locator("#result-message")).to_have_text(f"disabled key {access_key}")
    expect(key_row).to_have_attribute("data-state", "disabled")
    expect(key_row.locator("button.enable-key")).to_be_visible()
    eventually(lambda: s3_code(lambda: s3.get_object(Bucket="data", Key="pre/000")) != "")
    assert s3_code(lambda: s3.get_object(Bucket="data", Key="pre/000")) == "InvalidAccessKeyId"

    # What of pre/ is cached, and where: all of it, after the preload.
    page.click("#nav-cache")
    page.select_option("#check-cache select[name=bucket]", "data")
    page.fill("#check-cache input[name=prefix]", "pre/")
    page.click("#check-cache button[type=submit]")
    expect(page.locator("#cache-state")).to_have_text("done")
    expect(page.locator("#cached-share")).to_have_text("100%")
    expect(page.locator("tr.cache-node")).to_have_count(3)
    shot(page, "cache")

    # Signing out ends the session: the pages send the browser back to the login form.
    page.click("#logout")
    expect(page).to_have_url(re.compile(r"/login$"))
    page.goto(node.url + CONSOLE + "/jobs")
    expect(page).to_have_url(re.compile(r"/login$"))
    shot(page, "login")
    page.close()


# -- over plain HTTP ------------------------------------------------------------------------


def console(node_url: str) -> httpx.Client:
    return httpx.Client(base_url=node_url + CONSOLE, timeout=30)


def csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


def sign_in(client: httpx.Client, access_key: str, secret_key: str) -> httpx.Response:
    token = csrf(client.get("/login").text)
    form = {"csrf": token, "access_key": access_key, "secret_key": secret_key}
    return client.post("/login", data=form)


def signed_in(client: httpx.Client) -> bool:
    return client.get("/fleet").status_code == 200


def sessions(fleet: JobsFleet, clock: Any = time.time) -> Sessions:
    """The console's sessions under the fleet's key, as a node derives it."""
    box = SecretBox([fleet.env["GATEWAY_ENCRYPTION_KEY"]])
    return Sessions(box.derive("console-session"), clock)


def test_sign_in_needs_an_admin_key_and_its_secret(fleet: JobsFleet) -> None:
    node = fleet.nodes[1]
    out = node.cli("keys", "create", "--description", "not admin").stdout
    plain_key = out.split("access key:")[1].split()[0]
    plain_secret = out.split("secret key:")[1].split()[0]
    with console(node.url) as client:
        refused = sign_in(client, plain_key, plain_secret)
        assert refused.status_code == 403
        assert "is not an admin key" in refused.text
        assert not signed_in(client)

        wrong = sign_in(client, ACCESS_KEY, SECRET_KEY + "x")
        assert wrong.status_code == 401
        assert not signed_in(client)
        unknown = sign_in(client, "GKNOSUCHKEY000000000", SECRET_KEY)
        assert unknown.status_code == 401

        ok = sign_in(client, ACCESS_KEY, SECRET_KEY)
        assert ok.status_code == 303
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert f"Path={CONSOLE}" in cookie
        max_age = re.search(r"Max-Age=(\d+)", cookie)
        assert max_age is not None and 12 * 3600 - 60 < int(max_age.group(1)) <= 12 * 3600
        assert signed_in(client)


def test_a_post_needs_the_sessions_csrf_token(fleet: JobsFleet) -> None:
    node = fleet.nodes[0]
    with console(node.url) as client:
        assert sign_in(client, ACCESS_KEY, SECRET_KEY).status_code == 303
        token = csrf(client.get("/users").text)
        missing = client.post("/users", data={"name": "mallory", "policy": "admin"})
        assert missing.status_code == 403
        wrong = client.post("/users", data={"csrf": token[:-2] + "xx", "name": "mallory"})
        assert wrong.status_code == 403
        header = client.post("/users", data={"name": "mallory"}, headers={"X-CSRF-Token": "no"})
        assert header.status_code == 403
        users = json.loads(node.cli("users", "list", "--json").stdout)
        assert "mallory" not in {u["name"] for u in users}

        # Another session's token is no good either: each session has its own.
        with console(node.url) as other:
            assert sign_in(other, ACCESS_KEY, SECRET_KEY).status_code == 303
            theirs = csrf(other.get("/users").text)
        assert theirs != token
        assert client.post("/users", data={"csrf": theirs, "name": "mallory"}).status_code == 403

        made = client.post("/users", data={"csrf": token, "name": "trent", "policy": "own"})
        assert made.status_code == 200 and "created user trent" in made.text
        # The login form is protected too: a sign-in without the form's token is refused.
        bare = {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}
        assert client.post("/login", data=bare).status_code == 403


def test_no_session_a_forged_or_an_expired_one_is_refused(fleet: JobsFleet) -> None:
    node = fleet.nodes[2]
    good = sessions(fleet).issue(ACCESS_KEY)[1]
    expired = sessions(fleet, clock=lambda: time.time() - 13 * 3600).issue(ACCESS_KEY)[1]
    forged = Sessions(b"not the fleet's key").issue(ACCESS_KEY)[1]
    payload, signature = good.split(".")
    tampered = payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1] + "." + signature

    def ask(cookie: str | None) -> tuple[int, int, int]:
        with console(node.url) as client:
            if cookie is not None:
                client.cookies.set(COOKIE, cookie)
            page = client.get("/jobs")
            fragment = client.get("/jobs/live")
            post = client.post("/jobs/1/cancel", data={"csrf": "x"})
        assert page.status_code != 303 or page.headers["location"] == CONSOLE + "/login"
        if fragment.status_code == 401:
            assert fragment.headers["hx-redirect"] == CONSOLE + "/login"
        return page.status_code, fragment.status_code, post.status_code

    assert ask(good)[:2] == (200, 200)  # a session signed with the fleet's key: any node's
    for cookie in (None, expired, forged, tampered, "garbage"):
        assert ask(cookie) == (303, 401, 401), cookie


def test_the_grafana_dashboard_names_metrics_the_nodes_export(fleet: JobsFleet) -> None:
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json")
                           .read_text())  # fmt: skip
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in re.findall(r"\bgateway_[a-z_]+", e)}
    # A read, so that the store's counters have a sample on the key's owner whatever ran
    # before (a family with no sample is not exported): the fleet's families together.
    body = fleet.nodes[0].client().get_object(Bucket="data", Key="pre/000")["Body"].read()
    assert body == blob("pre/000")
    families: set[str] = set()
    for node in fleet.nodes:
        exported = httpx.get(node.url + "/metrics").text
        families |= set(re.findall(r"^# TYPE (gateway_[a-z_]+) ", exported, re.M))
    for name in sorted(named):
        base = re.sub(r"_(total|bucket)$", "", name)
        assert name in families or base in families, name


# -- disabled keys and the limit on failed sign-ins -----------------------------------------


def new_key(node: Any, *args: str) -> tuple[str, str]:
    out = node.cli("keys", "create", *args).stdout
    return out.split("access key:")[1].split()[0], out.split("secret key:")[1].split()[0]


def s3_code(call: Any) -> str:
    """The S3 error code of a call, or "" when it succeeds."""
    try:
        call()
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])
    return ""


def sigv2_client(node_url: str, access_key: str, secret_key: str) -> Any:
    return boto3.client(
        "s3", endpoint_url=node_url, aws_access_key_id=access_key,
        aws_secret_access_key=secret_key, region_name="us-east-1",
        config=Config(signature_version="s3", s3={"addressing_style": "path"},
                      retries={"max_attempts": 1, "mode": "standard"}),
    )  # fmt: skip


def jobs_api_status(node_url: str, access_key: str, secret_key: str) -> tuple[int, str]:
    """GET /_gateway/jobs signed with the key: the status and the error code, if any."""
    url = f"{node_url}/_gateway/jobs?limit=1"
    request = AWSRequest(method="GET", url=url)
    S3SigV4Auth(Credentials(access_key, secret_key), "s3", "us-east-1").add_auth(request)
    answer = httpx.get(url, headers=dict(request.headers.items()), timeout=30)
    body = answer.json()
    return answer.status_code, body.get("error", "") if isinstance(body, dict) else ""


def key_state(node: Any, access_key: str) -> str:
    listed = json.loads(node.cli("keys", "list", "--json").stdout)
    return str(next(k["state"] for k in listed if k["access_key"] == access_key))


def test_a_key_disabled_with_the_cli_authenticates_nowhere_until_enabled(
    fleet: JobsFleet,
) -> None:
    node = fleet.nodes[1]
    access_key, secret_key = new_key(node, "--admin", "--description", "to disable")
    v4 = node.client(access_key, secret_key)
    v2 = sigv2_client(node.url, access_key, secret_key)
    presigned = v4.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "pre/001"})
    eventually(lambda: s3_code(v4.list_buckets) == "")
    assert httpx.get(presigned).content == blob("pre/001")  # and remembered as verified
    assert s3_code(v2.list_buckets) == ""
    assert jobs_api_status(node.url, access_key, secret_key)[0] == 200

    assert node.cli("keys", "disable", access_key).stdout.strip() == f"disabled {access_key}"
    assert key_state(node, access_key) == "disabled"
    # Every node refuses it within its refresh interval, as a key that does not exist.
    for other in fleet.nodes:
        client = other.client(access_key, secret_key)
        eventually(lambda c=client: s3_code(c.list_buckets) == "InvalidAccessKeyId")
    refused = httpx.get(presigned)
    assert refused.status_code == 403 and b"<Code>InvalidAccessKeyId</Code>" in refused.content
    assert s3_code(v2.list_buckets) == "InvalidAccessKeyId"
    assert jobs_api_status(node.url, access_key, secret_key) == (403, "InvalidAccessKeyId")
    with console(node.url) as client:
        said = sign_in(client, access_key, secret_key)
        assert said.status_code == 403 and "is disabled" in said.text
    assert node.cli("keys", "disable", "GKNOSUCHKEY000000000", check=False).returncode != 0

    assert node.cli("keys", "enable", access_key).stdout.strip() == f"enabled {access_key}"
    eventually(lambda: s3_code(v4.list_buckets) == "")  # at once: an unknown key is re-read
    assert httpx.get(presigned).content == blob("pre/001")
    assert s3_code(v2.list_buckets) == ""
    assert jobs_api_status(node.url, access_key, secret_key)[0] == 200


def test_the_consoles_disable_button_and_a_disabled_admins_session(fleet: JobsFleet) -> None:
    node = fleet.nodes[0]
    plain_key, plain_secret = new_key(node, "--description", "button")
    admin_key, admin_secret = new_key(node, "--admin", "--description", "second admin")
    s3 = fleet.nodes[2].client(plain_key, plain_secret)
    eventually(lambda: s3_code(s3.list_buckets) == "")
    with console(node.url) as client, console(node.url) as other:
        assert sign_in(client, ACCESS_KEY, SECRET_KEY).status_code == 303
        token = csrf(client.get("/users").text)
        gone = client.post(f"/keys/{plain_key}/disable")
        assert gone.status_code == 403  # no CSRF token: nothing happens
        said = client.post(f"/keys/{plain_key}/disable", data={"csrf": token})
        assert said.status_code == 200 and f"disabled key {plain_key}" in said.text
        live = client.get("/users/live").text
        assert f'data-key="{plain_key}" data-state="disabled"' in live
        assert f"/keys/{plain_key}/enable" in live
        eventually(lambda: s3_code(s3.list_buckets) == "InvalidAccessKeyId")
        said = client.post(f"/keys/{plain_key}/enable", data={"csrf": token})
        assert said.status_code == 200 and f"enabled key {plain_key}" in said.text
        assert f'data-key="{plain_key}" data-state="enabled"' in client.get("/users/live").text
        eventually(lambda: s3_code(s3.list_buckets) == "")
        missing = client.post("/keys/GKNOSUCHKEY000000000/disable", data={"csrf": token})
        assert "no access key GKNOSUCHKEY000000000" in missing.text

        # A disabled admin key's session ends at its next request, on every node; enabled
        # again, the same cookie works (it had not expired).
        assert sign_in(other, admin_key, admin_secret).status_code == 303
        assert signed_in(other)
        client.post(f"/keys/{admin_key}/disable", data={"csrf": token})
        page = other.get("/fleet")
        assert page.status_code == 303 and page.headers["location"] == CONSOLE + "/login"
        assert other.get("/fleet/live").status_code == 401
        assert other.post("/logout", data={"csrf": "x"}).status_code == 401
        with console(fleet.nodes[1].url) as elsewhere:
            elsewhere.cookies.set(COOKIE, other.cookies[COOKIE])
            assert not signed_in(elsewhere)
        client.post(f"/keys/{admin_key}/enable", data={"csrf": token})
        assert signed_in(other)


def from_address(node_url: str, address: str) -> httpx.Client:
    """A console client whose connections come from `address` (another loopback address):
    the limit on failed sign-ins counts per client address too."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=node_url + CONSOLE, timeout=30, transport=transport)


def test_failed_sign_ins_are_limited_per_key_and_address_together(fleet: JobsFleet) -> None:
    node = fleet.nodes[2]
    admin_key, admin_secret = new_key(node, "--admin", "--description", "guessed at")
    with from_address(node.url, "127.0.0.2") as guesser:
        for _ in range(5):
            assert sign_in(guesser, admin_key, "wrong").status_code == 401
        # The key is limited from this address, the right secret included ...
        limited = sign_in(guesser, admin_key, admin_secret)
        assert limited.status_code == 429 and "Too many failed sign-ins" in limited.text
        assert 0 < int(limited.headers["retry-after"]) <= 300
        assert not signed_in(guesser)
    # ... and not from elsewhere: access keys are not secret, so a guesser never locks the
    # right secret out (docs/console.md).
    with from_address(node.url, "127.0.0.3") as elsewhere:
        assert sign_in(elsewhere, admin_key, admin_secret).status_code == 303
    with console(fleet.nodes[0].url) as other_node:
        assert sign_in(other_node, admin_key, admin_secret).status_code == 303


def test_a_node_in_no_fleet_shows_itself(tmp_path: Path) -> None:
    # The embedded default: SQLite, no fleet secret, so no heartbeats and no samples.
    node = start_gateway(tmp_path / "alone")
    try:
        client = console(node.url)
        assert sign_in(client, ACCESS_KEY, SECRET_KEY).status_code == 303
        page = client.get("/fleet/live").text
        assert "1 of 1 nodes live" in page and 'data-state="alone"' in page, page
    finally:
        node.stop()
