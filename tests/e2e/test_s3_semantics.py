"""S3 semantics clients rely on, tried with boto3 against a `gateway serve` subprocess over a
file bucket store (buckets made by CreateBucket) and an S3 mount (moto): batch deletes that
answer per key what they did and never serve a deleted key again, conditional writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.odd_origin import OddOrigin
from tests.support.origin import CountingProxy, MotoServer

ORIGIN = "origin-semantics"
ODD = "origin-semantics-odd"
MADE = "made-semantics"  # a bucket of the file bucket store


@pytest.fixture(scope="module")
def odd(moto_server: MotoServer) -> Iterator[OddOrigin]:
    proxy = OddOrigin(moto_server.url)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def node(
    module_dir: Path, origin: CountingProxy, origin_s3: Any, odd: OddOrigin
) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    origin_s3.create_bucket(Bucket=ODD)
    buckets = module_dir / "buckets"
    buckets.mkdir()
    # A long metadata TTL: a version the node knows is served without asking the store.
    args = ("--bucket-store", buckets.as_uri(), "--metadata-ttl", "300")
    node = start_gateway(module_dir / "node", args=args)
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "s3sem", f"s3://{ORIGIN}/pre", *opts)
    odd_opts = ["-o", f"endpoint_url={odd.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "s3odd", f"s3://{ODD}", *odd_opts)
    node.client().create_bucket(Bucket=MADE)
    eventually(lambda: node.buckets() >= {"s3sem", "s3odd", MADE})
    yield node
    node.stop()


@pytest.fixture(params=[MADE, "s3sem"])
def bucket(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    r = exc.value.response
    return r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]


# -- DeleteObjects ------------------------------------------------------------------------------

# Siblings in folders that the delete of the last of them prunes (the file store has no empty
# folders): each delete races its sibling's removal of their common folder.
SIBLINGS = ["boo/bar", "boo/baz/xyzzy", "cquux/thud", "cquux/bla"]


def test_batch_delete_answers_each_key_and_never_serves_a_deleted_key(
    node: GatewayNode, bucket: str
) -> None:
    s3 = node.client()
    for round_ in range(20):
        for key in SIBLINGS:
            s3.put_object(Bucket=bucket, Key=key, Body=f"{key} {round_}".encode())
        for key in SIBLINGS:  # cached, and its version known, before the delete
            assert (
                s3.get_object(Bucket=bucket, Key=key)["Body"].read() == f"{key} {round_}".encode()
            )
        out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in SIBLINGS]})
        assert out.get("Errors", []) == [], f"round {round_}"
        assert sorted(d["Key"] for d in out["Deleted"]) == sorted(SIBLINGS)
        for key in SIBLINGS:
            with pytest.raises(ClientError) as exc:
                s3.get_object(Bucket=bucket, Key=key)
            assert _code(exc) == ("NoSuchKey", 404), f"round {round_}: {key}"
        assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_a_delete_the_store_did_but_failed_to_acknowledge_is_never_served_again(
    node: GatewayNode, odd: OddOrigin, origin_s3: Any
) -> None:
    s3 = node.client()
    keys = ["gone/a", "gone/b"]
    for key in keys:
        s3.put_object(Bucket="s3odd", Key=key, Body=b"old bytes")
        assert s3.get_object(Bucket="s3odd", Key=key)["Body"].read() == b"old bytes"
    # The store deletes each key and then answers an error, every time it is asked.
    odd.fail_next("DeleteObject", 500, "InternalError", count=20, forward=True)
    try:
        out = s3.delete_objects(Bucket="s3odd", Delete={"Objects": [{"Key": k} for k in keys]})
    finally:
        odd.reset()
    assert sorted(e["Key"] for e in out["Errors"]) == keys  # it said it failed: no Deleted
    assert "Contents" not in origin_s3.list_objects_v2(Bucket=ODD, Prefix="gone/")
    for key in keys:
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket="s3odd", Key=key)
        assert _code(exc) == ("NoSuchKey", 404)


# -- conditional writes -------------------------------------------------------------------------


def _complete(s3: Any, bucket: str, key: str, body: bytes, **cond: str) -> dict[str, Any]:
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=body)
    parts = {"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]}
    try:
        return dict(
            s3.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload, MultipartUpload=parts, **cond
            )
        )
    except ClientError:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
        raise


def test_put_if_match_of_a_missing_key_is_no_such_key_and_star_means_any_version(
    node: GatewayNode, bucket: str
) -> None:
    s3 = node.client()
    key = "cond/put-if-match"
    s3.delete_object(Bucket=bucket, Key=key)
    for etag in ('"0123456789abcdef0123456789abcdef"', "*"):
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket=bucket, Key=key, Body=b"v", IfMatch=etag)
        assert _code(exc) == ("NoSuchKey", 404)
    first = s3.put_object(Bucket=bucket, Key=key, Body=b"v1", IfNoneMatch="*")["ETag"]
    s3.put_object(Bucket=bucket, Key=key, Body=b"v2", IfMatch="*")
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key=key, Body=b"v3", IfMatch=first)  # v2 now
    assert _code(exc) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"v2"


def test_complete_multipart_upload_honours_if_none_match_and_if_match(
    node: GatewayNode, bucket: str
) -> None:
    s3 = node.client()
    key = "cond/complete"
    s3.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ClientError) as exc:
        _complete(s3, bucket, key, b"never", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert _code(exc) == ("NoSuchKey", 404)
    first = _complete(s3, bucket, key, b"first", IfNoneMatch="*")["ETag"]
    with pytest.raises(ClientError) as exc:
        _complete(s3, bucket, key, b"second", IfNoneMatch="*")
    assert _code(exc) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as exc:
        _complete(s3, bucket, key, b"second", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert _code(exc) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"first"
    _complete(s3, bucket, key, b"third", IfMatch=first)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"third"


def _slow_put(node: GatewayNode, bucket: str, key: str, headers: dict[str, str]) -> Any:
    """A PUT of 64 KiB whose first half is sent now and the rest when the returned function
    is called, which answers (status, body)."""
    import socket

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from tests.support.gateway import ACCESS_KEY, SECRET_KEY

    body = b"s" * (64 << 10)
    url = f"{node.url}/{bucket}/{key}"
    head = {**headers, "Content-Length": str(len(body))}
    req = AWSRequest(method="PUT", url=url, headers=head, data=body)  # its hash is signed
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
    lines = [f"PUT /{bucket}/{key} HTTP/1.1", f"Host: 127.0.0.1:{node.port}"]
    lines += [f"{k}: {v}" for k, v in req.headers.items() if k.lower() != "host"]
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=30)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body[: len(body) // 2])

    def rest() -> tuple[int, bytes]:
        sock.sendall(body[len(body) // 2 :])
        answer = b""
        while b"</Error>" not in answer and not answer.startswith(b"HTTP/1.1 200"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        sock.close()
        return int(answer.split(b" ", 2)[1]), answer

    return rest


def test_a_conditional_put_overtaken_by_another_write_is_a_conflict(
    node: GatewayNode, module_dir: Path
) -> None:
    """S3 answers 409 ConditionalRequestConflict when the condition held as the upload began
    and another write of the key landed before it ended (the client may send it again); 412
    when it did not hold to begin with."""
    s3 = node.client()
    folder = module_dir / "buckets" / MADE / "race"

    def streaming() -> bool:  # the first PUT's body is on its way into the store
        return folder.is_dir() and any(p.name.startswith(".") for p in folder.iterdir())

    for n, cond in enumerate(("If-None-Match", "If-Match")):
        key = f"race/{n}"
        s3.delete_object(Bucket=MADE, Key=key)
        headers, again = {"If-None-Match": "*"}, {"IfNoneMatch": "*"}
        if cond == "If-Match":
            etag = s3.put_object(Bucket=MADE, Key=key, Body=b"before")["ETag"]
            headers, again = {"If-Match": etag}, {"IfMatch": etag}
        finish = _slow_put(node, MADE, key, headers)
        eventually(streaming)
        s3.put_object(Bucket=MADE, Key=key, Body=b"the other write")
        status, answer = finish()
        assert status == 409 and b"<Code>ConditionalRequestConflict</Code>" in answer, answer
        assert s3.get_object(Bucket=MADE, Key=key)["Body"].read() == b"the other write"
        with pytest.raises(ClientError) as exc:  # now the condition fails from the start
            s3.put_object(Bucket=MADE, Key=key, Body=b"late", **again)
        assert _code(exc) == ("PreconditionFailed", 412)


def test_an_origin_s_conditional_conflict_is_answered_as_it_said(
    node: GatewayNode, odd: OddOrigin
) -> None:
    s3 = node.client()
    odd.fail_next("PutObject", 409, "ConditionalRequestConflict")
    try:
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket="s3odd", Key="race/origin", Body=b"x", IfNoneMatch="*")
    finally:
        odd.reset()
    assert _code(exc) == ("ConditionalRequestConflict", 409)
    s3.put_object(Bucket="s3odd", Key="race/origin", Body=b"x", IfNoneMatch="*")  # sent again


# -- ACLs: bucket owner enforced ----------------------------------------------------------------


def test_acls_answer_bucket_owner_enforced(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    key = "acl/object"
    s3.put_object(Bucket=bucket, Key=key, Body=b"v", ACL="bucket-owner-full-control")
    s3.put_object(Bucket=bucket, Key=key, Body=b"v", ACL="private")
    for acl in (s3.get_bucket_acl(Bucket=bucket), s3.get_object_acl(Bucket=bucket, Key=key)):
        assert [(g["Grantee"]["ID"], g["Permission"]) for g in acl["Grants"]] == [
            (acl["Owner"]["ID"], "FULL_CONTROL")
        ]
    s3.put_bucket_acl(Bucket=bucket, ACL="private")
    s3.put_object_acl(Bucket=bucket, Key=key, ACL="bucket-owner-full-control")
    owner = s3.get_bucket_acl(Bucket=bucket)["Owner"]
    policy = {
        "Owner": owner,
        "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": owner["ID"]},
                    "Permission": "FULL_CONTROL"}],
    }  # fmt: skip
    s3.put_bucket_acl(Bucket=bucket, AccessControlPolicy=policy)
    refused = [
        lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"w", ACL="public-read"),
        lambda: s3.put_bucket_acl(Bucket=bucket, ACL="public-read-write"),
        lambda: s3.put_object_acl(Bucket=bucket, Key=key, ACL="authenticated-read"),
        lambda: s3.put_object_acl(Bucket=bucket, Key=key, GrantRead='uri="everyone"'),
        lambda: s3.copy_object(
            Bucket=bucket, Key=f"{key}.copy", CopySource={"Bucket": bucket, "Key": key},
            ACL="public-read",
        ),
        lambda: s3.create_multipart_upload(Bucket=bucket, Key=key, ACL="public-read"),
        lambda: s3.put_bucket_acl(
            Bucket=bucket,
            AccessControlPolicy={**policy, "Grants": [
                {"Grantee": {"Type": "Group",
                             "URI": "http://acs.amazonaws.com/groups/global/AllUsers"},
                 "Permission": "READ"}]},
        ),
    ]  # fmt: skip
    for call in refused:
        with pytest.raises(ClientError) as exc:
            call()
        assert _code(exc) == ("AccessControlListNotSupported", 400)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"v"
    # A new bucket asked with a grant: AWS's code for it under enforced ownership.
    with pytest.raises(ClientError) as exc:
        s3.create_bucket(Bucket="acl-public-new", ACL="public-read")
    assert _code(exc) == ("InvalidBucketAclWithObjectOwnership", 400)
    with pytest.raises(ClientError) as exc:
        s3.head_bucket(Bucket="acl-public-new")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as exc:
        s3.get_object_acl(Bucket=bucket, Key="acl/none")
    assert _code(exc) == ("NoSuchKey", 404)


def test_an_empty_continuation_token_is_echoed(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    s3.put_object(Bucket=bucket, Key="token/a", Body=b"a")
    out = s3.list_objects_v2(Bucket=bucket, Prefix="token/", ContinuationToken="")
    assert out["ContinuationToken"] == ""
    assert [o["Key"] for o in out["Contents"]] == ["token/a"]
