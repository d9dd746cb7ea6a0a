"""What the node's listings said (gateway/service/listed.py), on the SQLite file its workers
share: spans, keys in them, and listings that finish in another order than they were asked."""

from __future__ import annotations

from pathlib import Path

from gateway.service.listed import Listed, ListedVersions, after_for

MOUNT = 7
PREFIX = "epochs/"


def _keys(first: int, last: int) -> list[tuple[str, str, int]]:
    return [(f"{PREFIX}{i:04d}.bin", f'"etag-{i}"', 100 + i) for i in range(first, last + 1)]


def test_a_key_in_a_span_is_listed_or_gone_and_one_outside_is_not_answered(
    tmp_path: Path,
) -> None:
    listed = ListedVersions(str(tmp_path))
    listed.record(MOUNT, PREFIX, after_for(f"{PREFIX}0010.bin"), f"{PREFIX}0019.bin", 100.0,
                  [k for k in _keys(10, 19) if k[0] != f"{PREFIX}0015.bin"])  # fmt: skip
    found = listed.lookup(MOUNT, f"{PREFIX}0012.bin", since=50.0)
    assert found is not None and (found.etag, found.size, found.at) == ('"etag-12"', 112, 100.0)
    gone = listed.lookup(MOUNT, f"{PREFIX}0015.bin", since=50.0)
    assert gone is not None and gone.etag is None
    assert listed.lookup(MOUNT, f"{PREFIX}0020.bin", since=50.0) is None  # past the span
    assert listed.lookup(MOUNT, f"{PREFIX}0009.bin", since=50.0) is None  # before it
    assert listed.lookup(MOUNT, f"{PREFIX}0012.bin", since=100.0) is None  # too old


def test_a_listing_that_finishes_after_a_newer_one_never_makes_a_key_gone(
    tmp_path: Path,
) -> None:
    # Two listings over the same keys (two workers, or two askers from different keys), the
    # older asked first and recorded last: each key is still listed, at the newer time.
    listed = ListedVersions(str(tmp_path))
    listed.record(MOUNT, PREFIX, after_for(f"{PREFIX}0050.bin"), None, 200.0, _keys(50, 99))
    listed.record(MOUNT, PREFIX, after_for(f"{PREFIX}0000.bin"), None, 150.0, _keys(0, 99))
    for i in (0, 49, 50, 70, 99):
        found = listed.lookup(MOUNT, f"{PREFIX}{i:04d}.bin", since=100.0)
        assert found is not None and found.etag == f'"etag-{i}"', (i, found)
    assert listed.lookup(MOUNT, f"{PREFIX}0070.bin", since=100.0).at == 200.0  # type: ignore[union-attr]
    gone = listed.lookup(MOUNT, f"{PREFIX}0100.bin", since=100.0)
    assert gone is not None and gone.etag is None  # past both lists' ends: not there


def test_many_keys_looked_up_at_once_are_answered_as_one_at_a_time(tmp_path: Path) -> None:
    # A lease renewal of a thousand keys asks what the listings said of all of them at once.
    listed = ListedVersions(str(tmp_path))
    listed.record(MOUNT, PREFIX, after_for(f"{PREFIX}0050.bin"), None, 200.0, _keys(50, 99))
    listed.record(MOUNT, PREFIX, after_for(f"{PREFIX}0000.bin"), f"{PREFIX}0029.bin", 150.0,
                  [k for k in _keys(0, 29) if k[0] != f"{PREFIX}0015.bin"])  # fmt: skip
    listed.record(MOUNT, "other/", "other/", None, 150.0, [("other/a", '"x"', 1)])
    keys = [f"{PREFIX}{i:04d}.bin" for i in range(0, 120, 3)] + [f"{PREFIX}0015.bin", "other/a"]
    for since in (100.0, 160.0, 250.0):
        one_by_one = {k: listed.lookup(MOUNT, k, since) for k in keys}
        assert listed.lookup_many(MOUNT, keys, since) == {
            k: v for k, v in one_by_one.items() if v is not None
        }, since
    many = listed.lookup_many(MOUNT, keys, 100.0)
    assert many[f"{PREFIX}0015.bin"].etag is None  # in a span, not listed: gone
    assert f"{PREFIX}0033.bin" not in many  # between the spans: not answered
    assert many["other/a"].etag == '"x"'


def test_a_span_read_once_answers_its_page_until_it_is_too_old_then_the_newer_one_does(
    tmp_path: Path,
) -> None:
    # Two workers on the node's file: the reader keeps a span it read (no query for the next
    # keys of its page), never past `since`, and then reads what the newer listing said.
    lister, reader = ListedVersions(str(tmp_path)), ListedVersions(str(tmp_path))
    lister.record(MOUNT, PREFIX, PREFIX, None, 100.0, _keys(0, 49))
    assert reader.lookup(MOUNT, f"{PREFIX}0001.bin", since=50.0) == Listed('"etag-1"', 101, 100.0)
    changed = [(k, '"new"' if k.endswith("0002.bin") else e, s) for k, e, s in _keys(0, 49)]
    lister.record(MOUNT, PREFIX, PREFIX, None, 200.0, [c for c in changed if "0003" not in c[0]])
    # Within the old span's time: what it said (a listing asked after `since` said so).
    assert reader.lookup(MOUNT, f"{PREFIX}0002.bin", since=50.0) == Listed('"etag-2"', 102, 100.0)
    # Past it: the newer listing's word, the changed and the gone key too.
    assert reader.lookup(MOUNT, f"{PREFIX}0002.bin", since=150.0) == Listed('"new"', 102, 200.0)
    assert reader.lookup(MOUNT, f"{PREFIX}0003.bin", since=150.0) == Listed(None, 0, 200.0)
    assert reader.lookup(MOUNT, f"{PREFIX}0002.bin", since=250.0) is None
