"""The answers real tools and a public S3 conformance suite expect in the details: presigned
URL errors, bodies sent without a length, retried and repeated multipart calls, bucket
creation and deletion, part numbers on reads, listings' small print. Against `gateway serve`
subprocesses over a real S3 origin (moto) and a local folder, through boto3, aws-cli and raw
sockets where a client cannot send the request."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import subprocess
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.support.gateway import ACCESS_KEY, BIN, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

MiB = 1 << 20
ORIGIN = "origin-details"
CREDENTIALS = Credentials(ACCESS_KEY, SECRET_KEY)


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    (module_dir / "files").mkdir()
    (module_dir / "buckets").mkdir()
    node = start_gateway(
        module_dir / "node", args=("--bucket-store", (module_dir / "buckets").as_uri())
    )
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "s3d", f"s3://{ORIGIN}/pre", *opts)
    node.cli("mount", "add", "filed", (module_dir / "files").as_uri())
    eventually(lambda: node.buckets() >= {"s3d", "filed"})
    yield node
    node.stop()


@pytest.fixture(params=["s3d", "filed"])
def bucket(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> tuple[int, str | None, str | None]:
        """(status, code, message), after checking the body is S3's error document with the
        request id of the response header."""
        root = ET.fromstring(self.body)
        assert root.tag == "Error"
        assert root.findtext("RequestId") == self.headers["x-amz-request-id"]
        return self.status, root.findtext("Code"), root.findtext("Message")


def raw(node: GatewayNode, head: str, body: bytes = b"") -> Answer:
    """One request exactly as given, request line and headers included, on its own socket."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode("latin-1") + b"\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            if _complete(data):
                break
    header_block, _, rest = data.partition(b"\r\n\r\n")
    lines = header_block.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(lines[0].split()[1]), headers, rest)


def _complete(data: bytes) -> bool:
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(rest) >= int(line.split(b":")[1])
    return False


def signed_head(
    node: GatewayNode, method: str, target: str, headers: dict[str, str], payload: str
) -> str:
    """The request line and headers of a SigV4 header-signed request claiming `payload` as
    x-amz-content-sha256 (a STREAMING-* mode, or UNSIGNED-PAYLOAD)."""
    request = AWSRequest(method=method, url=node.url + target, headers=headers)
    request.headers["X-Amz-Content-SHA256"] = payload
    auth = S3SigV4Auth(CREDENTIALS, "s3", "us-east-1")
    auth.payload = lambda request: payload  # type: ignore[method-assign]
    auth.add_auth(request)
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{node.port}"]
    lines += [f"{k}: {v}" for k, v in request.headers.items() if k.lower() != "host"]
    return "\n".join(lines) + "\n"


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    r = exc.value.response
    return r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]


# -- presigned URLs ------------------------------------------------------------------------

WEEK = (
    "X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires"
    " must be less than 604800 seconds"
)


@pytest.mark.parametrize(
    ("expires", "answer"),
    [
        ("0", (403, "AccessDenied", "Request has expired")),
        ("604801", (400, "AuthorizationQueryParametersError", WEEK)),
        ("-7", (400, "AuthorizationQueryParametersError", "X-Amz-Expires must be non-negative")),
    ],
)
def test_presigned_expiry_out_of_range_is_answered_as_s3_answers(
    node: GatewayNode, expires: str, answer: tuple[int, str, str]
) -> None:
    node.client().put_object(Bucket="filed", Key="signed.txt", Body=b"signed")
    url = node.client().generate_presigned_url(
        "get_object", Params={"Bucket": "filed", "Key": "signed.txt"}, ExpiresIn=600
    )
    assert httpx.get(url).status_code == 200
    r = httpx.get(url.replace("X-Amz-Expires=600", f"X-Amz-Expires={expires}"))
    assert Answer(r.status_code, dict(r.headers), r.content).error() == answer
    if expires == "0":
        root = ET.fromstring(r.content)
        assert root.findtext("X-Amz-Expires") == "0"
        assert root.findtext("Expires") and root.findtext("ServerTime")


