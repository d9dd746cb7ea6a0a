"""What clients hear when an under-store fails or refuses, through a gateway subprocess.

A failure that is the store's stays a 5xx whose message is generic for its class: the origin's
address, bucket and folder go to the log, on a line with the request id the client got. A
refusal that is the client's fault is the S3 error S3 itself would answer, never a 5xx that
clients retry three times.
"""

from __future__ import annotations

import base64
import io
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually, free_port
from tests.support.odd_origin import OddOrigin
from tests.support.origin import MotoServer

MiB = 1 << 20


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    node = start_gateway(module_dir / "node")
    yield node
    node.stop()


@pytest.fixture(scope="module")
def odd(moto_server: MotoServer) -> Iterator[OddOrigin]:
    proxy = OddOrigin(moto_server.url)
    yield proxy
    proxy.stop()


def _mount(node: GatewayNode, uri: str, *options: str, check: bool = True) -> str:
    bucket = f"b-{uuid.uuid4().hex[:10]}"
    node.cli(
        "mount", "add", bucket, uri, *[x for o in options for x in ("-o", o)],
        *(() if check else ("--no-check",)),
    )  # fmt: skip
    s3 = node.client()
    eventually(lambda: s3.head_bucket(Bucket=bucket))
    return bucket


@pytest.fixture
def s3_bucket(node: GatewayNode, odd: OddOrigin, origin_s3: Any) -> Iterator[tuple[str, str]]:
    """(gateway bucket, origin bucket): an S3 mount whose origin is moto behind OddOrigin."""
    name = f"o{uuid.uuid4().hex[:10]}"
    origin_s3.create_bucket(Bucket=name)
    bucket = _mount(node, f"s3://{name}", f"endpoint_url={odd.url}", "access_key=a", "secret_key=s")
    yield bucket, name
    odd.reset()


@pytest.fixture
def file_bucket(node: GatewayNode, tmp_path: Path) -> str:
    (tmp_path / "files").mkdir()
    return _mount(node, (tmp_path / "files").as_uri())


def _error(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str, str]:
    response = exc.value.response
    status = response["ResponseMetadata"]["HTTPStatusCode"]
    return status, response["Error"].get("Code", ""), response["Error"].get("Message", "")


def _one_try(node: GatewayNode) -> Any:
    """A client that does not retry (node.client() retries once): what the gateway answered."""
    return boto3.client(
        "s3",
        endpoint_url=node.url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )


def _log_lines(node: GatewayNode, request_id: str) -> list[dict[str, Any]]:
    lines = []
    for line in node.log().splitlines():
        if request_id in line and line.startswith("{"):
            lines.append(json.loads(line))
    return lines


# -- 5xx: generic for clients, detailed in the log ---------------------------------------------


def test_503_tells_an_anonymous_client_nothing_of_the_origin(node: GatewayNode) -> None:
    port = free_port()  # nothing listens: the origin is unreachable
    bucket = _mount(
        node, "s3://private-origin-bucket/secret/prefix", f"endpoint_url=http://127.0.0.1:{port}",
        "access_key=a", "secret_key=s", "public_read=true", "max_attempts=1", "connect_timeout=0.5",
        check=False,  # `mount add` would refuse it (tests/e2e/test_operator.py)
    )  # fmt: skip
    reply = httpx.get(f"{node.url}/{bucket}/data.bin")
    assert reply.status_code == 503
    body = reply.text
    assert "<Code>ServiceUnavailable</Code>" in body
    # The mount, and the class of the cause: the client named the one and may know the other.
    assert f"Mount {bucket}: its store refused the connection." in body
    for secret in (str(port), "127.0.0.1", "private-origin-bucket", "secret/prefix", "origin"):
        assert secret not in body.replace("<Code>", "").split("<Message>", 1)[1], secret
    request_id = reply.headers["x-amz-request-id"]
    assert f"<RequestId>{request_id}</RequestId>" in body
    # The log line with that request id says what happened, and where.
    logged = eventually(lambda: _log_lines(node, request_id))
    assert any(f"127.0.0.1:{port}" in entry["msg"] for entry in logged), logged
    assert any("private-origin-bucket" in entry["msg"] for entry in logged)


def test_503_of_a_file_mount_whose_folder_is_gone_names_no_path(
    node: GatewayNode, tmp_path: Path
) -> None:
    folder = tmp_path / "vanishing-folder-name"
    folder.mkdir()
    bucket = _mount(node, folder.as_uri(), "public_read=true")
    folder.rmdir()
    reply = httpx.get(f"{node.url}/{bucket}/k")
    assert reply.status_code == 503
    assert "vanishing-folder-name" not in reply.text
    assert f"Mount {bucket}: its store's bucket, container or folder was not found." in reply.text
    logged = eventually(lambda: _log_lines(node, reply.headers["x-amz-request-id"]))
    assert any("vanishing-folder-name" in entry["msg"] for entry in logged)


# -- the client's faults, as S3 answers them ---------------------------------------------------


@pytest.mark.parametrize(
    ("key", "limit"),
    [
        ("d/" + "n" * 300, "names of at most 255 bytes"),  # one name over NAME_MAX
        # A path over PATH_MAX is also a key over S3's 1,024 bytes: refused at the front end.
        ("/".join(["p" * 200] * 22), "Your key is too long"),
    ],
    ids=["name", "path"],
)
def test_key_longer_than_the_file_system_holds_is_400_for_reads_and_writes(
    node: GatewayNode, file_bucket: str, key: str, limit: str
) -> None:
    s3 = node.client()
    s3.put_object(Bucket=file_bucket, Key="src", Body=b"x")
    calls = {
        "PutObject": lambda: s3.put_object(Bucket=file_bucket, Key=key, Body=b"x"),
        "GetObject": lambda: s3.get_object(Bucket=file_bucket, Key=key),
        "CopyObject": lambda: s3.copy_object(
            Bucket=file_bucket, Key=key, CopySource={"Bucket": file_bucket, "Key": "src"}
        ),
        "CreateMultipartUpload": lambda: s3.create_multipart_upload(Bucket=file_bucket, Key=key),
    }
    for name, call in calls.items():
        with pytest.raises(ClientError) as exc:
            call()
        status, code, message = _error(exc)
        assert (status, code) == (400, "KeyTooLongError"), name
        assert limit in message, (name, message)
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=file_bucket, Key=key)
    assert _error(exc)[0] == 400


