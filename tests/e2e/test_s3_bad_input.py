"""Hostile and malformed requests against a `gateway serve` subprocess (PostgreSQL metadata, a
file mount and an S3 mount on moto): each is answered with S3's own 4xx error (code, status,
XML body with the request id the response header carries), never a 500 or a dropped
connection, and no traceback is logged for any of them. SigV2 signatures are bound to the
one resource they were made for."""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import boto3
import httpx
import pytest
from botocore.auth import HmacV1Auth, S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy
from tests.support.postgres import temp_database

ORIGIN = "origin-bad-input"
BODY = b"0123456789" * 10  # 100 bytes
CREDENTIALS = Credentials(ACCESS_KEY, SECRET_KEY)


@pytest.fixture(scope="module")
def folder(module_dir: Path) -> Path:
    root = module_dir / "files"
    root.mkdir()
    (root / "a b").write_bytes(b"the key 'a b'")
    (root / "a%20b").write_bytes(b"the key 'a%20b'")
    (root / "obj").write_bytes(BODY)
    return root


@pytest.fixture(scope="module")
def node(
    module_dir: Path, origin: CountingProxy, origin_s3: Any, folder: Path
) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    origin_s3.put_object(Bucket=ORIGIN, Key="obj", Body=BODY)
    # PostgreSQL: its text columns refuse NUL, which SQLite would have stored.
    with temp_database() as url:
        node = start_gateway(
            module_dir / "node", database_url=url, args=("--base-domain", "s3.test")
        )
        opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
        node.cli("mount", "add", "s3m", f"s3://{ORIGIN}", *opts)
        node.cli("mount", "add", "files", folder.as_uri())
        eventually(lambda: node.buckets() >= {"s3m", "files"})
        yield node
        node.stop()


@pytest.fixture(autouse=True)
def no_traceback(node: GatewayNode) -> Iterator[None]:
    """Whatever a test sends, the node logs no traceback for it."""
    before = len(node.log())
    yield
    logged = node.log()[before:]
    assert "Traceback" not in logged and "internal error" not in logged, logged


def sigv2_client(node: GatewayNode) -> Any:
    """boto3 as a client left at SigV2 signs: the header form (`signature_version='s3'`);
    its generate_presigned_url makes the query form for any S3 client with an endpoint."""
    return boto3.client(
        "s3", endpoint_url=node.url, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
        config=Config(signature_version="s3", s3={"addressing_style": "path"},
                      retries={"max_attempts": 1}),
    )  # fmt: skip


def presigner(node: GatewayNode) -> Any:
    return boto3.client(
        "s3", endpoint_url=node.url, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
    )  # fmt: skip


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> tuple[int, str | None]:
        """(status, code) after checking the body is S3's error document with the request id
        of the response header."""
        root = ET.fromstring(self.body)
        assert root.tag == "Error"
        assert root.findtext("RequestId") == self.headers["x-amz-request-id"]
        return self.status, root.findtext("Code")


def send(node: GatewayNode, method: str, target: str, headers: dict[str, str] | None = None,
         body: bytes = b"", host: str | None = None) -> Answer:  # fmt: skip
    """One request exactly as given (request line, headers, body) on its own connection."""
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    try:
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host or f"127.0.0.1:{node.port}")
        for name, value in (headers or {}).items():
            conn.putheader(name, value.encode("latin-1"))
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        data = response.read()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
    finally:
        conn.close()


def sigv4(node: GatewayNode, method: str, target: str, headers: dict[str, str] | None = None,
          body: bytes = b"") -> Answer:  # fmt: skip
    """`target` (path and query, already escaped as it goes on the wire) signed with SigV4."""
    request = AWSRequest(method=method, url=node.url + target, headers=headers, data=body)
    S3SigV4Auth(CREDENTIALS, "s3", "us-east-1").add_auth(request)
    signed = {k: v for k, v in request.headers.items() if k.lower() != "host"}
    return send(node, method, target, signed, body)


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    r = exc.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


# -- SigV2: a signature is good for one resource -----------------------------------------


