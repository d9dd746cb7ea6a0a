"""Session fixtures for every kind of test (tests/unit: in-process; tests/store: the stores on
their real servers; tests/e2e: gateway subprocesses and real clients): the real servers (moto
behind a counting proxy, Azurite, fake-gcs-server, WebHDFS) and both metadata databases."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from gateway.meta import MetaStore, SecretBox, default_database_url
from tests.support import procs
from tests.support.origin import CountingProxy, MotoServer, start_moto
from tests.support.postgres import temp_database

# Test files that take minutes (preload jobs, fleets, restarts, containers) start first,
# longest first (seconds a file, summed over its tests, from `--junitxml` of a whole run at
# 8f4e0f8). The suite runs files side by side (pytest-xdist, --dist loadfile, in the order
# collected: scripts/test turns off xdist's own reordering by test count, which put these
# files of few tests last), and a long file begun last would run alone at the end while the
# other processes have nothing left to do.
SLOW_FIRST = (
    "e2e/test_jobs_fleet_faults.py",  # 267 s
    "e2e/test_jobs_node.py",  # 174
    "e2e/test_fleet.py",  # 143
    "e2e/test_catalog.py",  # 140
    "e2e/test_node.py",  # 101
    "e2e/test_hardening2.py",  # 81
    "e2e/test_jobs_fleet.py",  # 80
    "e2e/test_container.py",  # 80
    "e2e/test_cache_faults.py",  # 75
    "e2e/test_client_failover.py",  # 75
    "store/test_store_writes.py",  # 73
    "e2e/test_cache_restart.py",  # 71
    "e2e/test_edge.py",  # 69
    "e2e/test_workers.py",  # 66
    "e2e/test_freshness.py",  # 63
    "e2e/test_s3_stores.py",  # 62
    "e2e/test_awscli_write.py",  # 59
    "e2e/test_real_origins.py",  # 55
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    last = len(SLOW_FIRST)
    items.sort(key=lambda item: rank.get(f"{item.path.parent.name}/{item.path.name}", last))


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def origin(moto_server: MotoServer) -> Iterator[CountingProxy]:
    """The S3 origin as the gateway sees it: every request it makes is counted here."""
    proxy = CountingProxy(moto_server.url)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def origin_s3(moto_server: MotoServer) -> Any:
    """A boto3 client straight to moto, to set up and change data without being counted."""
    return boto3.client(
        "s3",
        endpoint_url=moto_server.url,
        aws_access_key_id="origin-ak",
        aws_secret_access_key="origin-sk",
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Azurite (Azure Blob) on loopback for the whole session."""
    from tests.support.azurite import AzuriteServer

    server = AzuriteServer(tmp_path_factory.mktemp("azurite"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """fake-gcs-server (Google Cloud Storage) on loopback for the whole session."""
    from tests.support.gcs_server import GcsServer

    server = GcsServer(tmp_path_factory.mktemp("gcs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def webhdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The spec-faithful WebHDFS test server (NameNode + DataNode ports) for the session;
    small listing batches so that LISTSTATUS_BATCH paging is always exercised."""
    from tests.support.webhdfs_server import WebHdfsServer

    server = WebHdfsServer(tmp_path_factory.mktemp("hdfs"), batch_size=7)
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    """The metadata tests run on both databases the gateway supports."""
    return str(request.param)


@pytest.fixture
def database_url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield default_database_url(tmp_path)
    else:
        with temp_database() as url:
            yield url


@pytest.fixture
async def meta(database_url: str) -> AsyncIterator[MetaStore]:
    """A migrated metadata store on each database (a test file may define its own)."""
    async with MetaStore(database_url, SecretBox([SecretBox.generate_key()])) as store:
        await store.migrate()
        yield store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """No server process outlives the session, whatever ended its tests (a timeout that cut a
    fixture short): tests/support/procs.py."""
    procs.end_all()
