"""A store that goes away and comes back, seen through the gateway: cached objects go on being
served, misses answer 503 ServiceUnavailable quickly, and all works again after the restart."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually

FAST = ["max_attempts=2", "retry_deadline=1.5", "connect_timeout=0.5"]


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    node = start_gateway(module_dir / "node", args=("--metadata-ttl", "0.5"))
    yield node
    node.stop()


def _server(kind: str, folder: Path) -> tuple[Any, str, list[str]]:
    """A private server of this kind (it is killed), the mount URI and options."""
    name = f"o{uuid.uuid4().hex[:8]}"
    if kind == "azure":
        from tests.support.azurite import AzuriteServer, sdk_client

        az = AzuriteServer(folder)
        sdk_client(az).create_container(name)
        return az, f"az://{az.account}/{name}", [f"endpoint={az.url}", f"account_key={az.key}"]
    if kind == "gcs":
        import httpx

        from tests.support.gcs_server import GcsServer

        gs = GcsServer(folder)
        httpx.post(f"{gs.url}/storage/v1/b", params={"project": "t"}, json={"name": name})
        return gs, f"gs://{name}", [f"endpoint={gs.url}"]
    from tests.support.webhdfs_server import WebHdfsServer

    hd = WebHdfsServer(folder)
    (hd.root / name).mkdir()
    return hd, f"{hd.url}/{name}", ["user=gateway"]


@pytest.mark.parametrize("kind", ["azure", "gcs", "hdfs"])
def test_hits_survive_an_outage_and_misses_fail_fast(
    node: GatewayNode, tmp_path: Path, kind: str
) -> None:
    server, uri, options = _server(kind, tmp_path)
    bucket = f"out-{kind}-{uuid.uuid4().hex[:6]}"
    try:
        node.cli("mount", "add", bucket, uri, *[x for o in FAST for x in ("-o", o)], *[
            x for o in options for x in ("-o", o)
        ])  # fmt: skip
        s3 = node.client()
        eventually(lambda: s3.put_object(Bucket=bucket, Key="hot.bin", Body=b"h" * 4096))
        assert s3.get_object(Bucket=bucket, Key="hot.bin")["Body"].read() == b"h" * 4096
        server.stop()
        # Time passing is what is under test: past the metadata TTL (0.5 s) the hit must
        # revalidate, and cannot. The node is a subprocess: there is no clock to inject.
        time.sleep(0.6)
        hit = s3.get_object(Bucket=bucket, Key="hot.bin")
        assert hit["Body"].read() == b"h" * 4096
        assert hit["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
        # A miss is answered, not left hanging: within the store's retry deadline (1.5 s,
        # held by tests/unit/test_store_retry.py on an injected clock), so long before this
        # client's own read timeout, which would raise ReadTimeoutError instead.
        patient = node.client(read_timeout=30)
        with pytest.raises(ClientError) as exc:
            patient.get_object(Bucket=bucket, Key="never-seen.bin")
        assert exc.value.response["Error"]["Code"] == "ServiceUnavailable"
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        server.restart()
        s3.put_object(Bucket=bucket, Key="after.bin", Body=b"back")
        assert s3.get_object(Bucket=bucket, Key="after.bin")["Body"].read() == b"back"
    finally:
        server.stop()
