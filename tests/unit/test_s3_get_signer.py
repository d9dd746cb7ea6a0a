"""The lean GET's SigV4 (gateway/stores/s3/fast_get.py) signs exactly as botocore does."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.utils import percent_encode

from gateway.stores.s3.fast_get import GetSigner

KEYS = ["data/0000001.bin", "a b/c+d=e&f?g#h", "ünï/cødé ☃", "x/./y/../z", "~tilde/%41", ""]
BASES = [
    "http://127.0.0.1:9000/bucket/",
    "http://localhost/bucket/",
    "https://bucket.s3.eu-west-1.amazonaws.com/",
    "https://s3.example.com:8443/Bucket.With.Dots/",
]
HEADERS = [{}, {"Range": "bytes=0-4194303"}, {"Range": "bytes=5-9", "If-Match": '"ab  cd"'}]


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzE//token=="])
@pytest.mark.parametrize("base", BASES)
def test_signs_as_botocore(base: str, token: str | None) -> None:
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    ours = GetSigner(credentials, "eu-west-1", base)
    theirs = S3SigV4Auth(credentials, "s3", "eu-west-1")
    for key in KEYS:
        url = base + percent_encode(key, safe="/~")
        for headers in HEADERS:
            request = AWSRequest(method="GET", url=url, headers=dict(headers))
            theirs.add_auth(request)
            expected = dict(request.headers.items())
            signed = ours.sign(urlsplit(url).path, headers, expected["X-Amz-Date"])
            assert signed == expected, (url, headers)


def test_timestamp_and_key_follow_the_clock() -> None:
    signer = GetSigner(Credentials("AK", "SK"), "us-east-1", "http://h/b/")
    assert signer.timestamp(0) == "19700101T000000Z"
    assert signer.timestamp(86400 + 61.9) == "19700102T000101Z"
    one = signer.sign("/b/k", {}, signer.timestamp(0))["Authorization"]
    two = signer.sign("/b/k", {}, signer.timestamp(86400))["Authorization"]
    assert "19700101/us-east-1/s3/aws4_request" in one
    assert "19700102/us-east-1/s3/aws4_request" in two
    assert signer.sign("/b/k", {}, signer.timestamp(0))["Authorization"] == one
