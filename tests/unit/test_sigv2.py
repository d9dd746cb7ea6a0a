"""SigV2 verification against AWS's published examples and requests signed by botocore: one
canonical resource per request, the path exactly as sent."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import pytest
from botocore.auth import HmacV1Auth, HmacV1QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import errors
from gateway.s3.sigv2 import SigV2Verifier, canonical_resource

ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def _verifier(now: float | None = None) -> SigV2Verifier:
    clock = time.time if now is None else lambda: now
    return SigV2Verifier(lambda ak: SECRET if ak == ACCESS_KEY else None, clock=clock)


def _at(date: str) -> SigV2Verifier:
    return _verifier(parsedate_to_datetime(date).timestamp())


# AWS's REST authentication examples (docs.aws.amazon.com/AmazonS3/latest/API/
# RESTAuthentication.html). The published signatures were computed for the bucket
# "johnsmith", which later editions of the page renamed without re-signing.
AWS_EXAMPLES = [
    # method, path, query, headers, bucket in Host, signature
    ("GET", "/photos/puppy.jpg", "", {"date": "Tue, 27 Mar 2007 19:36:42 +0000"},
     "johnsmith", "bWq2s1WEIj+Ydj0vQ697zp+IXMU="),
    ("PUT", "/photos/puppy.jpg", "",
     {"date": "Tue, 27 Mar 2007 21:15:45 +0000", "content-type": "image/jpeg"},
     "johnsmith", "MyyxeRY7whkBe+bq8fHCL/2kKUg="),
    ("GET", "/", "prefix=photos&max-keys=50&marker=puppy",
     {"date": "Tue, 27 Mar 2007 19:42:41 +0000"}, "johnsmith", "htDYFYduRNen8P9ZfE/s9SuKy0U="),
    ("GET", "/", "acl", {"date": "Tue, 27 Mar 2007 19:44:46 +0000"},
     "johnsmith", "c2WLPFtWHVgbEmeEG93a4cG37dM="),
    ("PUT", "/db-backup.dat.gz", "",
     {"date": "Tue, 27 Mar 2007 21:06:08 +0000", "x-amz-acl": "public-read",
      "content-type": "application/x-download", "content-md5": "4gJE4saaMU4BqNR0kLY+lw==",
      "x-amz-meta-reviewedby": "joe@johnsmith.net,jane@johnsmith.net",
      "x-amz-meta-filechecksum": "0x02661779", "x-amz-meta-checksumalgorithm": "crc32"},
     "static.johnsmith.net", "ilyl83RwaSoYIEdixDQcA4OnAnc="),
    ("GET", "/", "", {"date": "Wed, 28 Mar 2007 01:29:59 +0000"},
     None, "qGdzdERIC03wnaRNKh6OqZehG9s="),
    # "taken literally, including URL-Encoding and capitalization"
    ("GET", "/dictionary/fran%C3%A7ais/pr%c3%a9f%c3%a8re", "",
     {"date": "Wed, 28 Mar 2007 01:49:49 +0000"}, None, "DNEZGsoieTZ92F3bUfSPQcbGmlM="),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "query", "headers", "bucket", "sig"), AWS_EXAMPLES)
def test_aws_published_examples_verify(
    method: str, path: str, query: str, headers: dict[str, str], bucket: str | None, sig: str
) -> None:
    headers = headers | {"authorization": f"AWS {ACCESS_KEY}:{sig}"}
    result = _at(headers["date"]).verify(method, path, query, headers, bucket)
    assert result.access_key == ACCESS_KEY and not result.presigned


def test_aws_published_query_string_example_verifies() -> None:
    query = (
        f"AWSAccessKeyId={ACCESS_KEY}&Signature=NpgCjnDzrM%2BWFzoENXmpNDUsSn8%3D&Expires=1175139620"
    )
    result = _verifier(1175139620 - 60).verify("GET", "/photos/puppy.jpg", query, {}, "johnsmith")
    assert result.presigned


def test_escapes_are_signed_as_sent_not_normalized() -> None:
    """The Unicode example with its escapes upper-cased names the same key but is not what
    was signed: S3 signs the Request-URI literally."""
    method, path, query, headers, bucket, signature = AWS_EXAMPLES[-1]
    headers = headers | {"authorization": f"AWS {ACCESS_KEY}:{signature}"}
    with pytest.raises(errors.SignatureDoesNotMatch):
        _at(headers["date"]).verify(method, path.upper(), query, headers, bucket)


@pytest.mark.parametrize(
    ("raw_path", "bucket", "resource"),
    [
        ("/", None, "/"),
        ("/files", None, "/files/"),
        ("/files/", None, "/files/"),
        ("/files/a%20b", None, "/files/a%20b"),
        ("/files/a%2520b", None, "/files/a%2520b"),
        ("/files/dir/", None, "/files/dir/"),
        ("/", "files", "/files/"),
        ("/a%20b", "files", "/files/a%20b"),
    ],
)
def test_canonical_resource_is_the_path_as_sent(
    raw_path: str, bucket: str | None, resource: str
) -> None:
    assert canonical_resource(raw_path, bucket) == resource


def _header_signed(url: str, auth_path: str | None = None) -> tuple[str, dict[str, str]]:
    request = AWSRequest(method="GET", url=url)
    request.auth_path = auth_path
    HmacV1Auth(Credentials(ACCESS_KEY, SECRET)).add_auth(request)
    return urlsplit(url).path, {k.lower(): v for k, v in request.headers.items()}


def _presigned(url: str) -> tuple[str, str]:
    request = AWSRequest(method="GET", url=url)
    HmacV1QueryAuth(Credentials(ACCESS_KEY, SECRET), expires=3600).add_auth(request)
    split = urlsplit(request.url)
    return split.path, split.query


KEYS = ["a%20b", "report%201.csv", "100%25.txt", "%C3%BCn%C3%AF/%D0%BA.txt", "a%2Bb~c"]


@pytest.mark.parametrize("encoded_key", KEYS)
def test_signature_for_one_key_does_not_verify_another(encoded_key: str) -> None:
    """Double-escaping a '%' names the key spelled with the escape (`a%20b` for `a b`): the
    signature of the one must not verify the other, in either form."""
    path, headers = _header_signed(f"http://127.0.0.1/files/{encoded_key}")
    assert _verifier().verify("GET", path, "", headers, None)
    other = path.replace("%", "%25")
    with pytest.raises(errors.SignatureDoesNotMatch):
        _verifier().verify("GET", other, "", headers, None)
    path, query = _presigned(f"http://127.0.0.1/files/{encoded_key}")
    assert _verifier().verify("GET", path, query, {}, None).presigned
    with pytest.raises(errors.SignatureDoesNotMatch):
        _verifier().verify("GET", path.replace("%", "%25"), query, {}, None)


def test_decoded_path_is_not_accepted_in_place_of_the_sent_one() -> None:
    _, headers = _header_signed("http://127.0.0.1/files/a%20b")
    with pytest.raises(errors.SignatureDoesNotMatch):
        _verifier().verify("GET", "/files/a b", "", headers, None)


def test_virtual_host_request_signs_bucket_and_path() -> None:
    path, headers = _header_signed("http://files.s3.test/a%20b", auth_path="/files/a%20b")
    assert _verifier().verify("GET", path, "", headers, "files")
    with pytest.raises(errors.SignatureDoesNotMatch):
        _verifier().verify("GET", "/a%2520b", "", headers, "files")
    with pytest.raises(errors.SignatureDoesNotMatch):  # another bucket
        _verifier().verify("GET", path, "", headers, "other")


def test_bucket_resource_ends_in_a_slash_in_either_addressing_style() -> None:
    path, headers = _header_signed("http://127.0.0.1/files", auth_path="/files/")
    assert path == "/files"
    assert _verifier().verify("GET", path, "", headers, None)
    assert _verifier().verify("GET", "/", "", headers, "files")


def test_x_amz_date_with_its_own_comma_is_signed_whole() -> None:
    """s3cmd dates its requests with x-amz-date, whose value has a comma of its own."""
    date = "Tue, 01 Dec 2026 15:14:20 +0000"
    resource = "/files/"
    to_sign = f"GET\n\n\n\nx-amz-date:{date}\n{resource}"
    sig = base64.b64encode(hmac.new(SECRET.encode(), to_sign.encode(), hashlib.sha1).digest())
    headers = {"x-amz-date": date, "authorization": f"AWS {ACCESS_KEY}:{sig.decode()}"}
    assert _at(date).verify("GET", "/files/", "", headers, None)


@pytest.mark.parametrize(
    "expires", ["%C2%B2", "9" * 5000, "-5", "+5", "1_0", "%D9%A3", "%201", "12e3", "9" * 20]
)
def test_expires_that_is_no_plain_number_is_access_denied(expires: str) -> None:
    path, query = _presigned("http://127.0.0.1/files/a")
    query = "&".join(
        f"Expires={expires}" if p.startswith("Expires=") else p for p in query.split("&")
    )
    with pytest.raises(errors.AccessDenied) as exc:
        _verifier().verify("GET", path, query, {}, None)
    assert "seconds since epoch" in exc.value.detail


@settings(max_examples=300, deadline=None)
@given(
    path=st.text(alphabet="/%20aB~+é", max_size=12),
    query=st.text(alphabet="&=%AWSAcesKyIdxpirgnatu0129²", max_size=60),
    date=st.text(max_size=40),
)
def test_any_request_is_verified_or_refused_with_an_s3_error(
    path: str, query: str, date: str
) -> None:
    headers = {"date": date, "authorization": f"AWS {ACCESS_KEY}:c2WLPFtWHVgbEmeEG93a4cG37dM="}
    for hdrs in (headers, {}):
        try:
            _verifier().verify("GET", "/" + path, query, hdrs, None)
        except errors.S3Error as exc:
            assert 400 <= exc.status < 500
