"""Membership on SQLite and PostgreSQL: nodes see each other, NOTIFY spreads changes at once,
silent nodes lapse, stopped nodes leave, an outage freezes the live set; `gateway status`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from click.testing import CliRunner

from gateway.cli import main
from gateway.cluster import (
    Membership,
    MountLine,
    Node,
    NodeFigures,
    NodeRegistry,
    Placement,
    block_key,
    local_node,
    node_id,
)
from gateway.config import Settings
from gateway.meta import MetaStore, SecretBox
from tests.support.net import eventually_async, free_port
from tests.support.postgres import database_outage, temp_database

pytestmark = pytest.mark.anyio


def open_store(url: str) -> MetaStore:
    return MetaStore(url, SecretBox([SecretBox.generate_key()]))


@pytest.fixture
async def meta(database_url: str) -> AsyncIterator[MetaStore]:
    async with open_store(database_url) as store:
        await store.migrate()
        yield store


@pytest.fixture
def pg_url() -> Iterator[str]:
    with temp_database() as url:
        yield url


@pytest.fixture
async def pg_meta(pg_url: str) -> AsyncIterator[MetaStore]:
    async with open_store(pg_url) as store:
        await store.migrate()
        yield store


class Member:
    """A Membership and every placement it published."""

    def __init__(self, meta: MetaStore, name: str, interval: float, timeout: float) -> None:
        self.placements: list[Placement] = []
        self.membership = Membership(
            meta,
            Node(name, f"{name}.peers:9001"),
            interval=interval,
            timeout=timeout,
            on_change=self.placements.append,
        )

    def ids(self) -> set[str]:
        return {node.id for node in self.membership.live()}

    def published(self) -> set[str]:
        return {node.id for node in self.placements[-1].nodes}

    def sees(self, *ids: str) -> Callable[[], bool]:
        return lambda: self.ids() == set(ids)


StartMember = Callable[..., Awaitable[Member]]


@pytest.fixture
async def fleet() -> AsyncIterator[StartMember]:
    """Starts Members; every one still running is stopped at the end, pass or fail."""
    async with AsyncExitStack() as stack:

        async def start(
            meta: MetaStore, name: str, *, interval: float = 0.2, lapse: float = 2.0
        ) -> Member:
            member = Member(meta, name, interval, lapse)
            await member.membership.start()
            stack.push_async_callback(member.membership.stop)
            return member

        yield start


async def test_members_see_each_other_and_agree_on_owners(
    meta: MetaStore, fleet: StartMember
) -> None:
    members = [await fleet(meta, name) for name in ("a", "b", "c")]
    for member in members:
        await eventually_async(member.sees("a", "b", "c"))
        assert member.published() == {"a", "b", "c"}
    keys = [block_key(1, f"k{i}", "e", 0) for i in range(200)]
    owners = [[m.membership.placement.owners(k, 2) for k in keys] for m in members]
    assert owners[0] == owners[1] == owners[2]


async def test_join_and_leave_are_heard_at_once_through_notify(
    pg_meta: MetaStore, fleet: StartMember
) -> None:
    # Polling every 30 s: only a notification can make these changes visible in time.
    a = await fleet(pg_meta, "a", interval=30.0, lapse=60.0)
    b = await fleet(pg_meta, "b", interval=30.0, lapse=60.0)
    # Well below the 30 s poll: only a notification can have brought each change.
    await eventually_async(a.sees("a", "b"), timeout=10.0)
    await b.membership.stop()
    await eventually_async(a.sees("a"), timeout=10.0)
    assert a.published() == {"a"}


async def test_a_lost_listen_connection_is_reopened(
    pg_url: str, pg_meta: MetaStore, fleet: StartMember
) -> None:
    a = await fleet(pg_meta, "a", interval=30.0, lapse=60.0)
    admin = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    listening = (
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
    )
    try:
        (killed,) = [row["pid"] for row in await admin.fetch(listening)]
        await admin.execute("SELECT pg_terminate_backend($1)", killed)
        pids: list[int] = []

        async def relistened() -> bool:
            pids[:] = [row["pid"] for row in await admin.fetch(listening)]
            return bool(pids) and killed not in pids

        await eventually_async(relistened)
    finally:
        await admin.close()
    await fleet(pg_meta, "b", interval=30.0, lapse=60.0)
    await eventually_async(a.sees("a", "b"), timeout=10.0)  # by NOTIFY: the poll is 30 s away


async def test_a_silent_node_lapses_after_the_timeout(meta: MetaStore, fleet: StartMember) -> None:
    timeout, interval = 30.0, 29.0
    # A node that joined and then never heartbeated again, as a crashed one looks: its last
    # heartbeat is 28.5 s old, so that it lapses 1.5 s from now by the database's clock.
    ago = datetime.now(UTC) - timedelta(seconds=timeout - 1.5)
    ghost = NodeRegistry(meta.engine, timeout, clock=lambda: ago)
    await ghost.join(Node("ghost", "ghost:9001"), NodeFigures())
    a = await fleet(meta, "a", interval=interval, lapse=timeout)
    assert "ghost" in a.ids()
    # The next poll is 29 s away: only the lapse a awaits can drop the ghost in time.
    await eventually_async(lambda: "ghost" not in a.ids(), timeout=15.0)
    (record,) = [r for r in await ghost.read() if r.node.id == "ghost"]
    assert record.age >= timeout and not record.live  # not before the timeout
    assert a.published() == {"a"}


async def test_stop_leaves_at_once(meta: MetaStore, fleet: StartMember) -> None:
    a = await fleet(meta, "a", interval=0.2, lapse=60.0)
    b = await fleet(meta, "b", interval=0.2, lapse=60.0)
    await eventually_async(a.sees("a", "b"))
    await b.membership.stop()
    await eventually_async(a.sees("a"))  # far below the 60 s timeout: b said it left
    records = {r.node.id: r for r in await NodeRegistry(meta.engine, 60.0).read()}
    assert records["b"].status == "left"
    assert records["a"].status == "up"


async def test_database_outage_keeps_the_live_set_and_recovers(
    pg_url: str, pg_meta: MetaStore, fleet: StartMember, caplog: pytest.LogCaptureFixture
) -> None:
    a = await fleet(pg_meta, "a", interval=0.2, lapse=0.8)
    b = await fleet(pg_meta, "b", interval=0.2, lapse=0.8)
    await eventually_async(lambda: a.ids() == b.ids() == {"a", "b"})
    published = len(a.placements), len(b.placements)
    outage = database_outage(pg_url)
    await asyncio.to_thread(outage.__enter__)  # it runs an event loop of its own
    try:
        await eventually_async(lambda: len(unavailable(caplog)) >= 2)  # both have noticed
        # What is under test is time passing: well past the heartbeat timeout, with the
        # database (and its clock, which judges lapses) away, nobody lapses.
        await asyncio.sleep(2.0)
        assert a.ids() == b.ids() == {"a", "b"}
        assert (len(a.placements), len(b.placements)) == published
    finally:
        await asyncio.to_thread(outage.__exit__, None, None, None)
    # Back: the heartbeats resume before anyone counts as lapsed, and joins are seen again.
    c = await fleet(pg_meta, "c", interval=0.2, lapse=0.8)
    for member in (a, b, c):
        await eventually_async(member.sees("a", "b", "c"))
    for member, before in zip((a, b), published, strict=True):
        # Never dropped and taken back: the placement would have moved for nothing.
        assert all({"a", "b"} <= {n.id for n in p.nodes} for p in member.placements[before:])
    records = await NodeRegistry(pg_meta.engine, 0.8).read()
    assert [r.node.id for r in records if r.live] == ["a", "b", "c"]


async def test_a_node_without_its_database_runs_alone(
    backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if backend == "sqlite":
        (tmp_path / "not-a-dir").write_text("")
        url = f"sqlite:///{tmp_path / 'not-a-dir' / 'gateway.db'}"
    else:
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/gateway"
    async with open_store(url) as store:
        member = Member(store, "alone", interval=0.1, timeout=1.0)
        await member.membership.start()
        await eventually_async(lambda: unavailable(caplog))  # a heartbeat has failed
        assert member.ids() == member.published() == {"alone"}
        owners = member.membership.placement.owners(block_key(1, "k", "e", 0))
        assert [node.id for node in owners] == ["alone"]
        await member.membership.stop()


def unavailable(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The warnings that a member found the database away."""
    return [r for r in caplog.records if r.getMessage().startswith("fleet database unavailable")]


