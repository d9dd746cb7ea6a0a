"""Three and more gateway processes on one PostgreSQL database: placement, forwarding, one
store fetch per block for the whole fleet, invalidation across nodes, the internal API's
authentication (and its stamps), a node killed with SIGKILL, the database going away, and a
fleet that speaks TLS end to end."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from cryptography.fernet import Fernet

from gateway.client import GatewayFileSystem
from gateway.client.routing import Routing
from gateway.cluster.registry import NodeRegistry
from gateway.cluster.stamps import AUTH_HEADER, auth_value, canonical, sign
from gateway.meta.engine import create_engine
from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually, free_port, tls_context
from tests.support.origin import CountingProxy
from tests.support.postgres import database_outage, temp_database
from tests.support.tls import CertAuthority, make_ca

# Fleets of gateway processes on PostgreSQL, a node killed with SIGKILL.
pytestmark = pytest.mark.slow

MiB = 1 << 20
BUCKET = "origin-fleet"
SECRET = "fleet-secret-for-tests"
OBJECTS = 1000


def _blob(n: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


@pytest.fixture(scope="module")
def origin_bucket(origin_s3: Any) -> str:
    origin_s3.create_bucket(Bucket=BUCKET)

    def put(i: int) -> None:
        origin_s3.put_object(Bucket=BUCKET, Key=f"small/{i:04d}", Body=_blob(1024, i))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(OBJECTS)))
    origin_s3.put_object(Bucket=BUCKET, Key="big.bin", Body=_blob(24 * MiB, -1))
    return BUCKET


class Fleet:
    def __init__(
        self,
        root: Path,
        url: str,
        origin: CountingProxy,
        size: int = 3,
        ca: CertAuthority | None = None,
        workers: int | None = None,
    ) -> None:
        self.root, self.url, self.origin = root, url, origin
        self.workers = workers
        self.ca = ca  # set: every node serves TLS, and checks its peers against this CA
        self.env = {"GATEWAY_ENCRYPTION_KEY": Fernet.generate_key().decode()}
        self.nodes: list[GatewayNode] = []
        self.internal: dict[int, int] = {}
        for _ in range(size):
            self.add()

    def add(self, issuer: CertAuthority | None = None) -> GatewayNode:
        """Start node-<i>; with TLS, its certificate is issued by `issuer` (the fleet's CA
        unless told otherwise)."""
        i = len(self.nodes)
        internal = free_port()
        args = (
            "--fleet-secret", SECRET, "--internal-port", str(internal),
            "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
            "--cache-block-size", "1MiB", "--node-id", f"node-{i}", "--no-access-log",
        )  # fmt: skip
        if self.workers is not None:
            args += ("--workers", str(self.workers))
        tls = trusted = None
        if self.ca is not None:
            issuer = issuer or self.ca
            tls, trusted = issuer.issue(self.root / f"n{i}-tls"), issuer.cert_path
            args += ("--fleet-ca", str(self.ca.cert_path))
        node = start_gateway(
            self.root / f"n{i}",
            database_url=self.url,
            env=self.env,
            args=args,
            tls=tls,
            ca=trusted,
        )
        self.nodes.append(node)
        self.internal[node.port] = internal
        return node

    def mount(self, bucket: str, *options: str) -> None:
        opts = ["-o", f"endpoint_url={self.origin.url}", "-o", "access_key=origin-ak"]
        opts += ["-o", "secret_key=origin-sk", "-o", "metadata_ttl=600"]
        for option in options:
            opts += ["-o", option]
        self.nodes[0].cli("mount", "add", bucket, f"s3://{BUCKET}", *opts)
        for node in self.nodes:
            eventually(lambda n=node: bucket in n.buckets())

    def knows(self, node: GatewayNode, ids: set[str]) -> bool:
        """Whether `node` has taken exactly `ids` into its placement (its log says so)."""
        members: set[str] = set()
        for line in node.log().splitlines():
            if '"fleet changed"' in line:
                change = json.loads(line)
                members = (members | set(change["joined"])) - set(change["left"])
        return members == ids

    def live(self) -> set[str]:
        """The live nodes as the database has them: what `gateway status --json
        --heartbeat-timeout 3` reads (its NodeRegistry), in this process, so that a test
        polling for a settled fleet starts no CLI process a look (~0.7 s of CPU each)."""

        async def read() -> set[str]:
            engine = create_engine(self.url)
            try:
                return {r.node.id for r in await NodeRegistry(engine, 3).read() if r.live}
            finally:
                await engine.dispose()

        return asyncio.run(read())

    def settled(self, ids: set[str]) -> bool:
        """Every node is live, and has heard of every other: its membership logged them."""
        return self.live() == ids and all(heard(node) == ids for node in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def heard(node: GatewayNode) -> set[str]:
    """The fleet as `node` knows it: the changes its membership logged, replayed."""
    known: set[str] = set()
    for line in node.log().splitlines():
        if '"fleet changed"' in line:
            change = json.loads(line)
            known = (known | set(change["joined"])) - set(change["left"])
    return known


@pytest.fixture(scope="module")
def fleet(module_dir: Path, origin: CountingProxy, origin_bucket: str) -> Iterator[Fleet]:
    with temp_database() as url:
        fleet = Fleet(module_dir, url, origin)
        try:
            fleet.mount("data")
            eventually(lambda: fleet.settled({f"node-{i}" for i in range(3)}))
            yield fleet
        finally:
            fleet.stop()


def _why(fleet: Fleet, origin: CountingProxy) -> tuple[Any, ...]:
    """What a test of one store request per block names when it fails: the requests made
    twice, and what the nodes warned of or changed in their fleets (a peer that failed to
    open a key makes the asking node open it itself; a placement that changed asks another
    owner)."""
    return (
        [(r.method, r.path, r.range) for r in origin.requests],
        origin.repeated(),
        [w for node in fleet.nodes for w in node.warnings()],
        [
            line
            for node in fleet.nodes
            for line in node.log().splitlines()
            if "fleet changed" in line
        ],
    )


def _get(node: GatewayNode, key: str, bucket: str = "data") -> bytes:
    return bytes(node.client().get_object(Bucket=bucket, Key=key)["Body"].read())


@pytest.mark.timeout(600)
def test_each_object_is_fetched_once_for_the_whole_fleet(
    fleet: Fleet, origin: CountingProxy
) -> None:
    origin.reset()

    def reader(node: GatewayNode) -> bool:
        keys = list(range(OBJECTS))
        random.Random(node.port).shuffle(keys)
        s3 = node.client()
        return all(
            s3.get_object(Bucket="data", Key=f"small/{i:04d}")["Body"].read() == _blob(1024, i)
            for i in keys
        )

    with ThreadPoolExecutor(3) as pool:
        assert all(pool.map(reader, fleet.nodes))
    # No node asks the store for an object's version (no HEAD: a node that knows none asks
    # the owner of block 0 to open it, one GET that tells the version with the bytes, and
    # the mount's TTL of 600 s outlasts the test); its bytes are fetched once for the fleet,
    # by its owner. An object fetched twice: which, and what the nodes warned of (a peer that
    # failed to open it makes the asking node open it itself).
    assert origin.count("GET", "/small/") == OBJECTS, _why(fleet, origin)
    assert origin.count("HEAD", "/small/") == 0, _why(fleet, origin)


def test_a_large_object_is_spread_over_the_fleet_and_fetched_once(
    fleet: Fleet, origin: CountingProxy
) -> None:
    body = _blob(24 * MiB, -1)
    origin.reset()
    for node in fleet.nodes:
        assert _get(node, "big.bin") == body
    rng = "bytes=5000000-9000000"
    got = fleet.nodes[2].client().get_object(Bucket="data", Key="big.bin", Range=rng)
    assert got["Body"].read() == body[5000000:9000001]
    assert origin.bytes_sent("GET") == 24 * MiB
    for node in fleet.nodes:  # every node filled some of its blocks
        text = httpx.get(node.url + "/metrics").text
        fills = [ln for ln in text.splitlines() if ln.startswith("gateway_cache_fills_total ")]
        assert fills and float(fills[0].split()[1]) > 0


def test_random_ranges_through_any_node_fill_only_sub_blocks_at_their_owners(
    fleet: Fleet, origin: CountingProxy, origin_s3: Any
) -> None:
    body = _blob(24 * MiB, -2)
    origin_s3.put_object(Bucket=BUCKET, Key="scattered.bin", Body=body)
    for node in fleet.nodes:
        node.client().head_object(Bucket="data", Key="scattered.bin")
    origin.reset()
    # Unaligned 1 MiB ranges in six blocks (owned by whichever nodes), each read through
    # another node than the last: most go to a peer, which decides as its reader would have.
    starts = [21 * MiB + 9, 2 * MiB + 70_000, 13 * MiB + 1, 9 * MiB + 5555, 17 * MiB + 3, 5 * MiB]
    for i, start in enumerate(starts):
        rng = f"bytes={start}-{start + MiB - 1}"
        got = fleet.nodes[i % 3].client().get_object(Bucket="data", Key="scattered.bin", Range=rng)
        assert got["Body"].read() == body[start : start + MiB]
    assert origin.bytes_sent("GET") <= 1.2 * len(starts) * MiB, origin.requests
    # The whole object through one node: each owner makes its blocks of the sub-blocks it
    # holds and the rest; no byte is fetched twice.
    assert _get(fleet.nodes[1], "scattered.bin") == body
    assert origin.bytes_sent("GET") == 24 * MiB


def test_a_cold_get_through_any_node_is_one_store_request(
    fleet: Fleet, origin: CountingProxy, origin_s3: Any
) -> None:
    # Block 0 is placed by the key alone: a node that does not know the version asks the
    # block's owner to open the object, which costs the store one GET (no HEAD before it).
    bodies = {f"cold/{i:02d}": _blob(3000 + i, 500 + i) for i in range(30)}
    for key, body in bodies.items():
        origin_s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    origin_s3.put_object(Bucket=BUCKET, Key="cold/big", Body=_blob(5 * MiB + 7, 599))
    origin.reset()
    how = []
    for i, (key, body) in enumerate(bodies.items()):
        got = fleet.nodes[i % 3].client().get_object(Bucket="data", Key=key)
        assert got["Body"].read() == body
        how.append(got["ResponseMetadata"]["HTTPHeaders"]["x-cache"])
    assert origin.count("GET", "/cold/") == len(bodies)
    assert origin.count("HEAD", "/cold/") == 0
    assert "forward" in how and "miss" in how  # opened by a peer, and by the entry node
    # The other nodes do not know the versions yet: their owner does, and answers.
    for i, (key, body) in enumerate(bodies.items()):
        assert _get(fleet.nodes[(i + 1) % 3], key) == body
    assert origin.count(None, "/cold/") == len(bodies), _why(fleet, origin)
    # A large object: one GET per block (the first told the version), none twice.
    origin.reset()
    assert _get(fleet.nodes[1], "cold/big") == _blob(5 * MiB + 7, 599)
    assert origin.count("HEAD", "/cold/") == 0
    assert origin.count("GET", "/cold/") == 6
    assert origin.bytes_sent("GET") == 5 * MiB + 7


def test_concurrent_cold_readers_on_every_node_make_one_store_request(
    fleet: Fleet, origin: CountingProxy, origin_s3: Any
) -> None:
    body = _blob(200_000, 777)
    origin_s3.put_object(Bucket=BUCKET, Key="crowd/one", Body=body)
    origin.reset()
    with ThreadPoolExecutor(9) as pool:
        got = list(pool.map(lambda i: _get(fleet.nodes[i % 3], "crowd/one"), range(9)))
    assert all(g == body for g in got)
    assert origin.count(None, "/crowd/") == 1


def test_a_client_sends_each_block_read_to_its_owner(fleet: Fleet) -> None:
    fs = GatewayFileSystem(
        skip_instance_cache=True, endpoint_url=fleet.nodes[0].url, key=ACCESS_KEY,
        secret=SECRET_KEY,
    )  # fmt: skip
    keys = sorted(fs.find("data/small"))[:90]  # the listing tells the versions
    body = _blob(24 * MiB, -1)
    for path in keys:
        assert fs.cat_file(path) == _blob(1024, int(path.rsplit("/", 1)[1]))
    assert fs.cat_file("data/big.bin", 3 * MiB, 11 * MiB + 5) == body[3 * MiB : 11 * MiB + 5]
    assert fs.stats.routed_reads >= 90 and fs.stats.fallbacks == 0

    def forwarded() -> float:
        return sum(n.metric("gateway_response_bytes", 'cache="forward"') for n in fleet.nodes)

    # Warm: every read is answered by the node that holds the block, none forwarded.
    before = forwarded()
    for path in keys:
        assert fs.cat_file(path) == _blob(1024, int(path.rsplit("/", 1)[1]))
    assert fs.cat_file("data/big.bin", 3 * MiB, 11 * MiB + 5) == body[3 * MiB : 11 * MiB + 5]
    assert forwarded() == before
    # Without routing, through one node, two reads in three take a forwarding hop.
    plain = GatewayFileSystem(
        skip_instance_cache=True, endpoint_url=fleet.nodes[0].url, key=ACCESS_KEY,
        secret=SECRET_KEY, route=False,
    )  # fmt: skip
    for path in keys:
        plain.cat_file(path)
    assert forwarded() > before


@pytest.mark.parametrize(
    ("size", "first"),
    [(700_000, 100), (6 * MiB + 5, 100), (6 * MiB + 5, MiB)],
    ids=["a-sub-block-of-one-block", "a-sub-block-of-block-0", "block-0-whole"],
)
def test_an_object_overwritten_at_the_origin_after_a_range_of_it_is_read_whole_of_the_new(
    fleet: Fleet, origin_s3: Any, size: int, first: int
) -> None:
    # A range of the version a node learnt is cached: a sub-block (a small range), or all of
    # block 0. The object is then overwritten at the origin within its TTL, behind the
    # gateway's back. A whole read makes its blocks of what is cached and the rest, which
    # the store refuses (If-Match): the refusal of a block (one made of sub-blocks at its
    # owner, or one fetched ahead, from the store or from the peer that owns it) comes
    # before the read's first byte, so it starts again on the new version and is whole,
    # through any node. It was cut after the bytes cached (IncompleteRead).
    old, new = _blob(size, 41), _blob(size - 9, 42)
    etag = f'"{hashlib.md5(old).hexdigest()}"'
    routing = Routing(GatewayFileSystem(
        skip_instance_cache=True, endpoint_url=fleet.nodes[0].url, key=ACCESS_KEY,
        secret=SECRET_KEY,
    )._placement_document)  # fmt: skip
    for i, node in enumerate(fleet.nodes):
        # Of a large object, a key none of whose blocks read ahead (1-4) the entry node owns:
        # they all come from peers (a fill here would be confirmed anyway).
        key = next(
            k
            for k in (f"behind/{size}-{first}/{i}-{n}" for n in range(256))
            if size < 2 * MiB
            or all(routing.owner("data", k, etag, b) != node.url for b in range(1, 5))
        )
        origin_s3.put_object(Bucket=BUCKET, Key=key, Body=old)
        got = node.client().get_object(Bucket="data", Key=key, Range=f"bytes=0-{first - 1}")
        assert got["Body"].read() == old[:first]
        origin_s3.put_object(Bucket=BUCKET, Key=key, Body=new)
        assert _get(node, key) == new
        assert _get(fleet.nodes[(i + 1) % 3], key) == new


def test_an_overwrite_through_one_node_is_read_new_through_another(
    fleet: Fleet, origin_s3: Any
) -> None:
    a, b = fleet.nodes[0], fleet.nodes[1]
    a.client().put_object(Bucket="data", Key="rw/obj", Body=b"old" * 1000)
    assert _get(b, "rw/obj") == b"old" * 1000  # b now trusts this version for 600 s
    a.client().put_object(Bucket="data", Key="rw/obj", Body=b"new" * 1000)
    assert _get(b, "rw/obj") == b"new" * 1000
    assert _get(fleet.nodes[2], "rw/obj") == b"new" * 1000
    a.client().delete_object(Bucket="data", Key="rw/obj")
    with pytest.raises(Exception, match="NoSuchKey"):
        _get(b, "rw/obj")


def test_nodes_of_several_workers_read_an_overwrite_new_through_every_worker(
    tmp_path: Path, origin: CountingProxy, origin_bucket: str
) -> None:
    """Two nodes of two worker processes each (the default on two cores): a write through
    one node is read new through every worker of both, though each remembers versions for
    600 s and keeps small objects in memory."""
    with temp_database() as url:
        fleet = Fleet(tmp_path, url, origin, size=2, workers=2)
        try:
            fleet.mount("data")
            eventually(lambda: fleet.settled({"node-0", "node-1"}))
            for version in (b"one" * 1000, b"two" * 1000):
                fleet.nodes[0].client().put_object(Bucket="data", Key="w/obj", Body=version)
                for node in fleet.nodes:
                    for _ in range(20):  # a new connection each: spread over the workers
                        assert _get(node, "w/obj") == version
            fleet.nodes[1].client().delete_object(Bucket="data", Key="w/obj")
            for node in fleet.nodes:
                for _ in range(20):
                    with pytest.raises(ClientError, match="NoSuchKey"):
                        _get(node, "w/obj")
        finally:
            fleet.stop()


def test_the_internal_api_refuses_requests_without_the_fleet_secret(fleet: Fleet) -> None:
    node = fleet.nodes[0]
    base = f"http://127.0.0.1:{fleet.internal[node.port]}"
    query = "m=1&k=small%2F0001&e=x&s=1024&b=1048576&i=0&a=0&z=10&p=0"
    target = f"/_fleet/block?{query}"
    assert httpx.get(base + target).status_code == 403
    forged = auth_value(b"not-the-secret", "GET", canonical("/_fleet/block", query))
    assert httpx.get(base + target, headers={AUTH_HEADER: forged}).status_code == 403
    stale = "1000.000:" + "0" * 64
    assert httpx.get(base + target, headers={AUTH_HEADER: stale}).status_code == 403
    signed = auth_value(SECRET.encode(), "GET", canonical("/_fleet/block", query))
    # Signed right, the request reaches the API (and fails on the made-up version instead).
    assert httpx.get(base + target, headers={AUTH_HEADER: signed}).status_code != 403
    # The internal routes do not exist on the public port.
    assert httpx.get(node.url + target).status_code >= 400


def test_an_old_version_is_read_by_id_through_its_blocks_owners(
    fleet: Fleet, origin: CountingProxy, origin_s3: Any
) -> None:
    """A version named by id is spread over the fleet as any version: each block fetched
    once, by its owner, which asks the store for that version (not the key's current one)."""
    bucket = "origin-fleet-versions"
    origin_s3.create_bucket(Bucket=bucket)
    origin_s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    old, new = _blob(8 * MiB, -2), _blob(3 * MiB, -3)
    v1 = origin_s3.put_object(Bucket=bucket, Key="ckpt", Body=old)["VersionId"]
    origin_s3.put_object(Bucket=bucket, Key="ckpt", Body=new)
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=origin-ak"]
    opts += ["-o", "secret_key=origin-sk"]
    fleet.nodes[0].cli("mount", "add", "versions", f"s3://{bucket}", *opts)
    for node in fleet.nodes:
        eventually(lambda n=node: "versions" in n.buckets())
    origin.reset()
    for node in fleet.nodes:
        got = node.client().get_object(Bucket="versions", Key="ckpt", VersionId=v1)
        assert got["Body"].read() == old and got["VersionId"] == v1
    assert _get(fleet.nodes[1], "ckpt", "versions") == new
    assert origin.bytes_sent("GET") == len(old) + len(new)
    fetched = [r.range for r in origin.requests if r.method == "GET" and "versionId" in r.query]
    assert len(fetched) == 8, fetched  # a block each, by whichever node owns it


def test_a_killed_node_fails_over_and_the_fleet_converges(
    tmp_path: Path, origin: CountingProxy, origin_bucket: str
) -> None:
    with temp_database() as url:
        fleet = Fleet(tmp_path, url, origin, size=3)
        try:
            fleet.mount("kill", "replicas=2")
            eventually(lambda: fleet.settled({f"node-{i}" for i in range(3)}))
            body = _blob(24 * MiB, -1)
            survivors, victim = fleet.nodes[:2], fleet.nodes[2]
            assert _get(survivors[0], "big.bin", "kill") == body

            # Reads streaming through the survivors while the victim dies.
            streaming = threading.Semaphore(0)

            def read(node: GatewayNode) -> str:
                try:
                    stream = node.client().get_object(Bucket="kill", Key="big.bin")["Body"]
                    got = stream.read(MiB)
                    streaming.release()
                    got += stream.read()
                except Exception as exc:  # a clean failure is allowed, a wrong body is not
                    streaming.release()
                    return f"failed: {type(exc).__name__}"
                return "ok" if got == body else "WRONG BYTES"

            with ThreadPoolExecutor(4) as pool:
                running = [pool.submit(read, survivors[i % 2]) for i in range(4)]
                for _ in running:  # every read has its first MiB: they are under way
                    assert streaming.acquire(timeout=30)
                victim.crash()
                outcomes = [f.result() for f in running]
            assert "WRONG BYTES" not in outcomes
            # The next reads succeed at once: the dead owner's blocks come from the next
            # replica or the store.
            for node in survivors:
                assert _get(node, "big.bin", "kill") == body
                assert _get(node, "small/0007", "kill") == _blob(1024, 7)
            # A client routing reads to owners by a placement that still names the dead node
            # retries those through its endpoint node: retries, not errors.
            fs = GatewayFileSystem(
                skip_instance_cache=True, endpoint_url=survivors[0].url, key=ACCESS_KEY,
                secret=SECRET_KEY,
            )  # fmt: skip
            fs.find("kill/small")
            for i in range(60):
                assert fs.cat_file(f"kill/small/{i:04d}") == _blob(1024, i)
            assert fs.cat_file("kill/big.bin", 5 * MiB, 9 * MiB) == body[5 * MiB : 9 * MiB]
            # And the fleet converges: the dead node leaves the placement.
            eventually(lambda: fleet.live() == {"node-0", "node-1"}, timeout=20)

            # The database goes away: reads of known mounts go on, hits and misses alike.
            with database_outage(url):
                for node in survivors:
                    assert _get(node, "big.bin", "kill") == body
                    assert _get(node, "small/0042", "kill") == _blob(1024, 42)
        finally:
            fleet.stop()


def test_the_internal_api_accepts_only_a_current_integer_stamp(fleet: Fleet) -> None:
    """Correctly signed requests whose stamp is not a whole number of seconds within the
    window are refused: `nan` never compared as expired, and float() took fractions, `+`,
    `_` and exponents."""
    node = fleet.nodes[1]
    base = f"http://127.0.0.1:{fleet.internal[node.port]}"
    query = "m=1&k=small%2F0001&e=x&s=1024&b=1048576&i=0&a=0&z=10&p=0"
    signed_target = canonical("/_fleet/block", query)

    def status(stamp: str) -> int:
        value = f"{stamp}:{sign(SECRET.encode(), 'GET', signed_target, stamp)}"
        return httpx.get(f"{base}/_fleet/block?{query}", headers={AUTH_HEADER: value}).status_code

    now = int(time.time())
    refused = [
        "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400", "-1e400", f"{now}.5",
        f"{now}.000", f"{now}e0", f"+{now}", f"{now:_}", f"0x{now:x}",
        str(now + 3600), str(now - 3600), str(now + 10**12), "", "-1",
    ]  # fmt: skip
    assert {stamp: status(stamp) for stamp in refused} == dict.fromkeys(refused, 403)
    # The same request with the time now, as peers sign it, reaches the API.
    assert status(str(int(time.time()))) != 403


@pytest.mark.timeout(600)
def test_a_fleet_runs_over_tls_and_skips_a_peer_it_cannot_trust(
    tmp_path: Path, origin: CountingProxy, origin_bucket: str
) -> None:
    ca = make_ca(tmp_path / "ca")
    with temp_database() as url:
        fleet = Fleet(tmp_path, url, origin, size=3, ca=ca)
        try:
            fleet.mount("tls")
            ids = {f"node-{i}" for i in range(3)}
            for node in fleet.nodes:
                eventually(lambda n=node: fleet.knows(n, ids))

            # Reads forwarded between nodes, over HTTPS: each object fetched once for the
            # fleet, by its owner, however many nodes read it.
            origin.reset()
            keys = range(100, 160)
            for node in fleet.nodes:
                s3 = node.client()
                for i in keys:
                    got = s3.get_object(Bucket="tls", Key=f"small/{i:04d}")["Body"].read()
                    assert got == _blob(1024, i)
            assert origin.count("GET", "/small/") == len(keys)
            for node in fleet.nodes:
                assert "peer failed" not in node.log()

            # The fleet's port speaks TLS only.
            internal = fleet.internal[fleet.nodes[0].port]
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{internal}/_fleet/block")
            secure = httpx.get(
                f"https://127.0.0.1:{internal}/_fleet/block", verify=tls_context(str(ca.cert_path))
            )
            assert secure.status_code == 403  # reached the internal API: unsigned, refused

            # A node whose certificate the fleet's CA did not issue joins the database, but
            # its peers never hand it a block: they read past it, from the store.
            stranger = make_ca(tmp_path / "other-ca", "not-the-fleet-ca")
            rogue = fleet.add(issuer=stranger)
            for node in fleet.nodes:
                eventually(lambda n=node: fleet.knows(n, ids | {"node-3"}))
            reader = fleet.nodes[0]
            s3 = reader.client()
            for i in range(200, 260):
                got = s3.get_object(Bucket="tls", Key=f"small/{i:04d}")["Body"].read()
                assert got == _blob(1024, i)
            failures = [ln for ln in reader.log().splitlines() if "peer failed" in ln]
            assert failures and all("node-3" in ln for ln in failures)
            assert any("certificate verify failed" in ln.lower() for ln in failures)
            metrics = httpx.get(rogue.url + "/metrics", verify=tls_context(str(rogue.cert)))
            fills = [
                ln
                for ln in metrics.text.splitlines()
                if ln.startswith("gateway_cache_fills_total ")
            ]
            assert fills and all(float(ln.split()[1]) == 0 for ln in fills)
        finally:
            fleet.stop()
