"""The import graph of gateway/, read from the source with `ast`: no circle between modules
(imports inside functions and behind TYPE_CHECKING count: a hidden circle is still a circle),
and every import from one part into another goes the way docs/architecture.md draws it:
the S3 protocol on top, the service beneath it, stores and the page store at the bottom."""

from __future__ import annotations

import ast
import graphlib
import re
from collections.abc import Iterator
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

# Small top-level modules every part may share: the S3 error table, settings, logs, numbers,
# the counters, threads' OS names, a request's store time. LEAF: those of them that may sit
# under stores and the page store, which speak no S3 (a store raises its own typed errors; the
# service maps them to S3's once).
LEAF = {
    "gateway.decimals", "gateway.logs", "gateway.bounded", "gateway.threadnames", "gateway.timing"
}  # fmt: skip
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
    # /metrics reads the workers' shared folder that `serve` names (gateway.datadir); the one
    # door for administration (ops.py) checks policies (iam) and writes jobs (gateway.jobs).
    "gateway.admin": {"gateway.service", "gateway.datadir", "gateway.iam", "gateway.jobs"}
    | BELOW_THE_SERVICE
    | BASE,
    # Preload jobs drive the Reader (serve_block) like a client would, and check the API's
    # signatures with the S3 layer's SigV4 verifier (and who is an admin key, with iam's rule).
    "gateway.jobs": {"gateway.service", "gateway.s3", "gateway.iam"} | BELOW_THE_SERVICE | BASE,
    # The operator console: pages over the service's mounts, the jobs, the built-in policies,
    # and the database beneath; its changes through the one door for administration.
    "gateway.console": {"gateway.service", "gateway.jobs", "gateway.iam", "gateway.admin"}
    | BELOW_THE_SERVICE
    | BASE,
    "gateway.edge": {"gateway.s3"} | BASE,  # the HTTP server's limits, answered as S3 errors
    # The node's own HTTP server, and uvicorn's protocol as the fallback: the edge's limits.
    "gateway.server": {"gateway.edge"} | BASE,
    "gateway.edge_uvicorn": {"gateway.edge"} | BASE,
    # Runs in training jobs, apart from any node: reads block files as the page store wrote
    # them, and finds owners with the nodes' own placement function.
    "gateway.client": {"gateway.cache", "gateway.cluster", "gateway.bounded"},
    "gateway.node": EVERYTHING,  # builds a node out of the parts
    "gateway.generations": set(),
    "gateway.datadir": set(),  # the data dir's modes and metrics folder, for `serve` (cli)
    "gateway.cli": EVERYTHING,
    "gateway": set(),
    "gateway.errors": set(),
    "gateway.config": set(),
    "gateway.decimals": set(),
    "gateway.logs": set(),
    "gateway.bounded": set(),
    "gateway.threadnames": set(),
    "gateway.timing": set(),
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


# -- seams held by tests (issue 41) ------------------------------------------------------------