def test_interval_must_be_below_the_timeout(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'gateway.db'}")
    with pytest.raises(ValueError, match="interval < timeout"):
        Membership(store, Node("a", "a:1"), interval=5.0, timeout=5.0)


# -- gateway status


def test_status_lists_the_fleet(database_url: str, tmp_path: Path) -> None:
    async def setup() -> None:
        async with open_store(database_url) as store:
            await store.migrate()
            # A timeout far longer than the test (a busy machine takes seconds to run the CLI),
            # and a heartbeat written already older than it.
            registry = NodeRegistry(store.engine, 600)
            ago = datetime.now(UTC) - timedelta(seconds=601)
            silent = NodeRegistry(store.engine, 600, clock=lambda: ago)
            await silent.join(Node("c-silent", "c:9001", 1.0), NodeFigures())
            mount = MountLine("data", 5 << 20, 1 << 20, 64 << 20, 3, 1, 7)
            figures = NodeFigures(
                5 << 20, 3, 1, capacity_bytes=64 << 20, pinned_bytes=1 << 20, preload_fills=7,
                mounts=(mount,),
            )  # fmt: skip
            await registry.join(Node("a-up", "a:9001", 20.0, "eu-1a"), figures)
            await registry.join(Node("b-gone", "b:9001", 10.0), NodeFigures())
            await registry.leave("b-gone")

    asyncio.run(setup())
    args = ["status", "--database-url", database_url, "--data-dir", str(tmp_path)]
    runner = CliRunner()
    out = runner.invoke(main, [*args, "--json", "--heartbeat-timeout", "600"])
    assert out.exit_code == 0, out.output
    rows = {row["id"]: row for row in json.loads(out.output)}
    assert rows["a-up"]["state"] == "up" and rows["a-up"]["live"] is True
    assert rows["a-up"]["address"] == "a:9001" and rows["a-up"]["zone"] == "eu-1a"
    assert rows["a-up"]["cache_bytes"] == 5 << 20 and rows["a-up"]["hit_ratio"] == 0.75
    # The figures a heartbeat writes besides (migration 0012), the node's and its mounts'.
    assert rows["a-up"]["capacity_bytes"] == 64 << 20 and rows["a-up"]["pinned_bytes"] == 1 << 20
    assert rows["a-up"]["preload_fills"] == 7
    assert rows["a-up"]["mounts"] == [{
        "mount": "data", "cache_bytes": 5 << 20, "pinned_bytes": 1 << 20,
        "capacity_bytes": 64 << 20, "hits": 3, "misses": 1, "preload_fills": 7, "hit_ratio": 0.75,
    }]  # fmt: skip
    assert rows["a-up"]["heartbeat_age"] < 600
    assert rows["b-gone"]["state"] == "left" and rows["b-gone"]["live"] is False
    assert rows["c-silent"]["state"] == "lapsed" and rows["c-silent"]["heartbeat_age"] >= 600
    assert rows["c-silent"]["hit_ratio"] is None

    out = runner.invoke(main, [*args, "--heartbeat-timeout", "600"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split() == [
        "NODE", "ADDRESS", "ZONE", "WEIGHT", "STATE", "HEARTBEAT", "CACHED", "PINNED",
        "CAPACITY", "HITS", "MISSES", "PRELOADED", "HIT", "RATIO",
    ]  # fmt: skip
    assert lines[1].split()[:5] == ["a-up", "a:9001", "eu-1a", "20", "up"]
    figures = ["5.0", "MiB", "1.0", "MiB", "64.0", "MiB", "3", "1", "7", "75.0%"]
    assert lines[1].split()[-10:] == figures
    assert lines[2].split()[:5] == ["b-gone", "b:9001", "-", "10", "left"]
    assert lines[3].split()[4] == "lapsed"
    assert lines[4] == "1 of 3 nodes live"
    # Then each node's mounts.
    assert lines[6].split() == [
        "NODE", "MOUNT", "CACHED", "PINNED", "CAPACITY", "HITS", "MISSES", "PRELOADED", "HIT",
        "RATIO",
    ]  # fmt: skip
    assert lines[7].split() == ["a-up", "data", *figures]


def test_status_of_an_empty_fleet(tmp_path: Path) -> None:
    made = CliRunner().invoke(main, ["migrate", "--data-dir", str(tmp_path)])
    assert made.exit_code == 0, made.output  # a node's database, no node started on it
    out = CliRunner().invoke(main, ["status", "--data-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "none has joined a fleet" in out.output


# -- identity


def test_node_id_is_made_once_and_kept(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = set(pool.map(lambda _: node_id(tmp_path / "data"), range(16)))
    assert len(ids) == 1
    assert node_id(tmp_path / "data") == ids.pop()
    assert node_id(tmp_path / "data", "configured-id") == "configured-id"


def test_local_node_comes_from_the_fleet_settings(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, port=9000, advertise_host="gw-1.peers", cache_capacity=20 << 30
    )
    me = local_node(settings)
    assert me == Node(node_id(tmp_path), "gw-1.peers:9001", 20.0, "")
    tuned = Settings(
        data_dir=tmp_path, node_id="n7", advertise_host="::1", internal_port=7000, node_weight=3
    )
    assert local_node(tuned) == Node("n7", "[::1]:7000", 3.0, "")


async def test_heartbeats_write_samples_for_the_console_and_prune_old_ones(
    meta: MetaStore,
) -> None:
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    old = NodeRegistry(meta.engine, 60.0, clock=lambda: two_hours_ago)
    await old.join(Node("gone", "gone:9001"), NodeFigures(requests=7))
    registry = NodeRegistry(meta.engine, 60.0)
    figures = NodeFigures(cache_bytes=5, hits=3, misses=1, requests=9, sent_bytes=99,
                          capacity_bytes=1000)  # fmt: skip
    await registry.join(Node("a", "a:9001"), figures)
    await registry.beat(Node("a", "a:9001"), figures)  # within SAMPLE_INTERVAL: no sample
    now, rows = await registry.samples(3600.0)
    assert abs(now - datetime.now(UTC).timestamp()) < 60  # the database's clock, in epoch s
    assert [(r["node_id"], r["requests"], r["sent_bytes"], r["capacity_bytes"]) for r in rows] == [
        ("a", 9, 99, 1000)
    ]
    _, everything = await registry.samples(10 * 3600.0)
    assert {r["node_id"] for r in everything} == {"a"}  # the two-hour-old one was pruned