def test_sigv2_presigned_get_is_bound_to_the_key_it_was_made_for(node: GatewayNode) -> None:
    url = presigner(node).generate_presigned_url(
        "get_object", Params={"Bucket": "files", "Key": "a b"}
    )
    split = urlsplit(url)
    assert split.path == "/files/a%20b" and "AWSAccessKeyId=" in split.query
    assert httpx.get(url).content == b"the key 'a b'"
    # /files/a%2520b names the key "a%20b": the signature is not for it.
    forged = send(node, "GET", f"/files/a%2520b?{split.query}")
    assert forged.error() == (403, "SignatureDoesNotMatch")


def test_sigv2_presigned_put_cannot_write_another_key(node: GatewayNode, folder: Path) -> None:
    url = presigner(node).generate_presigned_url(
        "put_object", Params={"Bucket": "files", "Key": "report 1.csv"}
    )
    split = urlsplit(url)
    forged = send(node, "PUT", f"/files/report%25201.csv?{split.query}", body=b"forged")
    assert forged.error() == (403, "SignatureDoesNotMatch")
    assert not (folder / "report%201.csv").exists()
    assert httpx.put(url, content=b"genuine").status_code == 200
    assert (folder / "report 1.csv").read_bytes() == b"genuine"


def test_sigv2_header_signature_is_bound_to_the_key_it_was_made_for(node: GatewayNode) -> None:
    request = AWSRequest(method="GET", url=f"{node.url}/files/a%20b")
    HmacV1Auth(CREDENTIALS).add_auth(request)
    headers = dict(request.headers.items())
    assert send(node, "GET", "/files/a%20b", headers).body == b"the key 'a b'"
    forged = send(node, "GET", "/files/a%2520b", headers)
    assert forged.error() == (403, "SignatureDoesNotMatch")


def test_sigv2_virtual_host_requests_sign_bucket_and_path(node: GatewayNode) -> None:
    host = f"files.s3.test:{node.port}"
    for path, auth_path, expected in [
        ("/a%20b", "/files/a%20b", b"the key 'a b'"),
        ("/", "/files/", b"<ListBucketResult"),
    ]:
        request = AWSRequest(method="GET", url=f"http://{host}{path}")
        request.auth_path = auth_path
        HmacV1Auth(CREDENTIALS).add_auth(request)
        headers = dict(request.headers.items())
        answer = send(node, "GET", path, headers, host=host)
        assert answer.status == 200 and expected in answer.body
    forged = send(node, "GET", "/a%2520b", headers, host=host)
    assert forged.error() == (403, "SignatureDoesNotMatch")


AWKWARD_KEYS = [
    "with space.txt", "100%.txt", "a%20b literal", "plus+sign", "ünïcödé/ключ.txt",
    "tilde~name", "semi;colon,comma", "q?mark#hash", "amp&eq=", "quote'dollar$at@",
    "bang!star*(paren)", "two  spaces",
]  # fmt: skip


@pytest.mark.parametrize("key", AWKWARD_KEYS)
def test_awkward_keys_round_trip_through_both_sigv2_forms(node: GatewayNode, key: str) -> None:
    s3 = sigv2_client(node)
    s3.put_object(Bucket="files", Key=f"v2/{key}", Body=b"header form")
    assert s3.get_object(Bucket="files", Key=f"v2/{key}")["Body"].read() == b"header form"
    presign = presigner(node).generate_presigned_url
    put = presign("put_object", Params={"Bucket": "files", "Key": f"v2q/{key}"})
    assert "AWSAccessKeyId=" in put
    assert httpx.put(put, content=b"query form").status_code == 200
    get = presign("get_object", Params={"Bucket": "files", "Key": f"v2q/{key}"})
    assert httpx.get(get).content == b"query form"
    assert s3.get_object(Bucket="files", Key=f"v2q/{key}")["Body"].read() == b"query form"