def test_expired_presigned_put_is_access_denied_and_writes_nothing(node: GatewayNode) -> None:
    s3 = node.client()
    url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": "filed", "Key": "late.txt"}, ExpiresIn=1
    )
    probe = s3.generate_presigned_url(  # signed in the same second: expires with it
        "list_objects_v2", Params={"Bucket": "filed"}, ExpiresIn=1
    )
    eventually(lambda: httpx.get(probe).status_code == 403)
    r = httpx.put(url, content=b"late")
    status, code, message = Answer(r.status_code, dict(r.headers), r.content).error()
    assert (status, code, message) == (403, "AccessDenied", "Request has expired")
    assert ET.fromstring(r.content).findtext("X-Amz-Expires") == "1"
    with pytest.raises(ClientError) as exc:
        node.client().head_object(Bucket="filed", Key="late.txt")
    assert _code(exc) == ("404", 404)


# -- bodies without a Content-Length -------------------------------------------------------


def _aws_chunked(data: bytes) -> bytes:
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    return (
        f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n"
        + f"x-amz-checksum-crc32:{crc}\r\n\r\n".encode()
    )  # fmt: skip


def _http_chunked(body: bytes, size: int = 1000) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"


def test_put_with_transfer_encoding_chunked_and_aws_chunked_body_is_accepted(
    node: GatewayNode, bucket: str
) -> None:
    data = bytes(range(256)) * 20
    head = signed_head(
        node, "PUT", f"/{bucket}/chunked.bin",
        {
            "Content-Encoding": "aws-chunked",
            "X-Amz-Decoded-Content-Length": str(len(data)),
            "X-Amz-Trailer": "x-amz-checksum-crc32",
            "Transfer-Encoding": "chunked",
        },
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    )  # fmt: skip
    answer = raw(node, head, _http_chunked(_aws_chunked(data)))
    assert answer.status == 200, answer.body
    got = node.client().get_object(Bucket=bucket, Key="chunked.bin")
    assert got["Body"].read() == data
    assert got["ContentLength"] == len(data)
    assert "ContentEncoding" not in got


def _signed_chunks(head: str, data: bytes, size: int = 8192) -> bytes:
    """`data` as STREAMING-AWS4-HMAC-SHA256-PAYLOAD chunks, each signed in the chain that
    starts at the seed signature of the request `head`."""
    fields = dict(line.split(": ", 1) for line in head.splitlines()[1:] if ": " in line)
    amz_date = fields["X-Amz-Date"]
    auth = fields["Authorization"]
    signature = auth.rsplit("Signature=", 1)[1]
    scope = auth.split("Credential=", 1)[1].split(",", 1)[0].split("/", 1)[1]
    key = ("AWS4" + SECRET_KEY).encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    empty = hashlib.sha256(b"").hexdigest()
    out = b""
    for chunk in [data[i : i + size] for i in range(0, len(data), size)] + [b""]:
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, signature, empty,
             hashlib.sha256(chunk).hexdigest()]
        )  # fmt: skip
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        out += f"{len(chunk):x};chunk-signature={signature}\r\n".encode() + chunk + b"\r\n"
    return out


def test_put_with_transfer_encoding_chunked_and_signed_chunks_is_accepted(
    node: GatewayNode, bucket: str
) -> None:
    data = bytes(range(256)) * 100  # 25,600 bytes: four signed chunks and the last

    def head(key: str) -> str:
        return signed_head(
            node, "PUT", f"/{bucket}/{key}",
            {
                "Content-Encoding": "aws-chunked",
                "X-Amz-Decoded-Content-Length": str(len(data)),
                "Transfer-Encoding": "chunked",
            },
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        )  # fmt: skip

    good = head("signed-chunks.bin")
    assert raw(node, good, _http_chunked(_signed_chunks(good, data), 5000)).status == 200
    assert node.client().get_object(Bucket=bucket, Key="signed-chunks.bin")["Body"].read() == data
    bad = head("tampered.bin")
    tampered = _signed_chunks(bad, data).replace(b"\x10\x11", b"\x11\x10", 1)  # chunk 1
    answer = raw(node, bad, _http_chunked(tampered, 5000))
    assert answer.error()[:2] == (403, "SignatureDoesNotMatch")
    with pytest.raises(ClientError) as exc:
        node.client().head_object(Bucket=bucket, Key="tampered.bin")
    assert _code(exc) == ("404", 404)


