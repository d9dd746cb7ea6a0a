"""The plain-ASGI fallback (`gateway serve --server uvicorn`) in every suite run: a few of the
suite's own tests, imported from their modules, against one uvicorn node (plain HTTP, a
worker per core under uvicorn's supervisor) instead of the default server's.

The whole of tests/e2e runs on uvicorn with GATEWAY_TEST_SERVER=uvicorn (tests/README.md);
that takes as long as the suite, so it is run by hand, and this module is the guard kept in
between: object writes and reads with boto3, multipart, presigned URLs both ways, aws-chunked
bodies (unsigned with a trailer, and signed chunks), ranges, conditional GETs and writes, and
cache hits (answered at the edge, in uvicorn's protocol, where they can be).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_s3_details import (
    test_put_with_transfer_encoding_chunked_and_aws_chunked_body_is_accepted,
    test_put_with_transfer_encoding_chunked_and_signed_chunks_is_accepted,
)
from tests.e2e.test_s3_read import (
    BODY,
    test_conditional_headers,
    test_presigned_get_with_plain_http_client,
    test_ranged_get,
    test_second_read_makes_no_origin_request,
)
from tests.e2e.test_s3_write import (
    test_conditional_writes,
    test_put_over_plain_http_with_signed_payload,
    test_put_then_get_round_trip_with_attributes,
    test_read_after_write_is_a_hit_with_no_origin_request,
    test_upload_file_multipart_and_its_etag,
)
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

__all__ = [
    "test_conditional_headers",
    "test_conditional_writes",
    "test_presigned_get_with_plain_http_client",
    "test_put_over_plain_http_with_signed_payload",
    "test_put_then_get_round_trip_with_attributes",
    "test_put_with_transfer_encoding_chunked_and_aws_chunked_body_is_accepted",
    "test_put_with_transfer_encoding_chunked_and_signed_chunks_is_accepted",
    "test_ranged_get",
    "test_read_after_write_is_a_hit_with_no_origin_request",
    "test_second_read_makes_no_origin_request",
    "test_upload_file_multipart_and_its_etag",
]

ORIGIN = "origin-uvicorn"


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    """One uvicorn node with the buckets the imported tests name: `s3w` and `filew` (written
    to), and `data` (read: the objects of test_s3_read's origin that its tests read)."""
    origin_s3.create_bucket(Bucket=ORIGIN)
    origin_s3.put_object(
        Bucket=ORIGIN,
        Key="ds/obj.bin",
        Body=BODY,
        ContentType="application/x-test",
        Metadata={"origin": "moto", "epoch": "3"},
    )
    origin_s3.put_object(Bucket=ORIGIN, Key="ds/plus+sign.txt", Body=b"ds/plus+sign.txt")
    files = module_dir / "files"
    files.mkdir()
    node = start_gateway(module_dir / "node", server="uvicorn")
    try:
        assert "Started parent process" in node.log()  # uvicorn's supervisor, not the own one
        opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
        node.cli("mount", "add", "s3w", f"s3://{ORIGIN}/pre", *opts)
        node.cli("mount", "add", "filew", files.as_uri())
        node.cli("mount", "add", "data", f"s3://{ORIGIN}/ds", *opts)
        eventually(lambda: node.buckets() >= {"s3w", "filew", "data"})
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def plain(node: GatewayNode) -> GatewayNode:
    """test_s3_write's node over plain HTTP: this module's node is one."""
    assert node.url.startswith("http://")
    return node


@pytest.fixture(params=["s3w", "filew"])
def bucket(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_hits_answered_at_the_edge_are_counted_exactly_at_a_scrape(node: GatewayNode) -> None:
    """uvicorn's protocol counts its edge answers as plain numbers published with the request
    metrics (gateway/edge.py), as the own server does: a scrape still sees every one, from
    whichever worker answered it."""
    url = node.client().generate_presigned_url(
        "get_object", Params={"Bucket": "data", "Key": "obj.bin"}, ExpiresIn=3600
    )
    for _ in range(3):  # cached in each worker that answers, then answered at the edge
        assert httpx.get(url).content == BODY
    fast = node.metric("gateway_edge_fast_answers")
    for _ in range(20):  # a new connection each: either worker may take it
        assert httpx.get(url).content == BODY
    # The workers that answered only from their memory tier answered at the edge; a worker
    # that had not read it yet answered on the full path: at least 20 - 3 on the edge.
    assert fast + 17 <= node.metric("gateway_edge_fast_answers") <= fast + 20
