"""The catalog's pure parts: key arithmetic in S3's order, its continuation tokens, the mount
options, and the S3 event notification format as AWS documents it (delivered straight to SQS,
or wrapped by SNS)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.catalog import Catalog, catalog_options
from gateway.catalog.keys import decode_token, encode_token, rolled_up, successor
from gateway.catalog.listing import start
from gateway.catalog.notifications import QueueSource, changed_keys

# Characters on both sides of the surrogates and at the top of the code space.
text = st.text(st.sampled_from(["a", "/", "\ud7ff", "\ue000", "\uffff", "😀", "\U0010ffff"]))


def utf8(s: str) -> bytes:
    return s.encode("utf-8")


@given(prefix=text, key=text)
def test_successor_bounds_the_keys_that_begin_with_the_prefix(prefix: str, key: str) -> None:
    above = successor(prefix)
    if prefix and above is not None:
        assert utf8(prefix) < utf8(above)
        begins = key.startswith(prefix)
        assert begins == (utf8(prefix) <= utf8(key) < utf8(above))
    if above is None:  # nothing lies above every key that begins with it
        assert set(prefix) <= {"\U0010ffff"}


def test_successor_steps_over_the_surrogates() -> None:
    assert successor("a\ud7ff") == "a\ue000"
    assert successor("a\U0010ffff") == "b"
    assert successor("") is None


def test_a_key_rolls_up_at_the_first_delimiter_after_the_prefix() -> None:
    assert rolled_up("a/b/c", "", "/") == "a/"
    assert rolled_up("a/b/c", "a/", "/") == "a/b/"
    assert rolled_up("a-/x", "", "-/") == "a-/"
    assert rolled_up("a/b", "a/b", "/") is None
    assert rolled_up("a/b", "", None) is None


def test_a_listing_starts_past_the_common_prefix_that_holds_its_marker() -> None:
    assert start("", "/", "a/b") == ("a0", True)  # '0' follows '/'
    assert start("", None, "a/b") == ("a/b", False)
    assert start("p/", "/", None) == ("p/", True)
    assert start("p/", "/", "a") == ("p/", True)  # a marker before the prefix
    assert start("", "\U0010ffff", "a\U0010ffffb") == ("b", True)
    assert start("", "\U0010ffff", "\U0010ffff") is None  # nothing lies past it


@given(last=text)
def test_a_catalog_token_gives_back_its_entry(last: str) -> None:
    assert decode_token(encode_token(last)) == last


def test_tokens_not_of_the_catalog_are_left_to_the_store() -> None:
    assert decode_token("1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=") is None
    with pytest.raises(ValueError):
        decode_token("c1.!!!")
    with pytest.raises(ValueError):
        decode_token("c1.é")


def test_mount_options_turn_the_catalog_on() -> None:
    assert catalog_options({}) is None
    assert catalog_options({"catalog": "off", "catalog_ttl": "5"}) is None
    on = catalog_options({"catalog": "on", "catalog_ttl": "300", "catalog_queue": "http://q"})
    assert on is not None and on.ttl == 300 and on.queue == "http://q"
    with pytest.raises(ValueError):
        catalog_options({"catalog": "on", "catalog_ttl": "-1"})
    with pytest.raises(ValueError):
        catalog_options({"catalog": "on", "catalog_ttl": "soon"})


def _event(bucket: str, *keys: str, name: str = "ObjectCreated:Put") -> str:
    # https://docs.aws.amazon.com/AmazonS3/latest/userguide/notification-content-structure.html
    records = [
        {
            "eventVersion": "2.1",
            "eventSource": "aws:s3",
            "awsRegion": "us-east-1",
            "eventTime": "2026-12-01T19:00:00.000Z",
            "eventName": name,
            "s3": {
                "s3SchemaVersion": "1.0",
                "configurationId": "catalog",
                "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
                "object": {"key": key, "size": 3, "eTag": "abc", "sequencer": "0A1B2C"},
            },
        }
        for key in keys
    ]
    return json.dumps({"Records": records})


def test_an_event_names_the_mounts_keys_form_decoded() -> None:
    body = _event("data", "train/a+b%2Bc.jpg", "train/%C3%A9", "other/x", "train/a+b%2Bc.jpg")
    assert changed_keys(body, "data", "train/") == ["a b+c.jpg", "é"]
    assert changed_keys(body, "data", "") == ["train/a b+c.jpg", "train/é", "other/x"]
    assert changed_keys(body, "elsewhere", "") == []


def test_an_event_through_sns_is_unwrapped_and_a_test_event_names_nothing() -> None:
    sns = {"Type": "Notification", "TopicArn": "arn:aws:sns:x", "Message": _event("data", "k")}
    assert changed_keys(json.dumps(sns), "data", "") == ["k"]
    test_event = {"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "data"}
    assert changed_keys(json.dumps(test_event), "data", "") == []
    assert changed_keys("not json", "data", "") == []


def test_a_queue_belongs_to_an_s3_mount() -> None:
    url = "https://sqs.eu-west-1.amazonaws.com/123456789012/changes"
    source = QueueSource.of(url, "s3://data/train", {"access_key": "a", "secret_key": "s"})
    assert (source.bucket, source.root, source.region) == ("data", "train/", "eu-west-1")
    with pytest.raises(ValueError):
        QueueSource.of(url, "gs://data", {})


def test_a_catalog_token_given_to_the_store_becomes_its_start_after() -> None:
    assert Catalog.for_store(encode_token("a/b"), None) == (None, "a/b")
    assert Catalog.for_store("store-token", None) == ("store-token", None)
    assert Catalog.for_store(None, "x") == (None, "x")
