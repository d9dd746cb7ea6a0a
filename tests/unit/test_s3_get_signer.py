"""The S3 transport's SigV4 (gateway/stores/s3/sigv4.py) signs GETs and HEADs, with and
without a query, exactly as botocore does."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials
from botocore.utils import percent_encode

from gateway.stores.s3.sigv4 import Signer, canonical_query

KEYS = ["data/0000001.bin", "a b/c+d=e&f?g#h", "ünï/cødé ☃", "x/./y/../z", "~tilde/%41", ""]
BASES = [
    "http://127.0.0.1:9000/bucket/",
    "http://localhost/bucket/",
    "https://bucket.s3.eu-west-1.amazonaws.com/",
    "https://s3.example.com:8443/Bucket.With.Dots/",
]
HEADERS = [{}, {"Range": "bytes=0-4194303"}, {"Range": "bytes=5-9", "If-Match": '"ab  cd"'}]
QUERIES = [(), (("versionId", "3/L4kqtJl+cEmMm._x~"),), (("partNumber", "2"), ("versionId", "v"))]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzE//token=="])
@pytest.mark.parametrize("base", BASES)
def test_signs_as_botocore(base: str, token: str | None, method: str) -> None:
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    ours = Signer("eu-west-1", base)
    theirs = S3SigV4Auth(credentials, "s3", "eu-west-1")
    frozen = credentials.get_frozen_credentials()
    for key in KEYS:
        path = urlsplit(base + percent_encode(key, safe="/~")).path
        for query in QUERIES:
            sent = canonical_query(query)
            url = base + percent_encode(key, safe="/~") + (f"?{sent}" if sent else "")
            for headers in HEADERS:
                request = AWSRequest(method=method, url=url, headers=dict(headers))
                theirs.add_auth(request)
                expected = dict(request.headers.items())
                signed = ours.sign(frozen, method, path, sent, headers, expected["X-Amz-Date"])
                assert signed == expected, (method, url, headers)


def test_timestamp_and_key_follow_the_clock_and_the_secret() -> None:
    signer = Signer("us-east-1", "http://h/b/")
    one_key = Credentials("AK", "SK").get_frozen_credentials()
    refreshed = Credentials("AK", "SK2").get_frozen_credentials()
    assert signer.timestamp(0) == "19700101T000000Z"
    assert signer.timestamp(86400 + 61.9) == "19700102T000101Z"

    def auth(credentials: ReadOnlyCredentials, stamp: str) -> str:
        return signer.sign(credentials, "GET", "/b/k", "", {}, stamp)["Authorization"]

    one = auth(one_key, signer.timestamp(0))
    two = auth(one_key, signer.timestamp(86400))
    assert "19700101/us-east-1/s3/aws4_request" in one
    assert "19700102/us-east-1/s3/aws4_request" in two
    assert auth(one_key, signer.timestamp(0)) == one
    # Credentials refreshed with another secret sign with a key of their own, then back.
    assert auth(refreshed, signer.timestamp(0)) != one
    assert auth(one_key, signer.timestamp(0)) == one