def test_put_with_no_length_at_all_is_411_missing_content_length(node: GatewayNode) -> None:
    head = signed_head(node, "PUT", "/filed/nolength.bin", {}, "UNSIGNED-PAYLOAD")
    answer = raw(node, head)
    assert answer.error()[:2] == (411, "MissingContentLength")


def test_boto3_put_with_transfer_encoding_chunked_header_is_accepted(
    node: GatewayNode, bucket: str
) -> None:
    # As the conformance suite sends it: boto3 with the header added before the call.
    s3 = node.client()
    s3.meta.events.register(
        "before-call.s3.PutObject",
        lambda params, **_: params["headers"].update({"Transfer-Encoding": "chunked"}),
    )
    s3.put_object(Bucket=bucket, Key="te.txt", Body=b"bar")
    assert s3.get_object(Bucket=bucket, Key="te.txt")["Body"].read() == b"bar"


# -- multipart uploads ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def second(module_dir: Path, node: GatewayNode, origin: CountingProxy) -> Iterator[GatewayNode]:
    """Another node over the same stores, with a database of its own (it never saw an upload
    of the first), in another region."""
    second = start_gateway(module_dir / "second", args=("--region", "eu-west-1"))
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    second.cli("mount", "add", "s3d", f"s3://{ORIGIN}/pre", *opts)
    second.cli("mount", "add", "filed", (module_dir / "files").as_uri())
    eventually(lambda: second.buckets() >= {"s3d", "filed"})
    yield second
    second.stop()


def _upload(s3: Any, bucket: str, key: str, *parts: bytes) -> tuple[str, list[dict[str, Any]]]:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    done = []
    for number, data in enumerate(parts, 1):
        etag = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
        )["ETag"]
        done.append({"PartNumber": number, "ETag": etag})
    return upload_id, done