@pytest.mark.skipif(
    shutil.which("s3cmd") is None and not os.environ.get("CI"),
    reason="s3cmd is not installed (scripts/install-test-servers installs it)",
)
def test_s3cmd_sigv2_puts_lists_gets_and_signs_urls(node: GatewayNode, tmp_path: Path) -> None:
    """s3cmd dates its SigV2 requests with x-amz-date, whose value has a comma of its own."""
    config = tmp_path / "s3cfg"
    host = f"127.0.0.1:{node.port}"
    config.write_text(
        f"[default]\naccess_key = {ACCESS_KEY}\nsecret_key = {SECRET_KEY}\n"
        f"host_base = {host}\nhost_bucket = {host}\nuse_https = False\nsignature_v2 = True\n"
    )
    source = tmp_path / "up.txt"
    source.write_bytes(b"from s3cmd")
    target = "s3://files/s3cmd dir/ünï 100%+~.txt"

    def s3cmd(*args: str) -> str:
        out = subprocess.run(
            ["s3cmd", "-c", str(config), *args], capture_output=True, text=True, timeout=60,
            env={**os.environ, "HOME": str(tmp_path)},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout

    s3cmd("put", str(source), target)
    assert "ünï 100%+~.txt" in s3cmd("ls", "s3://files/s3cmd dir/")
    s3cmd("get", "--force", target, str(tmp_path / "down.txt"))
    assert (tmp_path / "down.txt").read_bytes() == b"from s3cmd"
    url = s3cmd("signurl", target, "+600").strip()
    assert httpx.get(url).content == b"from s3cmd"
    assert httpx.get(url.replace("100%25", "100%2525")).status_code == 403


# -- numbers: ASCII digits only, bounded -------------------------------------------------


@pytest.mark.parametrize("expires", ["%C2%B2", "9" * 5000, "1_0", "%2B5"])
def test_sigv2_expires_that_is_no_number_is_access_denied(node: GatewayNode, expires: str) -> None:
    url = presigner(node).generate_presigned_url(
        "get_object", Params={"Bucket": "files", "Key": "obj"}
    )
    split = urlsplit(url)
    query = "&".join(
        f"Expires={expires}" if p.startswith("Expires=") else p for p in split.query.split("&")
    )
    assert send(node, "GET", f"{split.path}?{query}").error() == (403, "AccessDenied")


def test_sigv4_presigned_expires_of_5000_digits_is_refused(node: GatewayNode) -> None:
    url = node.client().generate_presigned_url(
        "get_object", Params={"Bucket": "files", "Key": "obj"}
    )
    split = urlsplit(url)
    query = split.query.replace("X-Amz-Expires=3600", "X-Amz-Expires=" + "9" * 5000)
    answer = send(node, "GET", f"{split.path}?{query}")
    assert answer.error() == (400, "AuthorizationQueryParametersError")


BAD_NUMBERS = ["%C2%B2", "9" * 5000, "1_0", "%2B5", "%205", "%D9%A3", "0x1", "2147483648"]


@pytest.fixture(scope="module")
def upload_id(node: GatewayNode) -> str:
    return str(node.client().create_multipart_upload(Bucket="files", Key="mpu")["UploadId"])


@pytest.mark.parametrize("number", ["²", "9" * 5000, "+1", "1_0", "", "-1", "0x1", "\u0661"])
def test_complete_multipart_with_a_part_number_that_is_no_number_is_malformed_xml(
    node: GatewayNode, upload_id: str, number: str
) -> None:
    body = (
        "<CompleteMultipartUpload><Part><PartNumber>"
        f'{number}</PartNumber><ETag>"x"</ETag></Part></CompleteMultipartUpload>'
    ).encode()
    answer = sigv4(node, "POST", f"/files/mpu?uploadId={upload_id}", body=body)
    assert answer.error() == (400, "MalformedXML")


@pytest.mark.parametrize("number", [*BAD_NUMBERS, "0", "10001"])
def test_upload_part_number_that_is_no_part_number_is_invalid_argument(
    node: GatewayNode, upload_id: str, number: str
) -> None:
    target = f"/files/mpu?uploadId={upload_id}&partNumber={number}"
    assert sigv4(node, "PUT", target, body=b"part").error() == (400, "InvalidArgument")


@pytest.mark.parametrize(
    "query",
    ["list-type=2&max-keys={}", "max-keys={}", "uploads&max-uploads={}"],
)
@pytest.mark.parametrize("number", BAD_NUMBERS)
def test_bucket_counts_that_are_no_numbers_are_invalid_argument(
    node: GatewayNode, query: str, number: str
) -> None:
    answer = sigv4(node, "GET", "/files?" + query.format(number))
    assert answer.error() == (400, "InvalidArgument")


@pytest.mark.parametrize("param", ["max-parts", "part-number-marker"])
@pytest.mark.parametrize("number", BAD_NUMBERS)
def test_list_parts_counts_that_are_no_numbers_are_invalid_argument(
    node: GatewayNode, upload_id: str, param: str, number: str
) -> None:
    answer = sigv4(node, "GET", f"/files/mpu?uploadId={upload_id}&{param}={number}")
    assert answer.error() == (400, "InvalidArgument")


def test_counts_with_leading_zeros_are_numbers(node: GatewayNode, upload_id: str) -> None:
    assert sigv4(node, "GET", "/files?list-type=2&max-keys=0001").status == 200
    assert sigv4(node, "GET", f"/files/mpu?uploadId={upload_id}&max-parts=010").status == 200


HUGE_DATE = "Mon, 01 Jan 99999999999 00:00:00 GMT"


@pytest.mark.parametrize("header", ["If-Modified-Since", "If-Unmodified-Since"])
def test_condition_dates_no_calendar_holds_are_ignored(node: GatewayNode, header: str) -> None:
    answer = sigv4(node, "GET", "/files/obj", {header: HUGE_DATE})
    assert (answer.status, answer.body) == (200, BODY)


def test_sigv4_date_header_no_calendar_holds_is_access_denied(node: GatewayNode) -> None:
    """Without X-Amz-Date the Date header dates a SigV4 request."""
    authorization = (
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20260101/us-east-1/s3/aws4_request, "
        f"SignedHeaders=date;host;x-amz-content-sha256, Signature={'0' * 64}"
    )
    headers = {
        "Authorization": authorization, "Date": HUGE_DATE,
        "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
    }  # fmt: skip
    assert send(node, "GET", "/files/obj", headers).error() == (403, "AccessDenied")


def test_sigv2_date_no_calendar_holds_is_access_denied(node: GatewayNode) -> None:
    headers = {"Authorization": f"AWS {ACCESS_KEY}:c2WLPFtWHVgbEmeEG93a4cG37dM=", "Date": HUGE_DATE}
    assert send(node, "GET", "/files/obj", headers).error() == (403, "AccessDenied")


# -- values that go back in headers ------------------------------------------------------

OVERRIDES = [
    "response-content-type", "response-content-language", "response-expires",
    "response-cache-control", "response-content-disposition", "response-content-encoding",
]  # fmt: skip


@pytest.mark.parametrize("param", OVERRIDES)
@pytest.mark.parametrize("value", ["%E2%9C%93", "a%0D%0Ab", "a%0Ab", "%7F", "x%0D%0AX-Evil%3A%201"])
def test_response_override_http_cannot_carry_is_invalid_argument(
    node: GatewayNode, param: str, value: str
) -> None:
    answer = sigv4(node, "GET", f"/files/obj?{param}={value}")
    assert answer.error() == (400, "InvalidArgument")
    assert "x-evil" not in answer.headers


def test_response_override_with_latin_1_text_is_sent_back(node: GatewayNode) -> None:
    answer = sigv4(node, "GET", "/files/obj?response-content-disposition=attachment%3B%20%C3%A9")
    assert answer.status == 200
    assert answer.headers["content-disposition"] == "attachment; \xe9"


def test_response_override_from_boto3_with_a_line_break_is_invalid_argument(
    node: GatewayNode,
) -> None:
    with pytest.raises(ClientError) as exc:
        node.client().get_object(Bucket="files", Key="obj", ResponseContentType="a\r\nb")
    assert _code(exc) == (400, "InvalidArgument")


def test_store_values_http_cannot_carry_go_out_rfc_2047_encoded(
    node: GatewayNode, folder: Path
) -> None:
    """Attributes another writer left on a file (the file store keeps them in an xattr) that
    hold a line break or non-latin-1 text (or, in user metadata, any non-ASCII text): S3's RFC
    2047 word, not a broken response."""
    path = folder / "odd-attrs"
    path.write_bytes(b"odd")
    st = path.stat()
    doc = {
        "etag": '"odd"', "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ct": "t\u00ebxt/\u2713",
        "meta": {"note": "line1\r\nX-Evil: 1", "plain": "caf\u00e9"},
    }  # fmt: skip
    try:
        os.setxattr(path, "user.s3gw.meta", json.dumps(doc).encode())
    except OSError:
        pytest.skip("no user xattrs on this file system")
    answer = sigv4(node, "GET", "/files/odd-attrs")
    assert (answer.status, answer.body) == (200, b"odd")
    assert "x-evil" not in answer.headers
    words = {
        "content-type": "t\u00ebxt/\u2713",
        "x-amz-meta-note": "line1\r\nX-Evil: 1",
        "x-amz-meta-plain": "caf\u00e9",  # user metadata not ASCII: a word, as S3 answers it
    }
    for name, text in words.items():
        assert answer.headers[name] == f"=?UTF-8?B?{base64.b64encode(text.encode()).decode()}?="


# -- NUL, which the metadata database cannot hold ----------------------------------------


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/files/mpu?uploadId=%00"),
        ("DELETE", "/files/mpu?uploadId=a%00b"),
        ("PUT", "/files/mpu?uploadId=%00&partNumber=1"),
        ("GET", "/files?uploads&key-marker=%00&upload-id-marker=%00"),
        ("GET", "/files?uploads&prefix=%00"),
        ("GET", "/files?list-type=2&start-after=%00"),
        ("POST", "/s3m/a%00b?uploads"),
        ("PUT", "/s3m/a%00b"),
        ("GET", "/s3m/a%00b"),
    ],
)
def test_nul_in_a_key_or_query_is_invalid_argument(
    node: GatewayNode, origin: CountingProxy, method: str, target: str
) -> None:
    before = len(origin.requests)
    body = b"x" if method == "PUT" else b""
    assert sigv4(node, method, target, body=body).error() == (400, "InvalidArgument")
    assert len(origin.requests) == before