# Imports of another part's private module instead of its face (its __init__), as today: this
# list may only shrink. A new reach past a face fails the test; an entry the code no longer
# has fails it too, so the list is cut as the reaches go.
PAST_THE_FACE: set[tuple[str, str]] = {
    ("gateway.catalog.catalog", "gateway.meta.catalog"),
    ("gateway.catalog.catalog", "gateway.meta.store"),
    ("gateway.catalog.crawl", "gateway.meta.catalog"),
    ("gateway.catalog.crawl", "gateway.meta.store"),
    ("gateway.catalog.crawl", "gateway.meta.versions"),
    ("gateway.catalog.listing", "gateway.meta.versions"),
    ("gateway.catalog.parallel", "gateway.meta.catalog"),
    ("gateway.catalog.parallel", "gateway.meta.store"),
    ("gateway.catalog.parallel", "gateway.meta.versions"),
    ("gateway.catalog.upkeep", "gateway.meta.catalog"),
    ("gateway.catalog.upkeep", "gateway.meta.store"),
    ("gateway.cli.jobs", "gateway.jobs.client"),
    ("gateway.cli.jobs", "gateway.jobs.commands"),
    ("gateway.cli.jobs", "gateway.jobs.model"),
    ("gateway.cli.options", "gateway.meta.engine"),
    ("gateway.cli.serve", "gateway.service.learnt"),
    ("gateway.cli.serve", "gateway.service.listed"),
    ("gateway.cli.sync", "gateway.service.namespace"),
    ("gateway.client.fs", "gateway.cache.blockfile"),
    ("gateway.client.local", "gateway.cache.blockfile"),
    ("gateway.client.routing", "gateway.cluster.placement"),
    ("gateway.cluster.membership", "gateway.meta.engine"),
    ("gateway.cluster.registry", "gateway.meta.store"),
    ("gateway.cluster.registry", "gateway.meta.tables"),
    ("gateway.console.figures", "gateway.cluster.registry"),
    ("gateway.console.routes", "gateway.cluster.registry"),
    ("gateway.console.routes", "gateway.jobs.db"),
    ("gateway.console.routes", "gateway.jobs.model"),
    ("gateway.console.routes", "gateway.jobs.progress"),
    ("gateway.console.routes", "gateway.service.shared"),
    ("gateway.edge", "gateway.s3.http"),
    ("gateway.jobs.api", "gateway.s3.sigv4"),
    ("gateway.jobs.db", "gateway.meta.store"),
    ("gateway.jobs.db", "gateway.meta.tables"),
    ("gateway.jobs.unpin", "gateway.cluster.placement"),
    ("gateway.jobs.warm", "gateway.cluster.placement"),
    ("gateway.meta.store", "gateway.stores.base"),
    ("gateway.meta.uploads", "gateway.stores.base"),
    ("gateway.node", "gateway.admin.metrics"),
    ("gateway.node", "gateway.admin.routes"),
    ("gateway.node", "gateway.catalog.upkeep"),
    ("gateway.node", "gateway.cluster.identity"),
    ("gateway.node", "gateway.cluster.membership"),
    ("gateway.node", "gateway.cluster.peer_api"),
    ("gateway.node", "gateway.cluster.peers"),
    ("gateway.node", "gateway.cluster.placement"),
    ("gateway.node", "gateway.cluster.registry"),
    ("gateway.node", "gateway.jobs.api"),
    ("gateway.node", "gateway.jobs.db"),
    ("gateway.node", "gateway.jobs.runner"),
    ("gateway.node", "gateway.meta.secrets"),
    ("gateway.node", "gateway.s3.app"),
    ("gateway.node", "gateway.s3.http"),
    ("gateway.node", "gateway.s3.local"),
    ("gateway.node", "gateway.service.namespace"),
    ("gateway.node", "gateway.service.reads"),
    ("gateway.node", "gateway.service.shared"),
    ("gateway.service.authz", "gateway.iam.actions"),
    ("gateway.service.authz", "gateway.iam.grammar"),
    ("gateway.service.authz", "gateway.iam.wildcard"),
    ("gateway.service.conditions", "gateway.stores.base"),
    ("gateway.service.metadata", "gateway.stores.base"),
    ("gateway.service.loads", "gateway.cache.layout"),
    ("gateway.service.loads", "gateway.stores.etags"),
    ("gateway.service.multipart", "gateway.meta.uploads"),
    ("gateway.service.namespace", "gateway.meta.engine"),
    ("gateway.service.namespace", "gateway.meta.models"),
    ("gateway.service.namespace", "gateway.meta.secrets"),
    ("gateway.service.opening", "gateway.cluster.peers"),
    ("gateway.service.opening", "gateway.cluster.placement"),
    ("gateway.service.plan", "gateway.cluster.placement"),
    ("gateway.service.host_reads", "gateway.cache.layout"),
    ("gateway.service.reads", "gateway.cluster.peers"),
    ("gateway.service.reads", "gateway.cluster.placement"),
    ("gateway.service.reads", "gateway.stores.base"),
    ("gateway.service.shared", "gateway.cluster.peers"),
    ("gateway.service.sources", "gateway.cluster.peers"),
    ("gateway.service.store_errors", "gateway.stores.base"),
    ("gateway.service.version_rows", "gateway.meta.versions"),
    ("gateway.service.versions", "gateway.catalog.catalog"),
    ("gateway.service.versions", "gateway.cluster.peers"),
    ("gateway.service.versions", "gateway.stores.etags"),
}

# Modules over MAX_LINES, as today: this list may only shrink (split by idea, not by count).
MAX_LINES = 700
OVER_MAX_LINES = {
    "gateway.cache.fills",
    "gateway.cache.pages",
}


def _is_package(name: str) -> bool:
    return (GATEWAY.parent / name.replace(".", "/")).is_dir()


def test_imports_across_parts_name_the_part_s_face() -> None:
    reaches = {
        (m, t)
        for m, ts in import_graph().items()
        for t in ts
        if part(m) != part(t) and t != part(t) and _is_package(part(t))
    }
    new = sorted(reaches - PAST_THE_FACE)
    assert not new, f"imports past a part's face (import what its __init__ exports): {new}"
    gone = sorted(PAST_THE_FACE - reaches)
    assert not gone, f"no longer in the code: take them off PAST_THE_FACE: {gone}"