def test_metadata_more_than_the_file_system_keeps_is_400(
    node: GatewayNode, file_bucket: str
) -> None:
    s3 = node.client()
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=file_bucket, Key="k", Body=b"x", Metadata={"v": "a" * 10240})
    assert _error(exc)[:2] == (400, "MetadataTooLarge")
    with pytest.raises(ClientError):
        s3.head_object(Bucket=file_bucket, Key="k")  # nothing half-written


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("KeyTooLongError", "KeyTooLongError"),
        ("MetadataTooLarge", "MetadataTooLarge"),
        ("InvalidArgument", "InvalidRequest"),
    ],
)
def test_an_origins_refusal_of_the_clients_request_is_a_400(
    node: GatewayNode, odd: OddOrigin, s3_bucket: tuple[str, str], code: str, expected: str
) -> None:
    bucket, _ = s3_bucket
    odd.fail_next("PutObject", 400, code)
    with pytest.raises(ClientError) as exc:
        node.client().put_object(Bucket=bucket, Key="k", Body=b"x")
    status, got, message = _error(exc)
    assert (status, got) == (400, expected)
    assert odd.url.split("//")[1] not in message


def test_non_ascii_metadata_reaches_an_s3_origin_as_rfc_2047(
    node: GatewayNode, s3_bucket: tuple[str, str], origin_s3: Any
) -> None:
    """boto3 (and botocore inside the gateway) refuse non-ASCII metadata; S3 decodes RFC 2047
    words before storing and answers non-ASCII values as one again. The gateway does both."""
    bucket, origin_bucket = s3_bucket
    s3 = node.client()

    def raw_header(request: Any, **_: Any) -> None:
        request.headers["x-amz-meta-city"] = "Z\u00fcrich"  # goes as its UTF-8 bytes
        request.headers["x-amz-meta-word"] = "=?UTF-8?B?5pel5pys?="  # RFC 2047 for 日本

    s3.meta.events.register("before-sign.s3.PutObject", raw_header)
    s3.put_object(Bucket=bucket, Key="meta", Body=b"x")
    # Header bytes are the UTF-8 of the text an SDK sent (docs/s3-api.md).
    city = "Z\u00fcrich"
    at_origin = origin_s3.head_object(Bucket=origin_bucket, Key="meta")["Metadata"]
    assert at_origin == {"city": _word(city), "word": _word("日本")}
    got = node.client().head_object(Bucket=bucket, Key="meta")["Metadata"]
    assert got == {"city": _word(city), "word": _word("日本")}  # as S3 answers them
    assert {k: _text(v) for k, v in got.items()} == {"city": city, "word": "日本"}


def _word(text: str) -> str:
    return f"=?UTF-8?B?{base64.b64encode(text.encode()).decode()}?="


def _text(value: str) -> str:
    """A metadata value as the text it stands for, whether it came as one RFC 2047 word or as
    latin-1 bytes."""
    from email.header import decode_header, make_header

    return str(make_header(decode_header(value)))


def test_a_put_the_origin_fails_once_is_sent_again(
    node: GatewayNode, odd: OddOrigin, s3_bucket: tuple[str, str], origin_s3: Any
) -> None:
    """A PUT sent to the origin in one request (up to 16 MiB) is kept whole while it goes, so
    botocore's retry after a 500 sends it again (it answered 503 UnseekableStreamError)."""
    bucket, origin_bucket = s3_bucket
    data = os.urandom(6 * MiB)
    odd.fail_next("PutObject", 500, "InternalError")
    _one_try(node).put_object(Bucket=bucket, Key="big", Body=data)  # no retry by the client
    assert odd.count("PUT", "/big") == 2
    assert origin_s3.get_object(Bucket=origin_bucket, Key="big")["Body"].read() == data


def test_a_part_too_large_to_keep_fails_with_an_honest_503(
    node: GatewayNode, odd: OddOrigin, s3_bucket: tuple[str, str]
) -> None:
    """A client's part of more than 16 MiB streams through; when the origin fails it, it
    cannot be sent again: 503 (the client has the part and retries), and the log says why."""
    bucket, _ = s3_bucket
    s3 = node.client()
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    odd.fail_next("UploadPart", 500, "InternalError")
    with pytest.raises(ClientError) as exc:
        _one_try(node).upload_part(
            Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=os.urandom(17 * MiB)
        )
    status, code, message = _error(exc)
    assert (status, code) == (503, "ServiceUnavailable")
    assert "Unseekable" not in message and "origin" not in message
    request_id = exc.value.response["ResponseMetadata"]["RequestId"]
    logged = eventually(lambda: _log_lines(node, request_id))
    assert any("cannot" in e["msg"] or "kept to send again" in e["msg"] for e in logged), logged
    # The client sends it again, and the upload completes.
    part = s3.upload_part(
        Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=io.BytesIO(b"p" * MiB)
    )
    s3.complete_multipart_upload(
        Bucket=bucket, Key="mp", UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )  # fmt: skip
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"p" * MiB