def test_error_document_for_a_key_with_control_characters_is_well_formed(
    node: GatewayNode,
) -> None:
    answer = sigv4(node, "GET", "/files/a%01%1Fb")
    assert answer.error() == (404, "NoSuchKey")  # parsed as XML
    assert b"a%01%1Fb" in answer.body


# -- S3's limits: user metadata, key length ----------------------------------------------


@pytest.mark.parametrize("bucket", ["files", "s3m"])
def test_user_metadata_over_2_kb_is_metadata_too_large_before_the_store_is_asked(
    node: GatewayNode, origin: CountingProxy, folder: Path, bucket: str
) -> None:
    s3 = node.client()
    just_fits = {"k": "v" * 2047}  # S3 counts the bytes of names and values: 2048
    s3.put_object(Bucket=bucket, Key="meta-fits", Body=b"x", Metadata=just_fits)
    assert s3.head_object(Bucket=bucket, Key="meta-fits")["Metadata"] == just_fits
    before = len(origin.requests)
    for metadata in (
        {"k": "v" * 2048},
        {"big": "v" * 10_000},
        {f"k{i}": "v" * 210 for i in range(10)},
    ):
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket=bucket, Key="meta-big", Body=b"x", Metadata=metadata)
        assert _code(exc) == (400, "MetadataTooLarge")
    with pytest.raises(ClientError) as exc:
        s3.copy_object(
            Bucket=bucket, Key="meta-big", CopySource={"Bucket": bucket, "Key": "meta-fits"},
            MetadataDirective="REPLACE", Metadata={"k": "v" * 2048},
        )  # fmt: skip
    assert _code(exc) == (400, "MetadataTooLarge")
    with pytest.raises(ClientError) as exc:
        s3.create_multipart_upload(Bucket=bucket, Key="meta-big", Metadata={"k": "v" * 2048})
    assert _code(exc) == (400, "MetadataTooLarge")
    assert len(origin.requests) == before
    assert not (folder / "meta-big").exists()
    answer = sigv4(node, "PUT", f"/{bucket}/meta-big", {"x-amz-meta-k": "v" * 2048}, b"x")
    assert answer.error() == (400, "MetadataTooLarge")