def test_no_module_is_over_700_lines_but_those_listed() -> None:
    lines = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    over = {name for name, n in lines.items() if n > MAX_LINES}
    new = sorted(over - OVER_MAX_LINES)
    assert not new, f"modules over {MAX_LINES} lines (split them by idea): {new}"
    gone = sorted(OVER_MAX_LINES - over)
    assert not gone, f"no longer over {MAX_LINES} lines: take them off OVER_MAX_LINES: {gone}"


def test_no_module_of_the_command_line_is_over_400_lines() -> None:
    # A module per command group (gateway/cli/): one that grows past this holds two ideas.
    lines = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    over = {name: n for name, n in lines.items() if part(name) == "gateway.cli" and n > 400}
    assert not over, f"split these by idea: {over}"


def test_only_the_version_authority_reads_and_writes_version_rows() -> None:
    """One authority per question: the rows of object versions are written by the one writer
    (gateway.meta.versions' functions, called by VersionRows and the catalog's crawl), and
    VersionRows is used by the version authority alone (Shared builds it)."""
    graph = import_graph()
    rows_users = {m for m, ts in graph.items() if "gateway.service.version_rows" in ts}
    assert rows_users <= {"gateway.service.versions", "gateway.service.shared"}, rows_users
    table_users = {m for m, ts in graph.items() if "gateway.meta.versions" in ts}
    allowed = {"gateway.service.version_rows", "gateway.catalog.crawl", "gateway.catalog.listing",
               "gateway.catalog.parallel"}  # fmt: skip
    strays = {m for m in table_users if part(m) != "gateway.meta" and m not in allowed}
    assert not strays, f"reading or writing version rows past the authority: {strays}"


# -- jobs load through one face of the service (issue 41) -------------------------------------

# The Reader's parts a preload job reached for (14 reaches at 49f6275): the service's to change.
READER_PARTS = {"pages", "fills", "versions", "fleet", "shared"}


def test_jobs_load_through_one_face_of_the_service() -> None:
    """A preload job asks the service's `Loads` (a bucket's mount, a key's version, a block
    warmed here or at a peer, the fill budget, an unpin) and never the Reader or its parts:
    the page store, the fills, the version authority and the fleet change beneath it."""
    reaches = []
    for name, path in modules().items():
        if part(name) != "gateway.jobs":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in READER_PARTS:
                receiver = ast.unparse(node.value)
                if receiver.split(".")[-1] in {"reader", "_reader"}:
                    reaches.append(f"{name}: {receiver}.{node.attr}")
    assert not reaches, f"jobs reach into the Reader's parts (ask gateway.service.Loads): {reaches}"
    deep = sorted(
        (m, t)
        for m, ts in import_graph().items()
        if part(m) == "gateway.jobs"
        for t in ts
        if part(t) in {"gateway.service", "gateway.cache"} and t != part(t)
    )
    assert not deep, f"jobs import the service or the cache past their faces: {deep}"


# -- one door for administration (issue 41) ----------------------------------------------------

# The MetaStore's writes of what every request depends on: mounts, users, keys, policies.
ADMIN_WRITES = {
    "add_mount", "set_mount_option", "remove_mount", "create_key", "delete_key",
    "set_key_disabled", "create_user", "delete_user", "create_policy", "delete_policy",
    "attach_policy", "detach_policy", "set_bucket_policy",
}  # fmt: skip
# JobStore's writes; their names are common (a task's cancel, a pool's submit), so a call
# counts when its receiver is named for a store or for jobs (`self._store`, `self._jobs`).
JOB_WRITES = {"submit", "cancel"}
THE_DOOR = "gateway.admin.ops"
# What the doors call the Administration they hold (its methods bear the writes' names).
DOOR_NAMES = {"ops", "admin", "self._admin", "self._door"}


def admin_write_calls() -> set[tuple[str, str]]:
    """(module, method) for each call of an administration write outside the database's own
    packages (gateway.meta, and gateway.jobs.db, where they are defined), but on the
    Administration a door holds."""
    found = set()
    for name, path in modules().items():
        if part(name) == "gateway.meta" or name == "gateway.jobs.db":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            method = node.func.attr
            receiver = ast.unparse(node.func.value).lower()
            if receiver in DOOR_NAMES:
                continue
            if method in ADMIN_WRITES or (
                method in JOB_WRITES and ("store" in receiver or "job" in receiver)
            ):
                found.add((name, method))
    return found


