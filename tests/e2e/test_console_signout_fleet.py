"""Signing out of the console holds across a fleet (docs/console.md): two gateway processes
over one PostgreSQL database, each with its default workers; a session signed in on node 1
works on node 2 (the fleet's sessions are signed under one key), and once signed out on
node 1 a copy of its cookie is refused on both nodes, whichever worker answers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import free_port
from tests.support.postgres import rows, temp_database

# Two gateway processes on PostgreSQL.
pytestmark = pytest.mark.slow

CONSOLE = "/_gateway/console"
COOKIE = "gateway_console"


@pytest.fixture(scope="module")
def nodes(module_dir: Path) -> Iterator[tuple[GatewayNode, GatewayNode]]:
    with temp_database() as url:
        started: list[GatewayNode] = []
        try:
            for i in range(2):
                args = (
                    "--fleet-secret", "fleet-secret-for-tests",
                    "--internal-port", str(free_port()), "--node-id", f"node-{i}",
                    "--heartbeat-interval", "0.5", "--no-access-log",
                )  # fmt: skip
                started.append(start_gateway(module_dir / f"n{i}", database_url=url, args=args))
            yield started[0], started[1]
        finally:
            for node in started:
                node.stop()


def console(node: GatewayNode, cookie: str | None = None) -> httpx.Client:
    client = httpx.Client(base_url=node.url + CONSOLE, timeout=30)
    if cookie is not None:
        client.cookies.set(COOKIE, cookie, path=CONSOLE)
    return client


def csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


def answers(node: GatewayNode, cookie: str) -> tuple[int, int]:
    """A page's and a live fragment's status with this cookie, from a fresh client."""
    with console(node, cookie) as client:
        return client.get("/fleet").status_code, client.get("/fleet/live").status_code


def test_a_session_signed_out_on_one_node_is_refused_on_the_other(
    nodes: tuple[GatewayNode, GatewayNode],
) -> None:
    one, two = nodes
    with console(one) as browser:
        token = csrf(browser.get("/login").text)
        form = {"csrf": token, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY}
        assert browser.post("/login", data=form).status_code == 303
        cookie = browser.cookies.get(COOKIE)
        assert cookie
        # The session is the fleet's: node 2 takes it too, before the sign-out.
        assert answers(two, cookie) == (200, 200)
        signed_out = browser.post("/logout", data={"csrf": csrf(browser.get("/fleet").text)})
        assert signed_out.status_code == 303
        assert signed_out.headers["location"] == CONSOLE + "/login"
    # At once, on both nodes and whichever of their workers answers (four tries each).
    for node in (two, one, two, one, two, one, two, one):
        assert answers(node, cookie) == (303, 401)
    assert len(rows(two.database_url or "", "SELECT nonce FROM console_signed_out")) == 1
