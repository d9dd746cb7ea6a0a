"""What the console makes of input no name holds, on a node over PostgreSQL (which takes no
NUL in text): a NUL in a path's name or key, or in a posted form's field, is a 400 that names
the part, never a 500 from the database, nor a CSRF refusal of a form that had its token."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_console import console, csrf, sign_in
from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.postgres import temp_database


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    with temp_database() as url:
        node = start_gateway(module_dir / "node", database_url=url)
        try:
            yield node
        finally:
            node.stop()


@pytest.fixture
def client(node: GatewayNode) -> Iterator[tuple[httpx.Client, str]]:
    with console(node.url) as client:
        assert sign_in(client, ACCESS_KEY, SECRET_KEY).status_code == 303
        yield client, csrf(client.get("/users").text)


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/keys/%00/disable", "access key"),
        ("/keys/%00/enable", "access key"),
        ("/keys/GK%00X/delete", "access key"),
        ("/users/%00/delete", "user"),
        ("/users/%00/detach/%FF", "user"),
        ("/users/alice/detach/read%00only", "policy"),
    ],
)
def test_a_nul_in_a_paths_name_is_a_400_naming_it(
    client: tuple[httpx.Client, str], node: GatewayNode, path: str, named: str
) -> None:
    http, token = client
    answer = http.post(path, data={"csrf": token})
    assert answer.status_code == 400, answer.text
    assert f"The {named} in the path holds a NUL character" in answer.text
    # Nothing was done, and the node serves on: the key still signs in, the users list.
    assert http.get("/users/live").status_code == 200
    assert "admin" in {u["name"] for u in json.loads(node.cli("users", "list", "--json").stdout)}


@pytest.mark.parametrize("field", ["name", "policy", "csrf"])
def test_a_nul_in_a_forms_field_is_a_400_naming_the_field(
    client: tuple[httpx.Client, str], node: GatewayNode, field: str
) -> None:
    http, token = client
    form = {"csrf": token, "name": "nully", "policy": "readonly"}
    form[field] = form[field][:3] + "\x00" + form[field][3:]
    answer = http.post("/users", data=form)
    assert answer.status_code == 400, answer.text
    assert f"The form's field {field} holds a NUL character" in html.unescape(answer.text)
    users = json.loads(node.cli("users", "list", "--json").stdout)
    assert not [u for u in users if u["name"].startswith("nul")]


def test_a_nul_in_the_login_form_is_a_400_naming_the_field(node: GatewayNode) -> None:
    with console(node.url) as http:
        token = csrf(http.get("/login").text)
        form = {"csrf": token, "access_key": ACCESS_KEY + "\x00", "secret_key": SECRET_KEY}
        answer = http.post("/login", data=form)
        assert answer.status_code == 400, answer.text
        said = html.unescape(answer.text)
        assert "The form's field access_key holds a NUL character" in said
        assert http.get("/fleet").status_code == 303  # not signed in


def test_names_without_a_nul_are_answered_as_before(client: tuple[httpx.Client, str]) -> None:
    http, token = client
    said = http.post("/users/%FF/delete", data={"csrf": token})
    assert said.status_code == 200 and "no user" in said.text
    said = http.post("/keys/GKNOSUCHKEY000000000/disable", data={"csrf": token})
    assert said.status_code == 200 and "no access key GKNOSUCHKEY000000000" in said.text
    made = http.post("/users", data={"csrf": token, "name": "carol", "policy": "readonly"})
    assert made.status_code == 200 and "created user carol" in made.text
