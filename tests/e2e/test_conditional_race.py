"""Conditional writes of one key raced through two nodes over one PostgreSQL database, each
with its default workers, in front of moto (whose own If-None-Match check is not atomic): two
CompleteMultipartUpload, or two PutObject, with `If-None-Match: *` sent at once, one through
each node: in every round exactly one wins and the other is answered 412
PreconditionFailed, and the key holds the winner's bytes."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy
from tests.support.postgres import temp_database

# Two gateway processes on PostgreSQL.
pytestmark = pytest.mark.slow

ORIGIN = "origin-conditional-race"
ROUNDS = 8
PART = 6 << 20  # a part moto takes a while to put together: its check-then-write is wide open
# A body the S3 store sends as a multipart upload of its own (past REPLAY_LIMIT), completed
# with the condition.
BIG = (16 << 20) + 1


@pytest.fixture(scope="module")
def nodes(
    module_dir: Path, origin: CountingProxy, origin_s3: Any
) -> Iterator[tuple[GatewayNode, GatewayNode]]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    with temp_database() as url:
        started: list[GatewayNode] = []
        try:
            for i in range(2):
                started.append(start_gateway(module_dir / f"n{i}", database_url=url))
            opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak"]
            started[0].cli("mount", "add", "race", f"s3://{ORIGIN}", *opts, "-o", "secret_key=sk")
            for node in started:
                eventually(lambda n=node: "race" in n.buckets())
            yield started[0], started[1]
        finally:
            for node in started:
                node.stop()


def _at_once(*calls: Callable[[], bytes]) -> list[bytes | str]:
    """Each call on a thread of its own, all let go together: what each wrote, or the code
    of the error it got."""
    start = threading.Barrier(len(calls))
    outcomes: list[bytes | str] = ["" for _ in calls]

    def run(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = calls[i]()
        except ClientError as exc:
            r = exc.response
            outcomes[i] = f"{r['Error']['Code']} {r['ResponseMetadata']['HTTPStatusCode']}"

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def _one_won(outcomes: list[bytes | str], node: GatewayNode, key: str, n: int) -> None:
    won = [o for o in outcomes if isinstance(o, bytes)]
    lost = [o for o in outcomes if not isinstance(o, bytes)]
    assert len(won) == 1 and lost == ["PreconditionFailed 412"], f"round {n}: {lost}"
    assert node.client().get_object(Bucket="race", Key=key)["Body"].read() == won[0]


def test_two_conditional_completes_of_one_key_through_two_nodes_one_wins(
    nodes: tuple[GatewayNode, GatewayNode],
) -> None:
    for n in range(ROUNDS):
        key = f"complete/{n}"
        ready = []
        for i, node in enumerate(nodes):
            s3 = node.client()
            body = bytes([65 + i]) * PART
            upload = s3.create_multipart_upload(Bucket="race", Key=key)["UploadId"]
            part = s3.upload_part(Bucket="race", Key=key, UploadId=upload, PartNumber=1, Body=body)
            parts = {"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]}
            ready.append((s3, upload, parts, body))

        def complete(
            s3: Any, upload: str, parts: dict[str, Any], body: bytes, key: str = key
        ) -> bytes:
            s3.complete_multipart_upload(
                Bucket="race", Key=key, UploadId=upload, MultipartUpload=parts, IfNoneMatch="*"
            )
            return body

        outcomes = _at_once(*(lambda r=r: complete(*r) for r in ready))
        _one_won(outcomes, nodes[0], key, n)
        for s3, upload, _, _ in ready:  # the loser's upload is the client's to abort
            with contextlib.suppress(ClientError):  # not the winner's, completed
                s3.abort_multipart_upload(Bucket="race", Key=key, UploadId=upload)
        nodes[0].client().delete_object(Bucket="race", Key=key)  # moto holds it in memory


def test_two_conditional_puts_of_one_key_through_two_nodes_one_wins(
    nodes: tuple[GatewayNode, GatewayNode],
) -> None:
    for n in range(ROUNDS):
        key = f"put/{n}"

        def put(node: GatewayNode, body: bytes, key: str = key) -> bytes:
            node.client().put_object(Bucket="race", Key=key, Body=body, IfNoneMatch="*")
            return body

        outcomes = _at_once(*(lambda i=i: put(nodes[i], bytes([65 + i]) * BIG) for i in range(2)))
        _one_won(outcomes, nodes[1], key, n)
        nodes[1].client().delete_object(Bucket="race", Key=key)  # moto holds it in memory
