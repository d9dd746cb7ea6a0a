"""Tenants end to end (docs/tenants.md): users with their keys and policies, buckets with
owners and bucket policies, tried with boto3, aws-cli and raw HTTP against a real node: a
second user is refused everything on the first user's bucket until a policy grants it, and
then exactly what it grants; anonymous requests only through a bucket policy or public_read;
the edge's hits decide as the full path does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import BIN, GatewayNode, start_gateway
from tests.support.net import eventually

SMALL = b"small object bytes " * 100


class Keys:
    def __init__(self, node: GatewayNode) -> None:
        self.node = node

    def make(self, user: str) -> tuple[str, str]:
        out = self.node.cli("keys", "create", "--user", user).stdout
        return out.split("access key:")[1].split()[0], out.split("secret key:")[1].split()[0]


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "shared"
    (files / "team-a").mkdir(parents=True)
    (files / "team-b").mkdir()
    (files / "team-a" / "x.txt").write_bytes(b"a's")
    (files / "team-b" / "y.txt").write_bytes(b"b's")
    (files / "top.txt").write_bytes(b"top")
    pub = module_dir / "pub"
    pub.mkdir()
    (pub / "hello.txt").write_bytes(b"hello")
    buckets = module_dir / "buckets"
    buckets.mkdir()
    # Versions trusted until the gateway itself changes them: the edge's hits below do not
    # depend on how slow a busy machine is (a version past its TTL takes the full path).
    # One worker: the last test counts the answers of the edge, which is each process's own
    # (tenants across several workers: tests/e2e/test_workers.py).
    args = ("--bucket-store", buckets.as_uri(), "--metadata-ttl", "-1", "--workers", "1")
    node = start_gateway(module_dir / "node", args=args)
    node.cli("mount", "add", "shared", files.as_uri())
    node.cli("mount", "add", "pub", pub.as_uri(), "-o", "public_read=true")
    for user in ("alice", "bob"):
        node.cli("users", "create", user)
    eventually(lambda: {"shared", "pub"} <= node.buckets())
    yield node
    node.stop()


@pytest.fixture(scope="module")
def alice(node: GatewayNode) -> Any:
    s3 = node.client(*Keys(node).make("alice"))
    s3.create_bucket(Bucket="alice-data")
    s3.put_object(Bucket="alice-data", Key="train/0001.bin", Body=SMALL)
    s3.put_object(Bucket="alice-data", Key="eval/0001.bin", Body=b"eval")
    return s3


@pytest.fixture(scope="module")
def bob(node: GatewayNode, alice: Any) -> Any:
    s3 = node.client(*Keys(node).make("bob"))
    s3.create_bucket(Bucket="bob-data")
    return s3


def code(call: Callable[[], object]) -> str:
    try:
        call()
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])
    return "OK"


def status(call: Callable[[], object]) -> int:
    try:
        call()
    except ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    return 200


def test_a_second_user_is_refused_every_operation_on_the_first_users_bucket(
    alice: Any, bob: Any
) -> None:
    b = "alice-data"
    refused = {
        "ListObjectsV2": lambda: bob.list_objects_v2(Bucket=b),
        "ListObjects": lambda: bob.list_objects(Bucket=b),
        "GetObject": lambda: bob.get_object(Bucket=b, Key="train/0001.bin"),
        "GetObject of a key not there": lambda: bob.get_object(Bucket=b, Key="nothing"),
        "PutObject": lambda: bob.put_object(Bucket=b, Key="bob.txt", Body=b"x"),
        "DeleteObject": lambda: bob.delete_object(Bucket=b, Key="train/0001.bin"),
        "CreateMultipartUpload": lambda: bob.create_multipart_upload(Bucket=b, Key="m"),
        "ListMultipartUploads": lambda: bob.list_multipart_uploads(Bucket=b),
        "DeleteBucket": lambda: bob.delete_bucket(Bucket=b),
        "GetBucketPolicy": lambda: bob.get_bucket_policy(Bucket=b),
        "PutBucketPolicy": lambda: bob.put_bucket_policy(Bucket=b, Policy=_anyone_reads(b)),
        "DeleteBucketPolicy": lambda: bob.delete_bucket_policy(Bucket=b),
        "CopyObject out of it": lambda: bob.copy_object(
            Bucket="bob-data", Key="stolen", CopySource={"Bucket": b, "Key": "train/0001.bin"}
        ),
    }
    answers = {name: code(call) for name, call in refused.items()}
    assert answers == dict.fromkeys(refused, "AccessDenied")
    # HEAD has no body: the status says it, the same for a key there and one not.
    assert status(lambda: bob.head_object(Bucket=b, Key="train/0001.bin")) == 403
    assert status(lambda: bob.head_object(Bucket=b, Key="nothing")) == 403
    assert status(lambda: bob.head_bucket(Bucket=b)) == 403
    gone = bob.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "train/0001.bin"}]})
    assert [e["Code"] for e in gone.get("Errors", [])] == ["AccessDenied"]
    assert alice.get_object(Bucket=b, Key="train/0001.bin")["Body"].read() == SMALL
    # Names are global: someone else's bucket is taken; one's own is created again.
    assert code(lambda: bob.create_bucket(Bucket=b)) == "BucketAlreadyExists"
    assert code(lambda: alice.create_bucket(Bucket=b)) == "OK"
    # A bucket that is not there is NoSuchBucket whoever asks, as in S3.
    assert code(lambda: bob.get_object(Bucket="no-such-bucket", Key="k")) == "NoSuchBucket"


def test_each_user_lists_its_own_buckets_and_the_admin_all(
    node: GatewayNode, alice: Any, bob: Any
) -> None:
    # Its own only, as AWS lists them: the public_read mount is readable, not listed.
    assert {x["Name"] for x in alice.list_buckets()["Buckets"]} == {"alice-data"}
    assert {x["Name"] for x in bob.list_buckets()["Buckets"]} == {"bob-data"}
    assert node.buckets() >= {"alice-data", "bob-data", "shared", "pub"}
    assert code(lambda: bob.list_objects_v2(Bucket="shared")) == "AccessDenied"  # the admin's


def test_a_bucket_open_to_everyone_is_not_listed_to_others(
    node: GatewayNode, alice: Any, bob: Any
) -> None:
    b = "bob-open"
    bob.create_bucket(Bucket=b)
    bob.put_object(Bucket=b, Key="k", Body=b"v")
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
             "Resource": f"arn:aws:s3:::{b}/*"},
        ],
    }  # fmt: skip
    bob.put_bucket_policy(Bucket=b, Policy=json.dumps(policy))
    assert alice.get_object(Bucket=b, Key="k")["Body"].read() == b"v"  # granted: readable
    assert b not in {x["Name"] for x in alice.list_buckets()["Buckets"]}  # but not alice's
    assert b in {x["Name"] for x in bob.list_buckets()["Buckets"]}
    assert b in node.buckets()  # the admin's list is every bucket
    bob.delete_object(Bucket=b, Key="k")
    bob.delete_bucket_policy(Bucket=b)
    bob.delete_bucket(Bucket=b)


def test_the_owner_and_the_admin_do_everything_in_a_bucket(node: GatewayNode, alice: Any) -> None:
    alice.put_object(Bucket="alice-data", Key="tmp/x", Body=b"x")
    assert alice.list_objects_v2(Bucket="alice-data", Prefix="tmp/")["KeyCount"] == 1
    alice.delete_object(Bucket="alice-data", Key="tmp/x")
    admin = node.client()
    assert admin.get_object(Bucket="alice-data", Key="eval/0001.bin")["Body"].read() == b"eval"
    admin.put_object(Bucket="alice-data", Key="tmp/by-admin", Body=b"y")
    admin.delete_object(Bucket="alice-data", Key="tmp/by-admin")


def test_a_read_only_key_reads_and_lists_and_writes_nothing(node: GatewayNode, alice: Any) -> None:
    node.cli("users", "create", "reader", "--policy", "readonly")
    s3 = node.client(*Keys(node).make("reader"))
    b = "alice-data"
    assert s3.get_object(Bucket=b, Key="train/0001.bin")["Body"].read() == SMALL
    assert s3.head_object(Bucket=b, Key="train/0001.bin")["ContentLength"] == len(SMALL)
    assert s3.list_objects_v2(Bucket=b)["KeyCount"] == 2
    assert code(lambda: s3.put_object(Bucket=b, Key="w", Body=b"w")) == "AccessDenied"
    assert code(lambda: s3.delete_object(Bucket=b, Key="train/0001.bin")) == "AccessDenied"
    assert code(lambda: s3.create_bucket(Bucket="reader-data")) == "AccessDenied"
    assert code(lambda: s3.delete_bucket(Bucket=b)) == "AccessDenied"


def test_a_job_key_granted_by_a_bucket_policy_reads_exactly_that(
    node: GatewayNode, alice: Any
) -> None:
    node.cli("users", "create", "job", "--policy", "own")
    job = node.client(*Keys(node).make("job"))
    b = "alice-data"
    assert code(lambda: job.get_object(Bucket=b, Key="train/0001.bin")) == "AccessDenied"
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "JobReads",
                "Effect": "Allow",
                "Principal": {"AWS": ["arn:aws:iam:::user/job"]},
                "Action": ["s3:GetObject", "s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{b}", f"arn:aws:s3:::{b}/train/*"],
            }
        ],
    }
    alice.put_bucket_policy(Bucket=b, Policy=json.dumps(policy))
    assert json.loads(alice.get_bucket_policy(Bucket=b)["Policy"]) == policy
    assert job.get_object(Bucket=b, Key="train/0001.bin")["Body"].read() == SMALL
    assert job.head_object(Bucket=b, Key="train/0001.bin")["ContentLength"] == len(SMALL)
    assert job.list_objects_v2(Bucket=b, Prefix="train/")["KeyCount"] == 1
    assert code(lambda: job.get_object(Bucket=b, Key="eval/0001.bin")) == "AccessDenied"
    assert code(lambda: job.put_object(Bucket=b, Key="train/new", Body=b"n")) == "AccessDenied"
    assert code(lambda: job.delete_object(Bucket=b, Key="train/0001.bin")) == "AccessDenied"
    # Granted in it by alice's bucket policy, not its own: not listed to it, as in AWS.
    assert [x["Name"] for x in job.list_buckets()["Buckets"]] == []
    alice.delete_bucket_policy(Bucket=b)
    assert code(lambda: job.get_object(Bucket=b, Key="train/0001.bin")) == "AccessDenied"
    assert code(lambda: alice.get_bucket_policy(Bucket=b)) == "NoSuchBucketPolicy"


def test_a_prefix_limited_key_works_only_under_its_prefix_listing_included(
    node: GatewayNode, tmp_path: Path
) -> None:
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": "arn:aws:s3:::shared/team-a/*",
            },
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": "arn:aws:s3:::shared",
                "Condition": {"StringLike": {"s3:prefix": ["team-a/*", "team-a/"]}},
            },
        ],
    }
    document = tmp_path / "team-a.json"
    document.write_text(json.dumps(policy))
    node.cli("policies", "create", "team-a", str(document))
    node.cli("users", "create", "team-a", "--policy", "team-a")
    s3 = node.client(*Keys(node).make("team-a"))
    assert s3.get_object(Bucket="shared", Key="team-a/x.txt")["Body"].read() == b"a's"
    s3.put_object(Bucket="shared", Key="team-a/new.txt", Body=b"new")
    listed = s3.list_objects_v2(Bucket="shared", Prefix="team-a/")
    assert {o["Key"] for o in listed["Contents"]} == {"team-a/x.txt", "team-a/new.txt"}
    s3.delete_object(Bucket="shared", Key="team-a/new.txt")
    assert code(lambda: s3.get_object(Bucket="shared", Key="team-b/y.txt")) == "AccessDenied"
    assert code(lambda: s3.get_object(Bucket="shared", Key="top.txt")) == "AccessDenied"
    assert code(lambda: s3.put_object(Bucket="shared", Key="team-b/z", Body=b"z")) == "AccessDenied"
    assert code(lambda: s3.list_objects_v2(Bucket="shared", Prefix="team-b/")) == "AccessDenied"
    assert code(lambda: s3.list_objects_v2(Bucket="shared")) == "AccessDenied"
    # aws-cli, the same rules.
    ok = _aws(node, s3, "s3", "ls", "s3://shared/team-a/")
    assert ok.returncode == 0 and "x.txt" in ok.stdout
    refused = _aws(node, s3, "s3", "ls", "s3://shared/team-b/")
    assert refused.returncode != 0 and "AccessDenied" in refused.stderr


def test_anonymous_access_only_through_a_bucket_policy(alice: Any, node: GatewayNode) -> None:
    url = f"{node.url}/alice-data/train/0001.bin"
    assert httpx.get(url).status_code == 403
    assert httpx.get(f"{node.url}/alice-data/nothing").status_code == 403  # no hint
    assert httpx.get(f"{node.url}/alice-data?policy").status_code == 403
    alice.put_bucket_policy(Bucket="alice-data", Policy=_anyone_reads("alice-data"))
    assert httpx.get(url).content == SMALL
    assert httpx.get(f"{node.url}/alice-data/nothing").status_code == 404
    assert httpx.put(f"{node.url}/alice-data/anon", content=b"x").status_code == 403
    assert httpx.get(f"{node.url}/alice-data?list-type=2").status_code == 403  # not granted
    alice.delete_bucket_policy(Bucket="alice-data")
    assert httpx.get(url).status_code == 403


def test_public_read_mounts_read_anonymously_and_nothing_else(node: GatewayNode) -> None:
    assert httpx.get(f"{node.url}/pub/hello.txt").content == b"hello"
    assert httpx.head(f"{node.url}/pub/hello.txt").status_code == 200
    assert b"hello.txt" in httpx.get(f"{node.url}/pub?list-type=2").content
    assert httpx.put(f"{node.url}/pub/new.txt", content=b"x").status_code == 403
    assert httpx.delete(f"{node.url}/pub/hello.txt").status_code == 403
    assert httpx.get(f"{node.url}/shared/top.txt").status_code == 403


def test_malformed_bucket_policies_are_refused_with_the_reason(alice: Any) -> None:
    def put(doc: str) -> ClientError:
        with pytest.raises(ClientError) as caught:
            alice.put_bucket_policy(Bucket="alice-data", Policy=doc)
        return caught.value

    for doc in [
        "not json",
        json.dumps({"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:Fly",
                                   "Resource": "arn:aws:s3:::alice-data/*"}]}),
        json.dumps({"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                                   "Resource": "arn:aws:s3:::bob-data/*"}]}),
    ]:  # fmt: skip
        error = put(doc).response
        assert error["Error"]["Code"] == "MalformedPolicy"
        assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert code(lambda: alice.get_bucket_policy(Bucket="alice-data")) == "NoSuchBucketPolicy"


def test_condition_keys_of_request_headers_are_taken_and_evaluated(alice: Any) -> None:
    """A bucket policy on s3:x-amz-server-side-encryption (AWS's "deny uploads that ask for
    KMS") or another key that is a request header's value is stored and decides by the
    request's header (such policies were refused as MalformedPolicy: s3-tests'
    test_bucket_policy_put_obj_kms_s3)."""
    statements = [
        {"Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
         "Resource": "arn:aws:s3:::alice-data/*",
         "Condition": {"StringEquals": {"s3:x-amz-server-side-encryption": "aws:kms"}}},
        {"Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
         "Resource": "arn:aws:s3:::alice-data/*",
         "Condition": {"StringEquals": {"s3:x-amz-storage-class": "GLACIER"}}},
    ]  # fmt: skip
    policy = {"Version": "2012-10-17", "Statement": statements}
    alice.put_bucket_policy(Bucket="alice-data", Policy=json.dumps(policy))
    try:

        def put(**extra: str) -> object:
            return alice.put_object(Bucket="alice-data", Key="enc/a.bin", Body=b"x", **extra)

        assert code(lambda: put(ServerSideEncryption="aws:kms")) == "AccessDenied"
        assert code(lambda: put(StorageClass="GLACIER")) == "AccessDenied"
        put()  # neither header: no Deny applies
        assert alice.get_object(Bucket="alice-data", Key="enc/a.bin")["Body"].read() == b"x"
    finally:
        alice.delete_bucket_policy(Bucket="alice-data")
        alice.delete_object(Bucket="alice-data", Key="enc/a.bin")


def test_an_explicit_deny_in_a_bucket_policy_binds_the_owner_too(alice: Any) -> None:
    deny = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject",
             "Resource": "arn:aws:s3:::alice-data/train/*"}
        ],
    }  # fmt: skip
    alice.put_bucket_policy(Bucket="alice-data", Policy=json.dumps(deny))
    try:
        assert code(lambda: alice.delete_object(Bucket="alice-data", Key="train/0001.bin")) == (
            "AccessDenied"
        )
        assert alice.get_object(Bucket="alice-data", Key="train/0001.bin")["ContentLength"] > 0
    finally:
        alice.delete_bucket_policy(Bucket="alice-data")


def test_the_edge_refuses_a_denied_key_a_cached_small_object(
    node: GatewayNode, alice: Any, bob: Any
) -> None:
    b, key = "alice-data", "train/0001.bin"
    url = alice.generate_presigned_url("get_object", Params={"Bucket": b, "Key": key})
    for _ in range(3):  # cached, then answered at the edge
        assert _get(node, url)[0] == 200
    fast = node.metric("gateway_edge_fast_answers")
    assert _get(node, url)[0] == 200
    assert node.metric("gateway_edge_fast_answers") == fast + 1
    denied = bob.generate_presigned_url("get_object", Params={"Bucket": b, "Key": key})
    for _ in range(3):
        answer, body = _get(node, denied)
        assert answer == 403 and b"AccessDenied" in body
    assert node.metric("gateway_edge_fast_answers") == fast + 1
    # Granted by a bucket policy, the same URL is answered, at the edge too.
    grant = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam:::user/bob"},
             "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{b}/train/*"}
        ],
    }  # fmt: skip
    alice.put_bucket_policy(Bucket=b, Policy=json.dumps(grant))
    try:
        # The first request after the change takes the full path, which re-reads what
        # changed on the node (docs/architecture.md); the next is the edge's.
        assert _get(node, denied) == (200, SMALL)
        assert _get(node, denied) == (200, SMALL)
        assert node.metric("gateway_edge_fast_answers") == fast + 2
    finally:
        alice.delete_bucket_policy(Bucket=b)
    assert _get(node, denied)[0] == 403


def test_users_and_policies_cli(node: GatewayNode, alice: Any, tmp_path: Path) -> None:
    users = {u["name"]: u for u in json.loads(node.cli("users", "list", "--json").stdout)}
    assert users["admin"]["policies"] == ["admin"]
    assert "shared" in users["admin"]["buckets"]
    assert users["alice"]["policies"] == ["own"] and users["alice"]["buckets"] == ["alice-data"]
    listed = [line.split("\t") for line in node.cli("keys", "list").stdout.splitlines()]
    assert {"alice", "admin"} <= {line[3] for line in listed}
    refused = node.cli("users", "delete", "alice", check=False)
    assert refused.returncode != 0 and "owns buckets alice-data" in refused.stderr
    assert node.cli("users", "delete", "admin", check=False).returncode != 0
    assert node.cli("users", "create", "alice", check=False).returncode != 0
    assert "no policy" in node.cli("users", "create", "x", "--policy", "nope", check=False).stderr
    bad = node.cli("policies", "create", "bad", '{"Statement": []}', check=False)
    assert bad.returncode != 0 and "MalformedPolicy" in bad.stderr
    names = {p["name"]: p for p in json.loads(node.cli("policies", "list", "--json").stdout)}
    assert {"own", "readonly", "readwrite", "admin"} <= set(names)
    assert names["own"]["builtin"] and "alice" in names["own"]["users"]


def test_a_policy_attached_and_detached_takes_effect(node: GatewayNode) -> None:
    node.cli("policies", "create", "deny-put", json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Deny", "Action": "s3:PutObject", "Resource": "*"}],
    }))  # fmt: skip
    node.cli("users", "create", "carol")
    carol = node.client(*Keys(node).make("carol"))
    carol.create_bucket(Bucket="carol-data")
    carol.put_object(Bucket="carol-data", Key="k", Body=b"v")
    node.cli("policies", "attach", "deny-put", "--user", "carol")
    eventually(lambda: code(lambda: carol.put_object(Bucket="carol-data", Key="k", Body=b"w"))
               == "AccessDenied")  # fmt: skip
    held = node.cli("policies", "delete", "deny-put", check=False)
    assert held.returncode != 0 and "attached to carol" in held.stderr
    node.cli("policies", "detach", "deny-put", "--user", "carol")
    eventually(lambda: code(lambda: carol.put_object(Bucket="carol-data", Key="k", Body=b"w"))
               == "OK")  # fmt: skip
    node.cli("policies", "delete", "deny-put")


def test_a_deleted_users_keys_go_with_it(node: GatewayNode) -> None:
    node.cli("users", "create", "temp")
    temp_keys = Keys(node).make("temp")
    temp = node.client(*temp_keys)
    assert code(lambda: temp.list_buckets()) == "OK"
    node.cli("users", "delete", "temp")
    eventually(lambda: code(lambda: temp.list_buckets()) == "InvalidAccessKeyId")


def test_unknown_user_for_a_key_is_refused(node: GatewayNode) -> None:
    out = node.cli("keys", "create", "--user", "nobody", check=False)
    assert out.returncode != 0 and "no user 'nobody'" in out.stderr


def _anyone_reads(bucket: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "AnyoneReads", "Effect": "Allow", "Principal": "*",
                 "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"}
            ],
        }
    )  # fmt: skip


def _get(node: GatewayNode, url: str) -> tuple[int, bytes]:
    target = ("/" + url.split("/", 3)[3]).encode()
    request = b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % node.port
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(request)
        stream = sock.makefile("rb")
        answer = int(stream.readline().split(b" ", 2)[1])
        length = 0
        while (line := stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return answer, stream.read(length)


def _aws(node: GatewayNode, s3: Any, *args: str) -> subprocess.CompletedProcess[str]:
    creds = s3._request_signer._credentials
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_ACCESS_KEY_ID": creds.access_key,
        "AWS_SECRET_ACCESS_KEY": creds.secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    return subprocess.run(
        [str(BIN / "aws"), "--endpoint-url", node.url, *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