def test_retried_complete_answers_200_with_the_same_etag(
    node: GatewayNode, second: GatewayNode, bucket: str
) -> None:
    s3 = node.client()
    upload_id, parts = _upload(s3, bucket, "retried.bin", b"a" * 5 * MiB, b"b" * 100)
    first = s3.complete_multipart_upload(
        Bucket=bucket, Key="retried.bin", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    assert first["ETag"].endswith('-2"')
    again = s3.complete_multipart_upload(
        Bucket=bucket, Key="retried.bin", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    assert (again["ETag"], again["Key"]) == (first["ETag"], "retried.bin")
    # A node that never saw the upload knows it by the ETag its parts make.
    elsewhere = second.client().complete_multipart_upload(
        Bucket=bucket, Key="retried.bin", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    assert elsewhere["ETag"] == first["ETag"]
    # Still no upload for other parts, another key, or once the key was overwritten.
    for target, listed in (("retried.bin", parts[:1]), ("other.bin", parts)):
        with pytest.raises(ClientError) as exc:
            s3.complete_multipart_upload(
                Bucket=bucket, Key=target, UploadId=upload_id,
                MultipartUpload={"Parts": listed},
            )  # fmt: skip
        assert _code(exc) == ("NoSuchUpload", 404)
    s3.put_object(Bucket=bucket, Key="retried.bin", Body=b"new")
    with pytest.raises(ClientError) as exc:
        second.client().complete_multipart_upload(
            Bucket=bucket, Key="retried.bin", UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
    assert _code(exc) == ("NoSuchUpload", 404)


def test_part_sent_again_replaces_the_earlier_one(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    first, second_part = b"1" * 5 * MiB, b"2" * 1000
    upload_id, parts = _upload(s3, bucket, "resent.bin", first, second_part)
    replacement = b"R" * 5 * MiB
    etag = s3.upload_part(
        Bucket=bucket, Key="resent.bin", UploadId=upload_id, PartNumber=1, Body=replacement
    )["ETag"]
    listed = s3.list_parts(Bucket=bucket, Key="resent.bin", UploadId=upload_id)["Parts"]
    assert [(p["PartNumber"], p["ETag"]) for p in listed] == [(1, etag), (2, parts[1]["ETag"])]
    with pytest.raises(ClientError) as exc:  # the first upload of part 1 is gone
        s3.complete_multipart_upload(
            Bucket=bucket, Key="resent.bin", UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
    assert _code(exc) == ("InvalidPart", 400)
    parts[0]["ETag"] = etag
    s3.complete_multipart_upload(
        Bucket=bucket, Key="resent.bin", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    assert (
        s3.get_object(Bucket=bucket, Key="resent.bin")["Body"].read() == replacement + b"2" * 1000
    )


@pytest.mark.parametrize("rng", ["bytes=0-21", "bytes=5-5"])
def test_upload_part_copy_past_the_source_is_invalid_range(
    node: GatewayNode, bucket: str, rng: str
) -> None:
    s3 = node.client()
    s3.put_object(Bucket=bucket, Key="five.txt", Body=b"12345")
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="copied.bin")["UploadId"]
    with pytest.raises(ClientError) as exc:
        s3.upload_part_copy(
            Bucket=bucket, Key="copied.bin", UploadId=upload_id, PartNumber=1,
            CopySource={"Bucket": bucket, "Key": "five.txt"}, CopySourceRange=rng,
        )  # fmt: skip
    assert _code(exc) == ("InvalidRange", 416)
    s3.abort_multipart_upload(Bucket=bucket, Key="copied.bin", UploadId=upload_id)


# -- buckets -------------------------------------------------------------------------------


def test_create_bucket_of_ones_own_is_200_in_us_east_1_and_owned_by_you_elsewhere(
    node: GatewayNode, second: GatewayNode
) -> None:
    s3 = node.client()
    s3.create_bucket(Bucket="mine-again")
    assert s3.create_bucket(Bucket="mine-again")["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.create_bucket(Bucket="filed")["ResponseMetadata"]["HTTPStatusCode"] == 200
    with pytest.raises(ClientError) as exc:  # a node in eu-west-1
        second.client().create_bucket(
            Bucket="filed", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
        )
    assert _code(exc) == ("BucketAlreadyOwnedByYou", 409)


def test_create_bucket_whose_name_is_taken_in_the_bucket_store_is_already_exists(
    node: GatewayNode, module_dir: Path
) -> None:
    (module_dir / "buckets" / "someone-elses").mkdir()
    with pytest.raises(ClientError) as exc:
        node.client().create_bucket(Bucket="someone-elses")
    assert _code(exc) == ("BucketAlreadyExists", 409)


def test_requests_to_a_deleted_bucket_are_no_such_bucket(node: GatewayNode) -> None:
    s3 = node.client()
    s3.create_bucket(Bucket="gone-soon")
    s3.put_object(Bucket="gone-soon", Key="k", Body=b"v")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "gone-soon", "Key": "k"})
    assert httpx.get(url).content == b"v"
    s3.delete_object(Bucket="gone-soon", Key="k")
    s3.delete_bucket(Bucket="gone-soon")
    calls = [
        lambda: s3.get_object(Bucket="gone-soon", Key="k"),
        lambda: s3.put_object(Bucket="gone-soon", Key="k", Body=b"v"),
        lambda: s3.delete_object(Bucket="gone-soon", Key="k"),
        lambda: s3.list_objects_v2(Bucket="gone-soon"),
        lambda: s3.create_multipart_upload(Bucket="gone-soon", Key="k"),
        lambda: s3.delete_bucket(Bucket="gone-soon"),
    ]
    for call in calls:
        with pytest.raises(ClientError) as exc:
            call()
        assert _code(exc) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as exc:
        s3.head_bucket(Bucket="gone-soon")
    assert _code(exc) == ("404", 404)
    for r in (httpx.get(url), httpx.get(f"{node.url}/gone-soon/k")):  # presigned, anonymous
        assert Answer(r.status_code, dict(r.headers), r.content).error()[:2] == (
            404, "NoSuchBucket"
        )  # fmt: skip


# -- who asks, before what is asked ---------------------------------------------------------


@pytest.mark.parametrize("target", ["/filed?policy", "/filed?acl", "/filed/k?tagging", "/?x=1"])
def test_anonymous_request_for_a_sub_resource_is_access_denied_not_501(
    node: GatewayNode, target: str
) -> None:
    r = httpx.get(node.url + target)
    assert Answer(r.status_code, dict(r.headers), r.content).error()[:2] == (403, "AccessDenied")


def test_signed_request_for_a_sub_resource_is_501(node: GatewayNode) -> None:
    with pytest.raises(ClientError) as exc:
        node.client().get_bucket_lifecycle_configuration(Bucket="filed")
    assert _code(exc) == ("NotImplemented", 501)


def test_access_denied_says_nothing_of_whether_the_object_exists(node: GatewayNode) -> None:
    node.client().put_object(Bucket="filed", Key="there.txt", Body=b"x")
    for method in ("GET", "HEAD", "PUT", "DELETE"):
        answers = [
            httpx.request(method, f"{node.url}/filed/{key}") for key in ("there.txt", "absent")
        ]
        assert {a.status_code for a in answers} == {403}
        assert answers[0].headers.keys() == answers[1].headers.keys()
        if method != "HEAD":
            bodies = [
                a.text.replace(a.headers["x-amz-request-id"], "ID").replace(key, "KEY")
                for a, key in zip(answers, ("there.txt", "absent"), strict=True)
            ]
            assert bodies[0] == bodies[1]
    assert node.client().get_object(Bucket="filed", Key="there.txt")["Body"].read() == b"x"


# -- listings ------------------------------------------------------------------------------


def _signed_get(node: GatewayNode, target: str) -> Answer:
    return raw(node, signed_head(node, "GET", target, {}, "UNSIGNED-PAYLOAD"))


@pytest.mark.parametrize("version", ["", "list-type=2&"])
def test_listing_prefix_is_decoded_unless_url_encoding_is_asked(
    node: GatewayNode, version: str
) -> None:
    node.client().put_object(Bucket="filed", Key="a b/ü+x.txt", Body=b"x")
    prefix = "a%20b%2F%C3%BC"
    plain = ET.fromstring(_signed_get(node, f"/filed?{version}prefix={prefix}").body)
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    assert plain.findtext(f"{ns}Prefix") == "a b/ü"
    assert plain.findtext(f"{ns}Contents/{ns}Key") == "a b/ü+x.txt"
    encoded = ET.fromstring(
        _signed_get(node, f"/filed?{version}prefix={prefix}&encoding-type=url").body
    )
    assert encoded.findtext(f"{ns}Prefix") == "a%20b/%C3%BC"
    assert encoded.findtext(f"{ns}Contents/{ns}Key") == "a%20b/%C3%BC%2Bx.txt"
    listed = node.client().list_objects(Bucket="filed", Prefix="a b/ü")  # boto3 asks for url
    assert [o["Key"] for o in listed["Contents"]] == ["a b/ü+x.txt"]


def test_empty_continuation_token_is_no_token(node: GatewayNode) -> None:
    s3 = node.client()
    s3.put_object(Bucket="filed", Key="tok/1", Body=b"1")
    first = s3.list_objects_v2(Bucket="filed", Prefix="tok/", ContinuationToken="")
    assert [o["Key"] for o in first["Contents"]] == ["tok/1"]


# -- part numbers, attributes, bucket listings, versioning ----------------------------------


def test_part_number_1_of_an_object_not_uploaded_in_parts_is_the_whole_object(
    node: GatewayNode, bucket: str
) -> None:
    s3 = node.client()
    put = s3.put_object(Bucket=bucket, Key="single.txt", Body=b"body")
    got = s3.get_object(Bucket=bucket, Key="single.txt", PartNumber=1)
    assert (got["Body"].read(), got["ETag"]) == (b"body", put["ETag"])
    assert got["ContentRange"] == "bytes 0-3/4"
    head = s3.head_object(Bucket=bucket, Key="single.txt", PartNumber=1)
    assert (head["ContentLength"], head["ETag"]) == (4, put["ETag"])
    for call in (s3.get_object, s3.head_object):
        with pytest.raises(ClientError) as exc:
            call(Bucket=bucket, Key="single.txt", PartNumber=2)
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="single.txt", PartNumber=2)
    assert _code(exc) == ("InvalidPartNumber", 416)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="single.txt", PartNumber=1, Range="bytes=0-1")
    assert _code(exc) == ("InvalidRequest", 400)
    s3.put_object(Bucket=bucket, Key="empty.txt", Body=b"")
    assert s3.get_object(Bucket=bucket, Key="empty.txt", PartNumber=1)["Body"].read() == b""


def test_part_number_of_an_object_uploaded_in_parts_is_its_part_or_refused_not_answered_wrong(
    node: GatewayNode,
) -> None:
    s3 = node.client()
    upload_id, parts = _upload(s3, "filed", "parted.bin", b"p" * 5 * MiB, b"q")
    s3.complete_multipart_upload(
        Bucket="filed", Key="parted.bin", UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    # The file store recorded the parts' sizes when it joined them.
    first = s3.get_object(Bucket="filed", Key="parted.bin", PartNumber=1)
    assert first["Body"].read() == b"p" * 5 * MiB
    assert first["ContentRange"] == f"bytes 0-{5 * MiB - 1}/{5 * MiB + 1}"
    last = s3.head_object(Bucket="filed", Key="parted.bin", PartNumber=2)
    assert (last["ContentLength"], last["PartsCount"]) == (1, 2)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="filed", Key="parted.bin", PartNumber=3)
    assert _code(exc) == ("InvalidPartNumber", 416)
    # A copy keeps the ETag, not the parts: their sizes are not known, so no answer is made up.
    s3.copy_object(Bucket="filed", Key="parted-copy.bin", CopySource="filed/parted.bin")
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="filed", Key="parted-copy.bin", PartNumber=1)
    assert _code(exc) == ("NotImplemented", 501)


def test_get_object_attributes(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    put = s3.put_object(Bucket=bucket, Key="attrs.bin", Body=b"x" * 100, ChecksumAlgorithm="SHA256")
    got = s3.get_object_attributes(
        Bucket=bucket, Key="attrs.bin",
        ObjectAttributes=["ETag", "ObjectSize", "StorageClass", "Checksum"],
    )  # fmt: skip
    assert got["ETag"] == put["ETag"].strip('"')
    assert (got["ObjectSize"], got["StorageClass"]) == (100, "STANDARD")
    assert got["Checksum"]["ChecksumSHA256"] == put["ChecksumSHA256"]
    assert got["LastModified"]
    only = s3.get_object_attributes(Bucket=bucket, Key="attrs.bin", ObjectAttributes=["ObjectSize"])
    assert "ETag" not in only and only["ObjectSize"] == 100
    with pytest.raises(ClientError) as exc:
        s3.get_object_attributes(Bucket=bucket, Key="absent", ObjectAttributes=["ETag"])
    assert _code(exc) == ("NoSuchKey", 404)


def test_list_buckets_pages_by_max_buckets_and_prefix(node: GatewayNode) -> None:
    s3 = node.client()
    for name in ("page-a", "page-b", "page-c"):
        s3.create_bucket(Bucket=name)
    first = s3.list_buckets(MaxBuckets=2, Prefix="page-")
    assert [b["Name"] for b in first["Buckets"]] == ["page-a", "page-b"]
    assert first["Prefix"] == "page-"
    rest = s3.list_buckets(
        MaxBuckets=2, Prefix="page-", ContinuationToken=first["ContinuationToken"]
    )
    assert [b["Name"] for b in rest["Buckets"]] == ["page-c"]
    assert "ContinuationToken" not in rest
    every = [b["Name"] for page in s3.get_paginator("list_buckets").paginate(
        PaginationConfig={"PageSize": 1}) for b in page["Buckets"]]  # fmt: skip
    assert every == sorted(every) and {"filed", "s3d", "page-a", "page-c"} <= set(every)
    assert s3.list_buckets(BucketRegion="eu-west-1")["Buckets"] == []
    for bad in ("0", "10001", "x"):  # boto3 refuses to send these itself
        answer = _signed_get(node, f"/?max-buckets={bad}")
        assert answer.error()[:2] == (400, "InvalidArgument")


def test_get_bucket_versioning_answers_unversioned(node: GatewayNode) -> None:
    s3 = node.client()
    got = s3.get_bucket_versioning(Bucket="filed")
    assert "Status" not in got and got["ResponseMetadata"]["HTTPStatusCode"] == 200
    body = _signed_get(node, "/s3d?versioning").body
    assert (
        ET.fromstring(body).tag
        == "{http://s3.amazonaws.com/doc/2006-03-01/}VersioningConfiguration"
    )
    with pytest.raises(ClientError) as exc:
        s3.get_bucket_versioning(Bucket="no-such-bucket")
    assert _code(exc) == ("NoSuchBucket", 404)


def test_list_object_versions_of_an_unversioned_bucket_and_clean_up_by_version(
    node: GatewayNode, bucket: str
) -> None:
    """What conformance suites and tools' clean-up code do: list every version (all "null")
    page by page, then delete each by its version id."""
    s3 = node.client()
    keys = [f"vers/{c}/{i}" for c in "ab" for i in range(4)] + ["vers/top"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    pages = s3.get_paginator("list_object_versions").paginate(
        Bucket=bucket, Prefix="vers/", PaginationConfig={"PageSize": 3}
    )
    versions = [v for page in pages for v in page.get("Versions", [])]
    assert [v["Key"] for v in versions] == sorted(keys)
    assert {(v["VersionId"], v["IsLatest"]) for v in versions} == {("null", True)}
    assert all(v["Size"] == len(v["Key"]) for v in versions)
    grouped = s3.list_object_versions(Bucket=bucket, Prefix="vers/", Delimiter="/")
    assert [p["Prefix"] for p in grouped["CommonPrefixes"]] == ["vers/a/", "vers/b/"]
    assert [v["Key"] for v in grouped["Versions"]] == ["vers/top"]
    got = s3.get_object(Bucket=bucket, Key="vers/top", VersionId="null")
    assert got["Body"].read() == b"vers/top"
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="vers/top", VersionId="3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY")
    assert _code(exc) == ("InvalidArgument", 400)
    for v in versions:
        s3.delete_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])
    assert "Versions" not in s3.list_object_versions(Bucket=bucket, Prefix="vers/")


# -- aws-cli -------------------------------------------------------------------------------


def aws(node: GatewayNode, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    out = subprocess.run(
        [str(BIN / "aws"), "--endpoint-url", node.url, "--output", "json", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def s3api(node: GatewayNode, *args: str) -> Any:
    out = aws(node, "s3api", *args)
    return json.loads(out) if out else None


def test_aws_cli_sees_the_answers(node: GatewayNode, tmp_path: Path) -> None:
    s3api(node, "create-bucket", "--bucket", "cli-made")
    s3api(node, "create-bucket", "--bucket", "cli-made")  # its own again: 200
    (tmp_path / "f.txt").write_bytes(b"hello")
    aws(node, "s3", "cp", str(tmp_path / "f.txt"), "s3://cli-made/f.txt")
    assert s3api(node, "get-bucket-versioning", "--bucket", "cli-made") is None
    head = s3api(node, "head-object", "--bucket", "cli-made", "--key", "f.txt",
                 "--part-number", "1")  # fmt: skip
    assert head["ContentLength"] == 5
    attrs = s3api(node, "get-object-attributes", "--bucket", "cli-made", "--key", "f.txt",
                  "--object-attributes", "ObjectSize", "ETag")  # fmt: skip
    assert attrs["ObjectSize"] == 5 and attrs["ETag"] == head["ETag"].strip('"')
    listed = s3api(node, "list-buckets", "--prefix", "cli-", "--page-size", "1")
    assert [b["Name"] for b in listed["Buckets"]] == ["cli-made"]
    url = aws(node, "s3", "presign", "s3://cli-made/f.txt", "--expires-in", "60")
    assert httpx.get(url).content == b"hello"
    aws(node, "s3", "rm", "s3://cli-made/f.txt")
    s3api(node, "delete-bucket", "--bucket", "cli-made")
    r = httpx.get(url)
    assert Answer(r.status_code, dict(r.headers), r.content).error()[:2] == (404, "NoSuchBucket")


def test_complete_sent_twice_at_once_answers_both_with_one_etag(
    node: GatewayNode, bucket: str
) -> None:
    s3 = node.client(max_pool_connections=4)
    upload_id, parts = _upload(s3, bucket, "twice.bin", b"t" * 5 * MiB, b"u" * 10)

    def complete() -> str:
        return str(
            s3.complete_multipart_upload(
                Bucket=bucket, Key="twice.bin", UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )["ETag"]
        )  # fmt: skip

    with ThreadPoolExecutor(2) as pool:
        etags = list(pool.map(lambda _: complete(), range(2)))
    assert etags[0] == etags[1] and etags[0].endswith('-2"')
    assert s3.get_object(Bucket=bucket, Key="twice.bin")["ContentLength"] == 5 * MiB + 10
