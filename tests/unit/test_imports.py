"""The import graph of gateway/, read from the source with `ast`: no circle between modules
(imports inside functions and behind TYPE_CHECKING count: a hidden circle is still a circle),
and every import from one part into another goes the way docs/architecture.md draws it:
the S3 protocol on top, the service beneath it, stores and the page store at the bottom."""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

# Small top-level modules every part may share: the S3 error table, settings, logs, numbers,
# the counters. LEAF: those of them that may sit under stores and the page store, which speak
# no S3 (a store raises its own typed errors; the service maps them to S3's once).
LEAF = {"gateway.decimals", "gateway.logs"}
# The node's change counters shared by its workers (a file in the cache folder).
SIGNALS = {"gateway.generations"}
BASE = LEAF | SIGNALS | {"gateway", "gateway.errors", "gateway.config", "gateway.counters"}
BELOW_THE_SERVICE = {
    "gateway.cache", "gateway.catalog", "gateway.cluster", "gateway.meta", "gateway.stores"
}  # fmt: skip
EVERYTHING = {"*"}

# Which parts each part may import (a part is a package under gateway/, or a top-level
# module). Its own modules it may always import.
ALLOWED: dict[str, set[str]] = {
    "gateway.s3": {"gateway.service"} | BASE,  # one service face and the error table
    "gateway.service": BELOW_THE_SERVICE | {"gateway.iam"} | BASE,
    "gateway.iam": set(),  # policies, pure: nothing of the gateway
    "gateway.cluster": {"gateway.meta", "gateway.stores"} | BASE,  # the stores' value types
    "gateway.meta": {"gateway.stores"} | BASE,  # the stores' value types, below it
    # The catalog's tables in the database, filled from the stores (it lists and stats them).
    "gateway.catalog": {"gateway.meta", "gateway.stores"} | BASE,
    "gateway.stores": LEAF,
    "gateway.cache": LEAF,
    # /metrics reads the workers' shared folder that `serve` names (gateway.datadir).
    "gateway.admin": {"gateway.service", "gateway.datadir"} | BELOW_THE_SERVICE | BASE,
    # Preload jobs drive the Reader (serve_block) like a client would, and check the API's
    # signatures with the S3 layer's SigV4 verifier (and who is an admin key, with iam's rule).
    "gateway.jobs": {"gateway.service", "gateway.s3", "gateway.iam"} | BELOW_THE_SERVICE | BASE,
    # The operator console: pages over the service's mounts, the jobs API's submit, the
    # built-in policies, and the database beneath.
    "gateway.console": {"gateway.service", "gateway.jobs", "gateway.iam"}
    | BELOW_THE_SERVICE
    | BASE,
    "gateway.edge": {"gateway.s3"} | BASE,  # the HTTP server's limits, answered as S3 errors
    # The node's own HTTP server, and uvicorn's protocol as the fallback: the edge's limits.
    "gateway.server": {"gateway.edge"} | BASE,
    "gateway.edge_uvicorn": {"gateway.edge"} | BASE,
    # Runs in training jobs, apart from any node: reads block files as the page store wrote
    # them, and finds owners with the nodes' own placement function.
    "gateway.client": {"gateway.cache", "gateway.cluster"},
    "gateway.node": EVERYTHING,  # builds a node out of the parts
    "gateway.generations": set(),
    "gateway.datadir": set(),  # the data dir's modes and metrics folder, for `serve` (cli)
    "gateway.cli": EVERYTHING,
    "gateway": set(),
    "gateway.errors": set(),
    "gateway.config": set(),
    "gateway.decimals": set(),
    "gateway.logs": set(),
    "gateway.counters": set(),
}

# Imports that break the rules and are allowed for a while, each with the issue that removes it:
# (importer, imported module, issue). Empty since issue 13 ("The house") landed; an entry that
# is no longer in the code fails the test too, so the list cannot go stale.
KNOWN_VIOLATIONS: list[tuple[str, str, str]] = []


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        parts = list(path.relative_to(GATEWAY.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported_names(module: str, path: Path) -> Iterator[str]:
    """What each import statement of the module names, relative imports made absolute;
    `from a import b` names a.b (a module, if there is one) and a."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}"


def import_graph() -> dict[str, set[str]]:
    """Module -> the gateway modules it imports (the deepest module each import names).
    Only import statements are seen: the stores' openers, loaded by name with importlib from
    their own package, are not edges."""
    found = modules()
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        for target in imported_names(name, path):
            while target and target not in found:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def part(module: str) -> str:
    """The part a module belongs to: its package right under gateway/, or itself."""
    top = ".".join(module.split(".")[:2])
    return top if (GATEWAY.parent / top.replace(".", "/")).is_dir() else module


def known() -> set[tuple[str, str]]:
    return {(importer, imported) for importer, imported, _ in KNOWN_VIOLATIONS}


def test_no_import_circle_between_modules() -> None:
    exempt = known()
    graph = {m: {t for t in ts if (m, t) not in exempt} for m, ts in import_graph().items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(reversed(exc.args[1]))}") from None


def test_every_import_between_parts_is_allowed() -> None:
    wrong = []
    for importer, targets in import_graph().items():
        source = part(importer)
        assert source in ALLOWED, f"{source} is a new part: give it a row in ALLOWED"
        for target in sorted(targets):
            into = part(target)
            if into == source or (importer, target) in known():
                continue
            if into not in ALLOWED[source] and "*" not in ALLOWED[source]:
                wrong.append(f"{importer} -> {target} ({source} may not import {into})")
    assert not wrong, "imports against docs/architecture.md:\n" + "\n".join(wrong)


def test_known_violations_are_still_in_the_code() -> None:
    graph = import_graph()
    gone = [(i, t, item) for i, t, item in KNOWN_VIOLATIONS if t not in graph.get(i, set())]
    assert not gone, f"fixed: remove from KNOWN_VIOLATIONS: {gone}"


def test_the_command_line_starts_without_the_server() -> None:
    # Every `gateway mount|keys|users|jobs ...` call is a process of its own: importing the
    # node (aiohttp, the page store, the fleet) or Alembic for it doubled its start-up time.
    import subprocess
    import sys

    heavy = ["gateway.node", "gateway.service", "alembic", "aiohttp", "aiobotocore"]
    code = f"import sys, gateway.cli; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []
