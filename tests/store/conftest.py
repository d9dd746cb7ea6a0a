"""The stores under test: `origin` is each kind of under-store on its real server (the session's
servers in tests/conftest.py), with the store mounted on a prefix and decoys beside it."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.origin import CountingProxy, MotoServer
from tests.support.real_origins import RcloneS3, RealS3Origin, SeaweedS3
from tests.support.stores import MOUNT_PREFIX, FileOrigin, Origin, S3Origin


@pytest.fixture(scope="module")
def proxy(moto_server: MotoServer) -> Iterator[CountingProxy]:
    """A counting proxy in front of the session's moto: what the S3 store sends is seen here."""
    p = CountingProxy(moto_server.url)
    yield p
    p.stop()


@pytest.fixture(scope="session")
def rclone_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RcloneS3]:
    server = RcloneS3(tmp_path_factory.mktemp("rclone"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


@pytest.fixture(params=["file", "s3", "azure", "gcs", "hdfs", "s3-rclone", "s3-seaweedfs"])
async def origin(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Origin]:
    """One contract, every store: each kind on its real server."""
    o: Origin
    if request.param == "file":
        (tmp_path / "root").mkdir()
        o = FileOrigin(tmp_path / "root")
    elif request.param == "s3":
        o = S3Origin(request.getfixturevalue("moto_server"), request.getfixturevalue("proxy"))
    elif request.param == "azure":
        from tests.support.azurite import AzureOrigin

        o = AzureOrigin(request.getfixturevalue("azurite"))
    elif request.param == "gcs":
        from tests.support.gcs_server import GcsOrigin

        o = GcsOrigin(request.getfixturevalue("gcs"))
    elif request.param == "s3-rclone":
        if request.module.__name__ != "tests.store.test_store_contract":
            # rclone is an origin nobody here wrote, read through the gateway: it runs the read
            # contract; its writes, tags and buckets are not what it serves for (its quirks:
            # docs/stores/s3-and-file.md).
            pytest.skip("rclone runs the read contract only")
        o = RealS3Origin(request.getfixturevalue("rclone_server"))
    elif request.param == "s3-seaweedfs":
        if request.module.__name__ != "tests.store.test_store_contract":
            # As rclone: an origin read through the gateway (its quirks: docs/stores).
            pytest.skip("SeaweedFS runs the read contract only")
        o = RealS3Origin(request.getfixturevalue("seaweed_server"))
    else:
        from tests.support.webhdfs_server import HdfsOrigin

        server = request.getfixturevalue("webhdfs")
        shutil.rmtree(server.root / MOUNT_PREFIX.split("/")[0], ignore_errors=True)
        o = HdfsOrigin(server)
    if isinstance(o, S3Origin):
        o.proxy.reset()  # a test counts only what it sends itself
    yield o
    await o.store.close()
    close = getattr(o, "close", None)
    if close is not None:
        close()


@pytest.fixture
async def s3_origin(moto_server: MotoServer, proxy: CountingProxy) -> AsyncIterator[S3Origin]:
    """The S3 store alone, for what reaches the origin on the wire."""
    o = S3Origin(moto_server, proxy)
    proxy.reset()
    yield o
    await o.store.close()