KEY_1024 = ("k" * 200 + "/") * 5 + "é" * 9 + "x" * 1  # 1005 + 18 + 1 = 1024 bytes
KEY_1025 = KEY_1024 + "y"


def test_key_of_1024_bytes_is_a_key(node: GatewayNode) -> None:
    assert len(KEY_1024.encode()) == 1024
    s3 = node.client()
    s3.put_object(Bucket="s3m", Key=KEY_1024, Body=b"longest")
    assert s3.get_object(Bucket="s3m", Key=KEY_1024)["Body"].read() == b"longest"


@pytest.mark.parametrize("key", [KEY_1025, "é" * 513], ids=["1025-ascii", "1026-utf8"])
def test_key_over_1024_bytes_is_key_too_long_before_the_store_is_asked(
    node: GatewayNode, origin: CountingProxy, key: str
) -> None:
    s3 = node.client()
    before = len(origin.requests)
    calls = [
        lambda: s3.put_object(Bucket="s3m", Key=key, Body=b"x"),
        lambda: s3.get_object(Bucket="s3m", Key=key),
        lambda: s3.create_multipart_upload(Bucket="s3m", Key=key),
        lambda: s3.copy_object(Bucket="s3m", Key=key, CopySource={"Bucket": "s3m", "Key": "obj"}),
        lambda: s3.copy_object(Bucket="s3m", Key="copy", CopySource={"Bucket": "s3m", "Key": key}),
        lambda: s3.delete_object(Bucket="s3m", Key=key),
    ]
    for call in calls:
        with pytest.raises(ClientError) as exc:
            call()
        assert _code(exc) == (400, "KeyTooLongError")
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket="s3m", Key=key)
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert len(origin.requests) == before
    answer = sigv4(node, "GET", "/files/" + quote(key))
    assert answer.error() == (400, "KeyTooLongError")
    root = ET.fromstring(answer.body)
    assert (root.findtext("Size"), root.findtext("MaxSizeAllowed")) == (
        str(len(key.encode())),
        "1024",
    )


