"""End to end writes: boto3 and plain HTTP against a `gateway serve` subprocess, written
through to a real S3 origin (moto, counted) and to a local folder, and kept hot."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually, tls_context
from tests.support.origin import CountingProxy
from tests.support.tls import make_cert

MiB = 1 << 20
ORIGIN = "origin-write"


@pytest.fixture(scope="module")
def folder(module_dir: Path) -> Path:
    root = module_dir / "files"
    root.mkdir()
    return root


@pytest.fixture(scope="module")
def node(
    module_dir: Path, origin: CountingProxy, origin_s3: Any, folder: Path
) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    cert = make_cert(module_dir)
    buckets = module_dir / "buckets"
    buckets.mkdir()
    node = start_gateway(
        module_dir / "node",
        tls=cert,
        args=("--bucket-store", buckets.as_uri(), "--multipart-max-age", "3"),
    )
    _mount(node, origin, folder)
    yield node
    node.stop()


@pytest.fixture(scope="module")
def plain(
    module_dir: Path, node: GatewayNode, origin: CountingProxy, folder: Path
) -> Iterator[GatewayNode]:
    """A second node, plain HTTP, over the same stores (and its own cache and database)."""
    plain = start_gateway(module_dir / "plain")
    _mount(plain, origin, folder)
    yield plain
    plain.stop()


def _mount(node: GatewayNode, origin: CountingProxy, folder: Path) -> None:
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "s3w", f"s3://{ORIGIN}/pre", *opts)
    node.cli("mount", "add", "filew", folder.as_uri())
    node.cli("mount", "add", "frozen", folder.as_uri(), "-o", "read_only=true")
    eventually(lambda: node.buckets() >= {"s3w", "filew"})


def access_lines(node: GatewayNode) -> str:
    return "\n".join(x for x in node.log().splitlines() if '"gateway.access"' in x)


@pytest.fixture(params=["s3w", "filew"])
def bucket(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def plain_client(node: GatewayNode) -> Any:
    """boto3 over plain HTTP: a signed payload and x-amz-checksum-crc32 in a header."""
    assert node.url.startswith("http://")
    return boto3.client(
        "s3",
        endpoint_url=node.url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    r = exc.value.response
    return r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]


# -- PutObject ---------------------------------------------------------------------------------


def test_put_then_get_round_trip_with_attributes(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()  # HTTPS: aws-chunked, STREAMING-UNSIGNED-PAYLOAD-TRAILER, CRC32 trailer
    data = os.urandom(300_000)
    put = s3.put_object(
        Bucket=bucket, Key="dir/put one.bin", Body=data, ContentType="application/x-one",
        ContentDisposition="attachment", CacheControl="max-age=60",
        Metadata={"stage": "train", "epoch": "7"},
    )  # fmt: skip
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    got = s3.get_object(Bucket=bucket, Key="dir/put one.bin", ChecksumMode="ENABLED")
    assert got["Body"].read() == data
    assert got["ContentType"] == "application/x-one"
    assert got["ContentDisposition"] == "attachment"
    assert got["CacheControl"] == "max-age=60"
    assert got["Metadata"] == {"stage": "train", "epoch": "7"}
    assert got["ETag"] == put["ETag"]
    assert "ContentEncoding" not in got  # aws-chunked never leaks into the object


def test_put_over_plain_http_with_signed_payload(plain: GatewayNode, bucket: str) -> None:
    s3 = plain_client(plain)
    s3.put_object(Bucket=bucket, Key="plain.txt", Body=b"signed payload")
    assert s3.get_object(Bucket=bucket, Key="plain.txt")["Body"].read() == b"signed payload"


def test_zero_length_object(node: GatewayNode, plain: GatewayNode, bucket: str) -> None:
    for s3 in (node.client(), plain_client(plain)):
        s3.put_object(Bucket=bucket, Key="empty", Body=b"")
        got = s3.get_object(Bucket=bucket, Key="empty")
        assert got["ContentLength"] == 0 and got["Body"].read() == b""


def test_read_after_write_is_a_hit_with_no_origin_request(
    node: GatewayNode, origin: CountingProxy
) -> None:
    s3 = node.client()
    s3.put_object(Bucket="s3w", Key="hot.bin", Body=b"h" * 5000)
    origin.reset()
    got = s3.get_object(Bucket="s3w", Key="hot.bin")
    assert got["Body"].read() == b"h" * 5000
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
    assert origin.requests == []


def test_overwrite_and_delete_are_seen_at_once(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    s3.put_object(Bucket=bucket, Key="flip", Body=b"one")
    assert s3.get_object(Bucket=bucket, Key="flip")["Body"].read() == b"one"
    s3.put_object(Bucket=bucket, Key="flip", Body=b"two!")
    assert s3.get_object(Bucket=bucket, Key="flip")["Body"].read() == b"two!"
    s3.delete_object(Bucket=bucket, Key="flip")
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="flip")
    assert _code(exc) == ("NoSuchKey", 404)
    # Deleting a missing key is not an error.
    assert s3.delete_object(Bucket=bucket, Key="flip")["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_conditional_writes(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    first = s3.put_object(Bucket=bucket, Key="cond", Body=b"v1", IfNoneMatch="*")
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="cond", Body=b"v2", IfNoneMatch="*")
    assert _code(exc) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="cond", Body=b"v2", IfMatch='"00000000"')
    assert _code(exc) == ("PreconditionFailed", 412)
    s3.put_object(Bucket=bucket, Key="cond", Body=b"v3", IfMatch=first["ETag"])
    assert s3.get_object(Bucket=bucket, Key="cond")["Body"].read() == b"v3"


def test_presigned_put_with_plain_http_client(plain: GatewayNode, bucket: str) -> None:
    url = plain_client(plain).generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "presigned.txt"}, ExpiresIn=60
    )
    r = httpx.put(url, content=b"from a presigned url")
    assert r.status_code == 200, r.text
    got = plain.client().get_object(Bucket=bucket, Key="presigned.txt")
    assert got["Body"].read() == b"from a presigned url"


def test_read_only_mount_refuses_every_write(node: GatewayNode) -> None:
    s3 = node.client()
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket="frozen", Key="x", Body=b"x")
    assert _code(exc) == ("AccessDenied", 403)
    with pytest.raises(ClientError) as exc:
        s3.delete_object(Bucket="frozen", Key="x")
    assert _code(exc) == ("AccessDenied", 403)
    with pytest.raises(ClientError) as exc:
        s3.create_multipart_upload(Bucket="frozen", Key="x")
    assert _code(exc) == ("AccessDenied", 403)


# -- multipart -----------------------------------------------------------------------------------


def test_upload_file_multipart_and_its_etag(node: GatewayNode, bucket: str, tmp_path: Path) -> None:
    data = os.urandom(12 * MiB + 3)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    s3 = node.client()
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_file(str(path), bucket, "big/file.bin", Config=cfg)
    head = s3.head_object(Bucket=bucket, Key="big/file.bin")
    md5s = b"".join(
        hashlib.md5(data[i : i + 5 * MiB]).digest() for i in range(0, len(data), 5 * MiB)
    )
    assert head["ETag"] == f'"{hashlib.md5(md5s).hexdigest()}-3"'
    assert head["ContentLength"] == len(data)
    out = io.BytesIO()
    s3.download_fileobj(bucket, "big/file.bin", out)
    assert out.getvalue() == data


def test_upload_fileobj(node: GatewayNode, bucket: str) -> None:
    data = os.urandom(2 * MiB)
    node.client().upload_fileobj(io.BytesIO(data), bucket, "fileobj.bin")
    assert node.client().get_object(Bucket=bucket, Key="fileobj.bin")["Body"].read() == data


def test_multipart_listing_abort_and_errors(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp/obj", ContentType="text/x-mp")
    uid = up["UploadId"]
    small = s3.upload_part(Bucket=bucket, Key="mp/obj", UploadId=uid, PartNumber=1, Body=b"a" * 10)
    s3.upload_part(Bucket=bucket, Key="mp/obj", UploadId=uid, PartNumber=2, Body=b"b" * 10)
    parts = s3.list_parts(Bucket=bucket, Key="mp/obj", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, 10), (2, 10)]
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix="mp/")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("mp/obj", uid)]
    both = [{"PartNumber": 1, "ETag": small["ETag"]}, {"PartNumber": 2, "ETag": parts[1]["ETag"]}]
    with pytest.raises(ClientError) as exc:  # part 1 is under 5 MiB and not the last
        s3.complete_multipart_upload(
            Bucket=bucket, Key="mp/obj", UploadId=uid, MultipartUpload={"Parts": both}
        )
    assert _code(exc) == ("EntityTooSmall", 400)
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="mp/obj", UploadId=uid,
            MultipartUpload={"Parts": list(reversed(both))},
        )  # fmt: skip
    assert _code(exc) == ("InvalidPartOrder", 400)
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="mp/obj", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"feedface"'}]},
        )  # fmt: skip
    assert _code(exc) == ("InvalidPart", 400)
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="mp/obj")
    assert _code(exc)[1] == 404  # nothing visible after failed completes
    for bad in (0, 10001):
        with pytest.raises(ClientError) as exc:
            s3.upload_part(Bucket=bucket, Key="mp/obj", UploadId=uid, PartNumber=bad, Body=b"x")
        assert _code(exc) == ("InvalidArgument", 400)
    s3.abort_multipart_upload(Bucket=bucket, Key="mp/obj", UploadId=uid)
    with pytest.raises(ClientError) as exc:
        s3.upload_part(Bucket=bucket, Key="mp/obj", UploadId=uid, PartNumber=1, Body=b"x")
    assert _code(exc) == ("NoSuchUpload", 404)
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket, Prefix="mp/")


def test_single_part_completes_and_keeps_create_attributes(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    uid = s3.create_multipart_upload(
        Bucket=bucket, Key="mp/one", ContentType="text/x-one", Metadata={"m": "1"}
    )["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key="mp/one", UploadId=uid, PartNumber=1, Body=b"solo")
    s3.complete_multipart_upload(
        Bucket=bucket, Key="mp/one", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )  # fmt: skip
    got = s3.get_object(Bucket=bucket, Key="mp/one")
    assert got["Body"].read() == b"solo"
    assert got["ContentType"] == "text/x-one" and got["Metadata"] == {"m": "1"}
    assert got["ETag"].endswith('-1"')


def test_upload_part_copy_with_range(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    src = os.urandom(6 * MiB)
    s3.put_object(Bucket="s3w", Key="copy-src.bin", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp/copied")["UploadId"]
    p1 = s3.upload_part_copy(
        Bucket=bucket, Key="mp/copied", UploadId=uid, PartNumber=1,
        CopySource={"Bucket": "s3w", "Key": "copy-src.bin"}, CopySourceRange="bytes=0-5242879",
    )["CopyPartResult"]  # fmt: skip
    p2 = s3.upload_part_copy(
        Bucket=bucket, Key="mp/copied", UploadId=uid, PartNumber=2,
        CopySource={"Bucket": "s3w", "Key": "copy-src.bin"},
        CopySourceRange=f"bytes=5242880-{len(src) - 1}",
    )["CopyPartResult"]  # fmt: skip
    s3.complete_multipart_upload(
        Bucket=bucket, Key="mp/copied", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p1["ETag"]},
                                   {"PartNumber": 2, "ETag": p2["ETag"]}]},
    )  # fmt: skip
    assert s3.get_object(Bucket=bucket, Key="mp/copied")["Body"].read() == src


def test_abandoned_uploads_are_cleaned(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp/abandoned")["UploadId"]
    eventually(
        lambda: "Uploads" not in s3.list_multipart_uploads(Bucket=bucket, Prefix="mp/abandoned"),
        interval=0.5,
    )
    with pytest.raises(ClientError) as exc:
        s3.upload_part(Bucket=bucket, Key="mp/abandoned", UploadId=uid, PartNumber=1, Body=b"x")
    assert _code(exc) == ("NoSuchUpload", 404)


# -- copy and delete ---------------------------------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), [("s3w", "filew"), ("filew", "s3w"), ("s3w", "s3w")])
def test_copy_within_and_across_stores(node: GatewayNode, src: str, dst: str) -> None:
    s3 = node.client()
    s3.put_object(Bucket=src, Key="copy me+/ü.txt", Body=b"copied", Metadata={"a": "1"})
    out = s3.copy_object(
        Bucket=dst, Key=f"from-{src}.txt", CopySource={"Bucket": src, "Key": "copy me+/ü.txt"}
    )
    assert out["CopyObjectResult"]["ETag"]
    got = s3.get_object(Bucket=dst, Key=f"from-{src}.txt")
    assert got["Body"].read() == b"copied" and got["Metadata"] == {"a": "1"}
    s3.copy_object(
        Bucket=dst, Key=f"from-{src}.txt", CopySource={"Bucket": src, "Key": "copy me+/ü.txt"},
        MetadataDirective="REPLACE", Metadata={"b": "2"}, ContentType="text/x-new",
    )  # fmt: skip
    got = s3.get_object(Bucket=dst, Key=f"from-{src}.txt")
    assert got["Metadata"] == {"b": "2"} and got["ContentType"] == "text/x-new"


def test_copy_source_conditions(node: GatewayNode) -> None:
    s3 = node.client()
    etag = s3.put_object(Bucket="filew", Key="cc.txt", Body=b"c")["ETag"]
    src = {"Bucket": "filew", "Key": "cc.txt"}
    s3.copy_object(Bucket="filew", Key="cc2.txt", CopySource=src, CopySourceIfMatch=etag)
    with pytest.raises(ClientError) as exc:
        s3.copy_object(Bucket="filew", Key="cc2.txt", CopySource=src, CopySourceIfMatch='"x"')
    assert _code(exc) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as exc:
        s3.copy_object(Bucket="filew", Key="cc2.txt", CopySource=src, CopySourceIfNoneMatch=etag)
    assert _code(exc) == ("PreconditionFailed", 412)


def test_delete_objects_batch_and_quiet(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    keys = [f"batch/{i}" for i in range(30)]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    out = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[:20]] + [{"Key": "batch/none"}]}
    )
    assert sorted(d["Key"] for d in out["Deleted"]) == sorted([*keys[:20], "batch/none"])
    quiet = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[20:]], "Quiet": True}
    )
    assert "Deleted" not in quiet and "Errors" not in quiet
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="batch/")


# -- buckets ------------------------------------------------------------------------------------


def test_create_and_delete_bucket(node: GatewayNode) -> None:
    s3 = node.client()
    s3.create_bucket(Bucket="made-here")
    s3.create_bucket(Bucket="made-here")  # one's own again: 200 in us-east-1, as S3 answers
    s3.put_object(Bucket="made-here", Key="k", Body=b"v")
    with pytest.raises(ClientError) as exc:
        s3.delete_bucket(Bucket="made-here")
    assert _code(exc) == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket="made-here", Key="k")
    s3.delete_bucket(Bucket="made-here")
    assert "made-here" not in {b["Name"] for b in s3.list_buckets()["Buckets"]}
    with pytest.raises(ClientError) as exc:
        s3.create_bucket(Bucket="Bad_Name")
    assert _code(exc) == ("InvalidBucketName", 400)


# -- bad input ----------------------------------------------------------------------------------


def test_body_shorter_than_content_length_leaves_nothing(plain: GatewayNode, bucket: str) -> None:
    node = plain
    url = plain_client(node).generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "short.bin"}
    )
    host, port = "127.0.0.1", node.port
    path = url.split(f":{port}", 1)[1]
    with socket.create_connection((host, port)) as sock:
        sock.sendall(
            f"PUT {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 1000\r\n\r\n".encode()
            + b"x" * 400
        )
        sock.shutdown(socket.SHUT_WR)  # the client goes away mid-body
        sock.settimeout(10)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
    # The request has ended on the node (its access line is written), what it began undone.
    eventually(lambda: "short.bin" in access_lines(plain))
    with pytest.raises(ClientError) as exc:
        node.client().head_object(Bucket=bucket, Key="short.bin")
    assert _code(exc)[1] == 404


def test_wrong_content_md5_is_bad_digest_and_nothing_written(
    plain: GatewayNode, bucket: str
) -> None:
    import base64

    s3 = plain_client(plain)
    with pytest.raises(ClientError) as exc:
        s3.put_object(
            Bucket=bucket, Key="md5.bin", Body=b"abc",
            ContentMD5=base64.b64encode(hashlib.md5(b"abd").digest()).decode(),
        )  # fmt: skip
    assert _code(exc) == ("BadDigest", 400)
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key="md5.bin")
    assert _code(exc)[1] == 404


def test_malformed_and_oversized_xml(plain: GatewayNode) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = f"{plain.url}/filew?delete"
    too_many = b"<Delete>" + b"<Object><Key>k</Key></Object>" * 1001 + b"</Delete>"
    for body in (b"<Delete><Object><Key>a</Key>", too_many, b"<NotDelete/>"):
        headers = {"Content-MD5": _md5_b64(body)}
        req = AWSRequest(method="POST", url=url, data=body, headers=headers)
        S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
        r = httpx.post(url, content=body, headers=dict(req.headers.items()))
        assert r.status_code == 400, r.text
        assert b"<Code>MalformedXML</Code>" in r.content
    assert httpx.get(f"{plain.url}/healthz").status_code == 200


def _md5_b64(data: bytes) -> str:
    import base64

    return base64.b64encode(hashlib.md5(data).digest()).decode()


def _cache_entries(node: GatewayNode) -> float:
    cafile = str(node.cert) if node.cert else None
    text = httpx.get(f"{node.url}/metrics", verify=tls_context(cafile)).text
    line = next(x for x in text.splitlines() if x.startswith("gateway_cache_written_blocks_total "))
    return float(line.split()[1])


@pytest.mark.parametrize("https", [True, False])
def test_wrong_checksum_is_bad_digest_and_leaves_nothing(
    node: GatewayNode, plain: GatewayNode, origin_s3: Any, folder: Path, https: bool
) -> None:
    target = node if https else plain
    s3 = target.client() if https else plain_client(plain)
    before = _cache_entries(target)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket="s3w", Key="badsum.bin", Body=b"z" * 70_000, ChecksumCRC32="AAAAAA==")
    assert _code(exc) == ("BadDigest", 400)
    with pytest.raises(ClientError) as exc:
        s3.put_object(
            Bucket="filew", Key="badsum.bin", Body=b"z" * 70_000, ChecksumSHA256="A" * 43 + "="
        )
    assert _code(exc) == ("BadDigest", 400)
    with pytest.raises(ClientError):
        origin_s3.head_object(Bucket=ORIGIN, Key="pre/badsum.bin")
    assert not (folder / "badsum.bin").exists()
    assert not [p for p in folder.rglob("*") if ".s3gw" in p.name and p.is_file()]
    assert _cache_entries(target) == before


def test_checksum_is_returned_when_asked(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    s3.put_object(Bucket=bucket, Key="summed.bin", Body=b"checksummed", ChecksumAlgorithm="SHA256")
    got = s3.head_object(Bucket=bucket, Key="summed.bin", ChecksumMode="ENABLED")
    expected = base64.b64encode(hashlib.sha256(b"checksummed").digest()).decode()
    assert got.get("ChecksumSHA256") == expected


def test_put_above_5_gib_is_entity_too_large_before_any_byte(plain: GatewayNode) -> None:
    url = plain_client(plain).generate_presigned_url(
        "put_object", Params={"Bucket": "filew", "Key": "huge.bin"}
    )
    path = url.split(f":{plain.port}", 1)[1]
    with socket.create_connection(("127.0.0.1", plain.port)) as sock:
        sock.sendall(
            f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{plain.port}\r\n"
            f"Content-Length: {6 << 30}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        sock.settimeout(10)
        answer = b""
        while chunk := sock.recv(65536):  # the node closes: the body was never read
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"<Code>EntityTooLarge</Code>" in answer


def test_delete_objects_without_an_integrity_header_is_refused(plain: GatewayNode) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = f"{plain.url}/filew?delete"
    body = b"<Delete><Object><Key>a</Key></Object></Delete>"
    req = AWSRequest(method="POST", url=url, data=body)
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
    r = httpx.post(url, content=body, headers=dict(req.headers.items()))
    assert r.status_code == 400
    assert b"<Code>InvalidRequest</Code>" in r.content


def test_create_bucket_without_a_bucket_store_says_how_to_mount(plain: GatewayNode) -> None:
    with pytest.raises(ClientError) as exc:
        plain_client(plain).create_bucket(Bucket="no-store-here")
    assert _code(exc) == ("NotImplemented", 501)
    assert "gateway mount add" in exc.value.response["Error"]["Message"]
