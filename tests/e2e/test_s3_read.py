"""End to end: boto3 and plain HTTP against a `gateway serve` subprocess in front of a real
S3 origin (moto, through a counting proxy) and a local folder."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
BODY = bytes(range(256)) * 40  # 10 KiB, every byte value


@pytest.fixture(scope="module")
def origin_bucket(origin_s3: Any) -> str:
    name = "origin-read"
    origin_s3.create_bucket(Bucket=name)
    origin_s3.put_object(
        Bucket=name,
        Key="ds/obj.bin",
        Body=BODY,
        ContentType="application/x-test",
        Metadata={"origin": "moto", "epoch": "3"},
    )
    for key in ["ds/with space.txt", "ds/plus+sign.txt", "ds/ünïcödé/ключ.txt"]:
        origin_s3.put_object(Bucket=name, Key=key, Body=key.encode())
    for i in range(1100):
        origin_s3.put_object(Bucket=name, Key=f"many/{i // 100:02d}/k{i:05d}", Body=b"x")
    return name


@pytest.fixture(scope="module")
def files_dir(module_dir: Path) -> Path:
    root = module_dir / "files"
    (root / "dir" / "sub").mkdir(parents=True)
    (root / "top.txt").write_bytes(b"top\n")
    (root / "dir" / "a.txt").write_bytes(b"a" * 1000)
    (root / "dir" / "sub" / "b.txt").write_bytes(b"b" * 10)
    return root


@pytest.fixture(scope="module")
def node(
    module_dir: Path, origin: CountingProxy, origin_bucket: str, files_dir: Path
) -> Iterator[GatewayNode]:
    node = start_gateway(module_dir / "node", args=("--base-domain", "s3.test"))
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=origin-ak"]
    opts += ["-o", "secret_key=origin-sk"]
    node.cli("mount", "add", "data", f"s3://{origin_bucket}/ds", *opts)
    node.cli("mount", "add", "many", f"s3://{origin_bucket}/many", *opts)
    node.cli("mount", "add", "fresh", f"s3://{origin_bucket}/ds", *opts, "-o", "metadata_ttl=1")
    node.cli("mount", "add", "files", files_dir.as_uri())
    node.cli("mount", "add", "open", files_dir.as_uri(), "-o", "public_read=true")
    node.cli(
        "mount", "add", "nocache", f"s3://{origin_bucket}/ds", *opts,
        "-o", "cache=off", "-o", "metadata_ttl=600",
    )  # fmt: skip
    eventually(lambda: "nocache" in node.buckets())
    yield node
    node.stop()


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    err = exc.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]


# -- buckets -------------------------------------------------------------------------------


def test_list_buckets_shows_every_mount(node: GatewayNode) -> None:
    names = [b["Name"] for b in node.client().list_buckets()["Buckets"]]
    assert names == ["data", "files", "fresh", "many", "nocache", "open"]


def test_head_bucket_and_location(node: GatewayNode) -> None:
    s3 = node.client()
    assert s3.head_bucket(Bucket="data")["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_bucket_location(Bucket="data").get("LocationConstraint") is None
    with pytest.raises(ClientError) as exc:
        s3.head_bucket(Bucket="nope")
    assert _code(exc)[1] == 404


# -- objects -------------------------------------------------------------------------------


def test_get_object_returns_bytes_and_metadata_of_origin(node: GatewayNode) -> None:
    got = node.client().get_object(Bucket="data", Key="obj.bin")
    assert got["Body"].read() == BODY
    assert got["ContentLength"] == len(BODY)
    assert got["ContentType"] == "application/x-test"
    assert got["Metadata"] == {"origin": "moto", "epoch": "3"}
    assert got["ETag"].startswith('"') and got["ETag"].endswith('"')
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]


def test_second_read_makes_no_origin_request(node: GatewayNode, origin: CountingProxy) -> None:
    s3 = node.client()
    first = s3.get_object(Bucket="data", Key="plus+sign.txt")
    assert first["Body"].read() == b"ds/plus+sign.txt"
    # The reply can end before the block is committed to the page store: wait until it is.
    eventually(lambda: node.metric("gateway_cache_fills_in_flight") == 0)
    origin.reset()
    second = s3.get_object(Bucket="data", Key="plus+sign.txt")
    assert second["Body"].read() == b"ds/plus+sign.txt"
    assert second["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
    assert origin.requests == []


def test_object_overwritten_at_origin_is_served_new_after_ttl(
    node: GatewayNode, origin_s3: Any, origin_bucket: str
) -> None:
    s3 = node.client()
    origin_s3.put_object(Bucket=origin_bucket, Key="ds/changing.txt", Body=b"version one")
    assert s3.get_object(Bucket="fresh", Key="changing.txt")["Body"].read() == b"version one"
    origin_s3.put_object(Bucket=origin_bucket, Key="ds/changing.txt", Body=b"version two!")

    def new_version() -> Any:
        got = s3.get_object(Bucket="fresh", Key="changing.txt")
        return got if got["Body"].read() == b"version two!" else None

    # Served from the cache until the TTL has passed, then the new version, fetched anew.
    got = eventually(new_version)
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "miss"


@pytest.mark.parametrize(
    ("header", "expected", "content_range"),
    [
        ("bytes=0-9", BODY[:10], "bytes 0-9/10240"),
        ("bytes=100-", BODY[100:], "bytes 100-10239/10240"),
        ("bytes=-5", BODY[-5:], "bytes 10235-10239/10240"),
        ("bytes=10000-99999", BODY[10000:], "bytes 10000-10239/10240"),
    ],
)
def test_ranged_get(node: GatewayNode, header: str, expected: bytes, content_range: str) -> None:
    got = node.client().get_object(Bucket="data", Key="obj.bin", Range=header)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == content_range
    assert got["Body"].read() == expected


def test_ranged_get_of_uncached_object_on_file_mount(node: GatewayNode) -> None:
    got = node.client().get_object(Bucket="files", Key="dir/a.txt", Range="bytes=10-19")
    assert got["Body"].read() == b"a" * 10
    assert got["ContentRange"] == "bytes 10-19/1000"


def test_unsatisfiable_range_is_416_invalid_range(node: GatewayNode) -> None:
    with pytest.raises(ClientError) as exc:
        node.client().get_object(Bucket="data", Key="obj.bin", Range="bytes=20000-")
    assert _code(exc) == ("InvalidRange", 416)


def test_conditional_headers(node: GatewayNode) -> None:
    s3 = node.client()
    head = s3.head_object(Bucket="data", Key="obj.bin")
    etag, modified = head["ETag"], head["LastModified"]
    past, future = modified - timedelta(days=1), modified + timedelta(days=1)

    assert s3.get_object(Bucket="data", Key="obj.bin", IfMatch=etag)["Body"].read() == BODY
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="data", Key="obj.bin", IfMatch='"0000"')
    assert _code(exc) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="data", Key="obj.bin", IfNoneMatch=etag)
    assert _code(exc)[1] == 304
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="data", Key="obj.bin", IfModifiedSince=future)
    assert _code(exc)[1] == 304
    assert s3.get_object(Bucket="data", Key="obj.bin", IfModifiedSince=past)["ContentLength"]
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="data", Key="obj.bin", IfUnmodifiedSince=past)
    assert _code(exc) == ("PreconditionFailed", 412)
    # S3's precedence: If-Match true wins over If-Unmodified-Since false ...
    got = s3.get_object(Bucket="data", Key="obj.bin", IfMatch=etag, IfUnmodifiedSince=past)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 200
    # ... and If-None-Match false (differs) wins over If-Modified-Since false.
    got = s3.get_object(Bucket="data", Key="obj.bin", IfNoneMatch='"0000"', IfModifiedSince=future)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_response_header_overrides(node: GatewayNode) -> None:
    got = node.client().get_object(
        Bucket="data",
        Key="obj.bin",
        ResponseContentType="text/plain",
        ResponseContentDisposition='attachment; filename="x.bin"',
        ResponseCacheControl="no-store",
    )
    assert got["ContentType"] == "text/plain"
    assert got["ContentDisposition"] == 'attachment; filename="x.bin"'
    assert got["CacheControl"] == "no-store"


@pytest.mark.parametrize("key", ["with space.txt", "plus+sign.txt", "ünïcödé/ключ.txt"])
def test_keys_with_spaces_unicode_and_plus(node: GatewayNode, key: str) -> None:
    s3 = node.client()
    assert s3.get_object(Bucket="data", Key=key)["Body"].read() == f"ds/{key}".encode()
    listed = s3.list_objects_v2(Bucket="data", Prefix=key)["Contents"]
    assert [o["Key"] for o in listed] == [key]


def test_head_object_has_no_body_and_right_length(node: GatewayNode) -> None:
    r = httpx.head(node.client().generate_presigned_url(
        "head_object", Params={"Bucket": "data", "Key": "obj.bin"}
    ))  # fmt: skip
    assert r.status_code == 200
    assert r.headers["content-length"] == str(len(BODY))
    assert r.content == b""


def test_file_mount_serves_folder(node: GatewayNode) -> None:
    s3 = node.client()
    assert s3.get_object(Bucket="files", Key="dir/sub/b.txt")["Body"].read() == b"b" * 10
    listed = s3.list_objects_v2(Bucket="files", Delimiter="/")
    assert [o["Key"] for o in listed["Contents"]] == ["top.txt"]
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["dir/"]


# -- listing ---------------------------------------------------------------------------------


def test_list_v2_paginates_over_more_than_1000_keys(node: GatewayNode) -> None:
    pages = node.client().get_paginator("list_objects_v2").paginate(Bucket="many")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    assert keys == [f"{i // 100:02d}/k{i:05d}" for i in range(1100)]


def test_list_v1_paginates_with_markers(node: GatewayNode) -> None:
    pages = (
        node.client()
        .get_paginator("list_objects")
        .paginate(Bucket="many", PaginationConfig={"PageSize": 300})
    )
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    assert keys == [f"{i // 100:02d}/k{i:05d}" for i in range(1100)]


def test_list_with_delimiter_rolls_up_prefixes_across_pages(node: GatewayNode) -> None:
    s3 = node.client()
    first = s3.list_objects_v2(Bucket="many", Delimiter="/", MaxKeys=5)
    assert [p["Prefix"] for p in first["CommonPrefixes"]] == ["00/", "01/", "02/", "03/", "04/"]
    assert first["IsTruncated"] is True
    rest = s3.list_objects_v2(
        Bucket="many", Delimiter="/", ContinuationToken=first["NextContinuationToken"]
    )
    assert [p["Prefix"] for p in rest["CommonPrefixes"]] == [f"{i:02d}/" for i in range(5, 11)]
    assert rest["IsTruncated"] is False


def test_list_start_after_prefix_and_max_keys(node: GatewayNode) -> None:
    s3 = node.client()
    got = s3.list_objects_v2(Bucket="many", Prefix="03/", StartAfter="03/k00397", MaxKeys=10)
    assert [o["Key"] for o in got["Contents"]] == ["03/k00398", "03/k00399"]
    assert got["KeyCount"] == 2


def test_list_encoding_type_url_on_the_wire(node: GatewayNode) -> None:
    url = node.client().generate_presigned_url(
        "list_objects_v2", Params={"Bucket": "data", "Prefix": "with", "EncodingType": "url"}
    )
    doc = ET.fromstring(httpx.get(url).content)
    assert doc.findtext(f"{NS}Contents/{NS}Key") == "with%20space.txt"
    assert doc.findtext(f"{NS}EncodingType") == "url"


def test_list_fetch_owner(node: GatewayNode) -> None:
    got = node.client().list_objects_v2(Bucket="files", FetchOwner=True, MaxKeys=1)
    assert got["Contents"][0]["Owner"]["ID"]


# -- authentication and errors ------------------------------------------------------------


def test_presigned_get_with_plain_http_client(node: GatewayNode) -> None:
    url = node.client().generate_presigned_url(
        "get_object", Params={"Bucket": "data", "Key": "obj.bin"}, ExpiresIn=60
    )
    r = httpx.get(url)
    assert r.status_code == 200
    assert r.content == BODY


def test_expired_presigned_url_is_access_denied(node: GatewayNode) -> None:
    url = node.client().generate_presigned_url(
        "get_object", Params={"Bucket": "data", "Key": "obj.bin"}, ExpiresIn=1
    )
    r = eventually(lambda: (r := httpx.get(url)).status_code == 403 and r)  # once it expires
    assert _xml_code(r) == "AccessDenied"


def test_wrong_secret_is_signature_does_not_match(node: GatewayNode) -> None:
    from tests.support.gateway import ACCESS_KEY

    with pytest.raises(ClientError) as exc:
        node.client(ACCESS_KEY, "not-the-secret").get_object(Bucket="data", Key="obj.bin")
    assert _code(exc) == ("SignatureDoesNotMatch", 403)


def test_unknown_access_key_is_invalid_access_key_id(node: GatewayNode) -> None:
    with pytest.raises(ClientError) as exc:
        node.client("GKUNKNOWNKEY00000000", "whatever").list_buckets()
    assert _code(exc) == ("InvalidAccessKeyId", 403)


def test_malformed_authorization_header(node: GatewayNode) -> None:
    r = httpx.get(
        f"{node.url}/data/obj.bin",
        headers={
            "Authorization": "AWS4-HMAC-SHA256 Credential=broken",
            "x-amz-date": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
            "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
        },
    )
    assert r.status_code == 400
    assert _xml_code(r) == "AuthorizationHeaderMalformed"
    assert r.headers["x-amz-request-id"] in r.text


def test_anonymous_request_is_access_denied(node: GatewayNode) -> None:
    r = httpx.get(f"{node.url}/data/obj.bin")
    assert r.status_code == 403
    assert _xml_code(r) == "AccessDenied"


def test_public_read_mount_allows_anonymous_reads_only(node: GatewayNode) -> None:
    r = httpx.get(f"{node.url}/open/top.txt")
    assert (r.status_code, r.content) == (200, b"top\n")
    assert httpx.get(f"{node.url}/").status_code == 403


def test_unknown_bucket_and_key(node: GatewayNode) -> None:
    s3 = node.client()
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="nope", Key="x")
    assert _code(exc) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="data", Key="missing.bin")
    assert _code(exc) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="files", Key="../files/top.txt")
    assert _code(exc) == ("NoSuchKey", 404)


def test_unimplemented_operation_is_501_not_implemented(node: GatewayNode) -> None:
    with pytest.raises(ClientError) as exc:
        node.client().get_bucket_lifecycle_configuration(Bucket="data")
    assert _code(exc) == ("NotImplemented", 501)


def test_error_body_is_s3_xml_with_request_id(node: GatewayNode) -> None:
    url = node.client().generate_presigned_url(
        "get_object", Params={"Bucket": "data", "Key": "missing.bin"}
    )
    r = httpx.get(url)
    doc = ET.fromstring(r.content)
    assert r.status_code == 404
    assert doc.findtext("Code") == "NoSuchKey"
    assert doc.findtext("Resource") == "/data/missing.bin"
    assert doc.findtext("RequestId") == r.headers["x-amz-request-id"]
    assert r.headers["content-type"] == "application/xml"


def test_head_error_has_no_body(node: GatewayNode) -> None:
    url = node.client().generate_presigned_url(
        "head_object", Params={"Bucket": "data", "Key": "missing.bin"}
    )
    r = httpx.head(url)
    assert r.status_code == 404
    assert r.content == b""


def test_virtual_host_style_request(node: GatewayNode) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from tests.support.gateway import ACCESS_KEY, SECRET_KEY

    url = f"http://data.s3.test:{node.port}/obj.bin"
    req = AWSRequest(method="GET", url=url, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
    headers = dict(req.headers.items())
    headers["Host"] = f"data.s3.test:{node.port}"
    r = httpx.get(f"{node.url}/obj.bin", headers=headers)
    assert r.status_code == 200, r.text
    assert r.content == BODY


def test_if_modified_since_with_http_date_on_the_wire(node: GatewayNode) -> None:
    url = node.client().generate_presigned_url(
        "get_object", Params={"Bucket": "files", "Key": "top.txt"}
    )
    future = format_datetime(datetime.now(UTC) + timedelta(days=1), usegmt=True)
    r = httpx.get(url, headers={"If-Modified-Since": future})
    assert r.status_code == 304
    assert r.headers["etag"]
    assert r.content == b""


def _xml_code(r: httpx.Response) -> str | None:
    return ET.fromstring(r.content).findtext("Code")


def test_prometheus_metrics_count_requests_and_cache_hits(node: GatewayNode) -> None:
    s3 = node.client()
    s3.get_object(Bucket="files", Key="top.txt")["Body"].read()
    s3.get_object(Bucket="files", Key="top.txt")["Body"].read()
    text = httpx.get(f"{node.url}/metrics").text
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['gateway_requests_total{op="GetObject",status="200"}'] >= 2
    assert samples["gateway_cache_hits_total"] >= 1
    assert samples['gateway_response_bytes_total{cache="hit",op="GetObject"}'] >= 4


def test_sigv2_presigned_url_as_boto3_makes_by_default(node: GatewayNode) -> None:
    from tests.support.gateway import ACCESS_KEY, SECRET_KEY

    s3 = boto3.client(
        "s3", endpoint_url=node.url, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
    )  # fmt: skip
    for key in ("obj.bin", "with space.txt", "ünïcödé/ключ.txt"):
        url = s3.generate_presigned_url(
            "get_object", Params={"Bucket": "data", "Key": key, "ResponseContentType": "a/b"}
        )
        assert "AWSAccessKeyId=" in url
        r = httpx.get(url)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "a/b"
    bad = s3.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "obj.bin"})
    r = httpx.get(bad.replace("Signature=", "Signature=x"))
    assert (r.status_code, _xml_code(r)) == (403, "SignatureDoesNotMatch")
    expired = s3.generate_presigned_url(
        "get_object", Params={"Bucket": "data", "Key": "obj.bin"}, ExpiresIn=-10
    )
    assert _xml_code(httpx.get(expired)) == "AccessDenied"


def test_sigv2_header_auth(node: GatewayNode) -> None:
    from botocore.config import Config

    from tests.support.gateway import ACCESS_KEY, SECRET_KEY

    s3 = boto3.client(
        "s3", endpoint_url=node.url, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
        config=Config(signature_version="s3", s3={"addressing_style": "path"}),
    )  # fmt: skip
    assert s3.get_object(Bucket="data", Key="plus+sign.txt")["Body"].read() == b"ds/plus+sign.txt"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="many", MaxKeys=3)["Contents"]]
    assert keys == ["00/k00000", "00/k00001", "00/k00002"]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"list-type": "2", "max-keys": "ten"}, "InvalidArgument"),
        ({"list-type": "2", "max-keys": "-1"}, "InvalidArgument"),
        ({"list-type": "2", "encoding-type": "base64"}, "InvalidArgument"),
        ({"list-type": "2", "continuation-token": "not-a-token!"}, "InvalidArgument"),
    ],
)
def test_bad_list_arguments_are_400(node: GatewayNode, params: dict[str, str], code: str) -> None:
    r = _signed_get(node, "/files", params)
    assert (r.status_code, _xml_code(r)) == (400, code)


def test_path_that_is_not_utf8_is_400(node: GatewayNode) -> None:
    r = httpx.get(f"{node.url}/files/%ff%fe")
    assert r.status_code == 400
    assert _xml_code(r) == "InvalidArgument"


def test_request_with_skewed_clock_is_refused(
    node: GatewayNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    import botocore.auth

    an_hour_ago = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=1)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: an_hour_ago)
    r = _signed_get(node, "/files/top.txt", {})
    assert (r.status_code, _xml_code(r)) == (403, "RequestTimeTooSkewed")


def _signed_get(node: GatewayNode, path: str, params: dict[str, str]) -> httpx.Response:
    from urllib.parse import urlencode

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from tests.support.gateway import ACCESS_KEY, SECRET_KEY

    url = f"{node.url}{path}?{urlencode(params)}" if params else f"{node.url}{path}"
    req = AWSRequest(method="GET", url=url, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
    return httpx.get(url, headers=dict(req.headers.items()))


def test_object_gone_at_origin_is_no_such_key_not_a_cut_stream(
    node: GatewayNode, origin_s3: Any, origin_bucket: str
) -> None:
    s3 = node.client()
    origin_s3.put_object(Bucket=origin_bucket, Key="ds/vanishing.txt", Body=b"here")
    assert s3.get_object(Bucket="nocache", Key="vanishing.txt")["Body"].read() == b"here"
    origin_s3.delete_object(Bucket=origin_bucket, Key="ds/vanishing.txt")
    with pytest.raises(ClientError) as exc:  # metadata still trusted: the read finds it gone
        s3.get_object(Bucket="nocache", Key="vanishing.txt")
    assert _code(exc) == ("NoSuchKey", 404)


def test_object_changed_under_trusted_metadata_is_served_new(
    node: GatewayNode, origin_s3: Any, origin_bucket: str
) -> None:
    s3 = node.client()
    origin_s3.put_object(Bucket=origin_bucket, Key="ds/shifting.txt", Body=b"old bytes")
    assert s3.get_object(Bucket="nocache", Key="shifting.txt")["Body"].read() == b"old bytes"
    origin_s3.put_object(Bucket=origin_bucket, Key="ds/shifting.txt", Body=b"new bytes!!")
    got = s3.get_object(Bucket="nocache", Key="shifting.txt")
    assert got["Body"].read() == b"new bytes!!"
    assert got["ContentLength"] == len(b"new bytes!!")


def test_access_log_line_carries_the_request_id_the_client_got(node: GatewayNode) -> None:
    import json

    got = node.client().get_object(Bucket="files", Key="top.txt")
    request_id = got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]
    lines = eventually(lambda: [json.loads(x) for x in node.log().splitlines() if request_id in x])
    assert len(lines) == 1
    line = lines[0]
    assert (line["logger"], line["op"], line["status"]) == ("gateway.access", "GetObject", 200)
    assert (line["bucket"], line["key"], line["bytes"]) == ("files", "top.txt", 4)


def test_cold_read_is_one_origin_request(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any, origin_bucket: str
) -> None:
    origin_s3.put_object(Bucket=origin_bucket, Key="ds/cold-once.bin", Body=b"c" * 3000)
    origin.reset()
    got = node.client().get_object(Bucket="data", Key="cold-once.bin")
    assert got["Body"].read() == b"c" * 3000
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "miss"
    assert [r.method for r in origin.requests] == ["GET"]  # no HEAD before it
    again = node.client().get_object(Bucket="data", Key="cold-once.bin")
    assert again["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
    assert len(origin.requests) == 1