def test_delete_objects_reports_a_key_over_1024_bytes_as_that_keys_error(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    origin_s3.put_object(Bucket=ORIGIN, Key="doomed", Body=b"x")
    before = origin.count("DELETE") + origin.count("POST")
    result = node.client().delete_objects(
        Bucket="s3m", Delete={"Objects": [{"Key": KEY_1025}, {"Key": "doomed"}]}
    )
    assert [d["Key"] for d in result["Deleted"]] == ["doomed"]
    assert [(e["Key"], e["Code"]) for e in result["Errors"]] == [(KEY_1025, "KeyTooLongError")]
    assert origin.count("DELETE") + origin.count("POST") - before == 1  # "doomed" alone


# -- Range: what S3 honours, ignores and refuses -----------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        "bytes=+1-2", "bytes=1_0-20", "bytes= 1-2", "bytes=1 -2", "bytes=0x1-2", "bytes=1-2,4-5",
        "bytes=5-2", "bytes=1-2-3", "bytes=-", "bytes=", "bytes=99999999999999999999-",
        "items=1-2", "bytes 1-2", "bytes=\xd9\xa3-5", "bytes=²-5",
    ],
)  # fmt: skip
def test_range_header_s3_ignores_answers_the_whole_object(node: GatewayNode, header: str) -> None:
    for bucket in ("files", "s3m"):
        answer = sigv4(node, "GET", f"/{bucket}/obj", {"Range": header})
        assert (answer.status, answer.body) == (200, BODY), (bucket, header)
        assert "content-range" not in answer.headers


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=1-2", BODY[1:3]), ("bytes=98-", BODY[98:]), ("bytes=-3", BODY[-3:]),
        ("bytes=0-999", BODY), ("Bytes=0001-0002", BODY[1:3]), ("bytes=-1000", BODY),
    ],
)  # fmt: skip
def test_range_header_s3_honours_is_partial_content(
    node: GatewayNode, header: str, expected: bytes
) -> None:
    got = node.client().get_object(Bucket="files", Key="obj", Range=header)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["Body"].read() == expected


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=100-200", "bytes=-0"])
def test_range_header_that_cannot_be_satisfied_is_416(node: GatewayNode, header: str) -> None:
    answer = sigv4(node, "GET", "/files/obj", {"Range": header})
    assert answer.error() == (416, "InvalidRange")
    assert answer.headers["content-range"] == "bytes */100"
