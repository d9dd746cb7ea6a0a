"""POST Object (a browser's form upload) against a node with an S3 mount over moto, as a page
would send it: boto3's generate_presigned_post for the policy and fields, httpx for the
multipart/form-data POST. The object is written to the store and reads back; a condition the
form breaks, an expired policy, a bad signature, a file past content-length-range, a field
the policy does not name, an anonymous form on a private bucket are each refused as S3 refuses
them; success_action_status and success_action_redirect are answered as S3 answers them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

ORIGIN = "origin-post-object"
PREFIX = "under"


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    node = start_gateway(module_dir / "node")
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "forms", f"s3://{ORIGIN}/{PREFIX}", *opts)
    eventually(lambda: "forms" in node.buckets())
    yield node
    node.stop()


def post(form: dict[str, Any], body: bytes, filename: str = "photo.jpg") -> httpx.Response:
    """The form's fields, then its file (last, as S3 wants it), to the form's URL."""
    fields = {k: str(v) for k, v in form["fields"].items()}
    files = {"file": (filename, body, "application/octet-stream")}
    return httpx.post(form["url"], data=fields, files=files, timeout=60, follow_redirects=False)


def error(answer: httpx.Response) -> tuple[int, str, str]:
    code = re.search(r"<Code>([^<]*)</Code>", answer.text)
    message = re.search(r"<Message>([^<]*)</Message>", answer.text)
    return answer.status_code, code.group(1) if code else "", message.group(1) if message else ""


def test_a_form_upload_is_written_to_the_store_and_reads_back(
    node: GatewayNode, origin_s3: Any
) -> None:
    s3 = node.client()
    body = os.urandom(100_000)
    form = s3.generate_presigned_post(
        "forms", "uploads/${filename}",
        Fields={"Content-Type": "image/jpeg", "x-amz-meta-color": "blue"},
        Conditions=[["starts-with", "$key", "uploads/"], {"Content-Type": "image/jpeg"},
                    {"x-amz-meta-color": "blue"}],
    )  # fmt: skip
    answer = post(form, body, filename="cat.jpg")
    assert answer.status_code == 204, answer.text
    assert answer.content == b""
    got = s3.get_object(Bucket="forms", Key="uploads/cat.jpg")
    assert got["Body"].read() == body
    assert got["ContentType"] == "image/jpeg" and got["Metadata"] == {"color": "blue"}
    assert answer.headers["etag"] == got["ETag"]
    assert answer.headers["location"].endswith("/forms/uploads/cat.jpg")
    # In the under-store, under the mount's prefix.
    stored = origin_s3.get_object(Bucket=ORIGIN, Key=f"{PREFIX}/uploads/cat.jpg")
    assert stored["Body"].read() == body


def test_a_large_file_is_streamed_to_the_store(node: GatewayNode, origin_s3: Any) -> None:
    body = os.urandom((24 << 20) + 5)  # past the store's single-request PUT: its own multipart
    form = node.client().generate_presigned_post("forms", "big/one.bin")
    assert post(form, body).status_code == 204
    stored = origin_s3.get_object(Bucket=ORIGIN, Key=f"{PREFIX}/big/one.bin")["Body"].read()
    assert stored == body
    assert node.client().get_object(Bucket="forms", Key="big/one.bin")["Body"].read() == body


def test_success_action_status_and_redirect_are_answered_as_s3_does(node: GatewayNode) -> None:
    s3 = node.client()
    form = s3.generate_presigned_post(
        "forms", "status/201", Fields={"success_action_status": "201"},
        Conditions=[{"success_action_status": "201"}],
    )  # fmt: skip
    answer = post(form, b"made")
    assert answer.status_code == 201, answer.text
    assert "<Bucket>forms</Bucket><Key>status/201</Key>" in answer.text
    etag = s3.head_object(Bucket="forms", Key="status/201")["ETag"]
    assert f"<ETag>{etag}</ETag>" in answer.text
    form = s3.generate_presigned_post(
        "forms", "status/200", Fields={"success_action_status": "200"},
        Conditions=[{"success_action_status": "200"}],
    )  # fmt: skip
    answer = post(form, b"made")
    assert (answer.status_code, answer.content) == (200, b"")
    back = "https://app.example/done?from=form"
    form = s3.generate_presigned_post(
        "forms", "redirected", Fields={"success_action_redirect": back},
        Conditions=[{"success_action_redirect": back}],
    )  # fmt: skip
    answer = post(form, b"made")
    assert answer.status_code == 303, answer.text
    where = urlsplit(answer.headers["location"])
    assert f"{where.scheme}://{where.netloc}{where.path}" == "https://app.example/done"
    query = parse_qs(where.query)
    assert query["from"] == ["form"] and query["bucket"] == ["forms"]
    assert query["key"] == ["redirected"]
    assert query["etag"] == [s3.head_object(Bucket="forms", Key="redirected")["ETag"]]


def test_a_form_that_breaks_its_policy_is_refused_and_writes_nothing(
    node: GatewayNode, origin_s3: Any
) -> None:
    s3 = node.client()
    form = s3.generate_presigned_post(
        "forms", "uploads/x", Conditions=[["starts-with", "$key", "uploads/"]]
    )
    form["fields"]["key"] = "elsewhere/x"
    status, code, message = error(post(form, b"nope"))
    assert (status, code) == (403, "AccessDenied")
    assert 'Policy Condition failed: ["starts-with", "$key", "uploads/"]' in message

    form = s3.generate_presigned_post("forms", "extra")
    form["fields"]["x-amz-meta-sneaky"] = "1"  # named by no condition
    status, code, message = error(post(form, b"nope"))
    assert (status, code) == (403, "AccessDenied")
    assert "Extra input fields: x-amz-meta-sneaky" in message

    form = s3.generate_presigned_post("forms", "late", ExpiresIn=-60)
    status, code, message = error(post(form, b"nope"))
    expired = "Invalid according to Policy: Policy expired."
    assert (status, code, message) == (403, "AccessDenied", expired)

    form = s3.generate_presigned_post("forms", "forged")
    signature = form["fields"]["x-amz-signature"]
    form["fields"]["x-amz-signature"] = ("0" if signature[0] != "0" else "1") + signature[1:]
    assert error(post(form, b"nope"))[:2] == (403, "SignatureDoesNotMatch")

    form = s3.generate_presigned_post(
        "forms", "sized", Conditions=[["content-length-range", 1, 1024]]
    )
    assert error(post(form, b"x" * 1025))[:2] == (400, "EntityTooLarge")
    assert error(post(form, b""))[:2] == (400, "EntityTooSmall")
    assert post(form, b"x" * 1024).status_code == 204  # the bounds are inclusive

    listed = origin_s3.list_objects_v2(Bucket=ORIGIN, Prefix=PREFIX + "/")
    names = {o["Key"] for o in listed.get("Contents", [])}
    assert not names & {f"{PREFIX}/{k}" for k in ("elsewhere/x", "extra", "late", "forged")}


def test_forms_without_a_policy_or_a_multipart_body_are_refused(node: GatewayNode) -> None:
    url = f"{node.url}/forms"
    # Anonymous (no policy): as an anonymous PutObject, refused on a bucket not public.
    anonymous = httpx.post(url, data={"key": "anon"}, files={"file": ("a", b"a")})
    assert error(anonymous)[:2] == (403, "AccessDenied")
    no_file = httpx.post(url, data={"key": "k"}, files={"other": ("a", b"a")})
    status, code, _ = error(no_file)
    assert (status, code) == (400, "InvalidArgument")
    not_a_form = httpx.post(url, content=b"key=k", headers={"content-type": "text/plain"})
    assert error(not_a_form)[:2] == (412, "PreconditionFailed")
    form = node.client().generate_presigned_post("forms", "k")
    form["fields"].pop("key")
    assert error(post(form, b"x"))[:2] == (400, "InvalidArgument")
    missing = httpx.post(f"{node.url}/no-such-bucket", data={"key": "k"}, files={"file": b"x"})
    assert error(missing)[:2] == (404, "NoSuchBucket")


def _v2_form(key: str, expires: str, secret: str = SECRET_KEY) -> dict[str, Any]:
    """A form signed with SigV2 as older SDKs and ceph/s3-tests sign it: AWSAccessKeyId and
    the base64 HMAC-SHA1 of the base64 policy."""
    policy = base64.b64encode(json.dumps({
        "expiration": expires,
        "conditions": [{"bucket": "forms"}, ["starts-with", "$key", "v2/"],
                       ["content-length-range", 0, 1024]],
    }).encode()).decode()  # fmt: skip
    signature = base64.b64encode(
        hmac.new(secret.encode(), policy.encode(), hashlib.sha1).digest()
    ).decode()
    return {"key": key, "AWSAccessKeyId": ACCESS_KEY, "policy": policy, "signature": signature}


def test_a_form_signed_with_sigv2_is_taken_and_checked_as_s3_does(node: GatewayNode) -> None:
    url = f"{node.url}/forms"
    later, past = "2100-01-01T00:00:00Z", "2000-01-01T00:00:00Z"
    answer = httpx.post(url, data=_v2_form("v2/ok", later), files={"file": ("a", b"v2 bytes")})
    assert answer.status_code == 204, answer.text
    got = node.client().get_object(Bucket="forms", Key="v2/ok")
    assert got["Body"].read() == b"v2 bytes"
    bad = httpx.post(url, data=_v2_form("v2/bad", later, secret="not-the-secret"),
                     files={"file": ("a", b"x")})  # fmt: skip
    assert error(bad)[:2] == (403, "SignatureDoesNotMatch")
    expired = httpx.post(url, data=_v2_form("v2/old", past), files={"file": ("a", b"x")})
    assert error(expired)[:2] == (403, "AccessDenied")
    stranger = {**_v2_form("v2/who", later), "AWSAccessKeyId": "GKNOSUCHKEY000000001"}
    assert error(httpx.post(url, data=stranger, files={"file": ("a", b"x")}))[:2] == (
        403, "InvalidAccessKeyId",
    )  # fmt: skip
    outside = httpx.post(url, data=_v2_form("elsewhere", later), files={"file": ("a", b"x")})
    assert error(outside)[:2] == (403, "AccessDenied")
    for key in ("v2/bad", "v2/old", "v2/who", "elsewhere"):
        with pytest.raises(ClientError):
            node.client().head_object(Bucket="forms", Key=key)


BOUNDARY = "----gatewayformboundary"


def raw_form(node: GatewayNode, form: dict[str, Any], file_bytes: int | None, sent: bytes) -> bytes:
    """A POST of the form whose Content-Length counts a file of `file_bytes` and the closing
    boundary, of which `sent` is all the file that is sent (`file_bytes` None: the body is
    what is sent, with no closing boundary): the answer, as read from the socket."""
    head = b"".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in form["fields"].items()
    )
    head += (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="h.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    length = len(head) + (len(sent) if file_bytes is None else file_bytes + len(tail))
    request = (
        f"POST /forms HTTP/1.1\r\nHost: 127.0.0.1:{node.port}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as sock:
        sock.sendall(request + head + sent)
        answer = b""
        while b"</Error>" not in answer and not answer.startswith(b"HTTP/1.1 2"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


def test_a_file_past_its_range_is_refused_before_the_rest_is_sent(node: GatewayNode) -> None:
    """The file is checked as it arrives: the answer comes while the client still has most
    of a declared 64 MiB to send (a node that read it all first would never answer here)."""
    form = node.client().generate_presigned_post(
        "forms", "huge", Conditions=[["content-length-range", 1, 1 << 20]]
    )
    answer = raw_form(node, form, 64 << 20, b"x" * (2 << 20))  # 2 MiB of 64
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"<Code>EntityTooLarge</Code>" in answer and b"<MaxSizeAllowed>1048576<" in answer


def test_a_form_cut_inside_its_file_writes_nothing(node: GatewayNode) -> None:
    s3 = node.client()
    form = s3.generate_presigned_post("forms", "cut")
    answer = raw_form(node, form, None, b"y" * 1000)  # the body ends inside the file
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket="forms", Key="cut")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