def test_only_the_door_for_administration_writes_mounts_tenants_keys_and_jobs() -> None:
    """The CLI, the console and the jobs API change mounts, users, keys, policies and jobs
    through gateway/admin/ops.py alone, so that each check is made once, the same for all."""
    strays = sorted(
        (module, method) for module, method in admin_write_calls() if module != THE_DOOR
    )
    assert not strays, f"administration written past gateway/admin/ops.py: {strays}"
    door = {method for module, method in admin_write_calls() if module == THE_DOOR}
    assert door == ADMIN_WRITES | JOB_WRITES, door


def test_loggers_are_named_by_their_module() -> None:
    # A logger named by hand drifts from where its lines come from (44 did): each module logs
    # as itself (getLogger(__name__)); the access log's channel is written by logs.py alone.
    named = re.compile(r"""getLogger\(\s*["']gateway\.""")
    found = [
        str(path.relative_to(GATEWAY.parent))
        for path in sorted(GATEWAY.rglob("*.py"))
        if named.search(path.read_text())
    ]
    assert found == []


# -- the cache's parts own their state (issue 41) ----------------------------------------------

CACHE = GATEWAY / "cache"
_CONTAINERS = {"dict", "set", "list", "OrderedDict", "defaultdict", "deque"}


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text(), str(path))
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _own_attributes(cls: ast.ClassDef) -> dict[str, ast.expr]:
    """`self.<name> = value` in the class's __init__, by name."""
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    found: dict[str, ast.expr] = {}
    for node in ast.walk(init):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                found[target.attr] = node.value  # type: ignore[union-attr]
    return found


def _is_container(value: ast.expr) -> bool:
    if isinstance(value, ast.Dict | ast.Set | ast.List | ast.DictComp | ast.SetComp | ast.ListComp):
        return True
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in _CONTAINERS
    )


def _named_privates(path: Path, privates: set[str]) -> list[str]:
    """`x.<private>` of another object than self, for these private names."""
    return sorted(
        f"{path.name}:{node.lineno} {ast.unparse(node)}"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute)
        and node.attr in privates
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    )


def test_the_fills_and_the_page_store_keep_their_own_state() -> None:
    """Fills keeps its table of fills in flight, PageStore its storage's state: each makes its
    own tables and keeps them private, and neither names the other's private attributes. The
    page store asks the fills one question (set_filling: is this entry being filled?); the
    two once shared one dict (`Fills._fills = pages.busy`)."""
    pages = _own_attributes(_class(CACHE / "pages.py", "PageStore"))
    fills = _own_attributes(_class(CACHE / "fills.py", "Fills"))
    wrong = []
    for owner, attributes in (("PageStore", pages), ("Fills", fills)):
        for name, value in attributes.items():
            if _is_container(value) and not name.startswith("_"):
                wrong.append(f"{owner}.{name}: a table of its own, public")
            if isinstance(value, ast.Attribute) and name.startswith("_"):
                wrong.append(f"{owner}.{name} = {ast.unparse(value)}: another's state as its own")
    wrong += _named_privates(CACHE / "fills.py", {n for n in pages if n.startswith("_")})
    wrong += _named_privates(CACHE / "pages.py", {n for n in fills if n.startswith("_")})
    assert not wrong, "the cache's parts reach into each other's state:\n" + "\n".join(wrong)


# What the janitor may take from policy.py: the interface, not a policy of its own choosing.
POLICY_FACE = {"Policy", "PolicyFigures", "Victim", "Entry", "create"}


def test_the_janitor_builds_its_eviction_policy_in_one_place() -> None:
    """The janitor knows the eviction policy by its interface (policy.Policy) and builds it by
    name in one place (policy.create, called once), as Alluxio's CacheEvictor.create: it
    constructed the SLRU itself three times."""
    path = CACHE / "janitor.py"
    tree = ast.parse(path.read_text(), str(path))
    policy_classes = {
        n.name
        for n in ast.parse((CACHE / "policy.py").read_text()).body
        if isinstance(n, ast.ClassDef)
    }
    taken = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "gateway.cache.policy"
        for alias in node.names
    }
    assert taken <= POLICY_FACE, f"the janitor takes more than the policy's face: {taken}"
    calls = [
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    ]
    built = [name for name in calls if name in policy_classes]
    assert not built, f"the janitor builds a policy class itself: {built}"
    assert calls.count("create") == 1, "the janitor builds its policy in one place"
