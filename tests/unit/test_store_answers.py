"""ETags compared by value (etags.same, etags.quoted) and an origin's answer to a read checked
against what was asked (base.check_answer), as rclone, SeaweedFS and S3 answer."""

from __future__ import annotations

import pytest

from gateway.stores.base import Answered, StoreError, VersionChanged, check_answer
from gateway.stores.etags import quoted, same

HEX = "8e296a067a37563370ded05f5a3bf3ec"


@pytest.mark.parametrize(
    "a, b",
    [
        (HEX, f'"{HEX}"'),
        (f'W/"{HEX}"', f'"{HEX}"'),
        (f'"{HEX}-3"', f"{HEX}-3"),
        (f' "{HEX}" ', HEX),
    ],
)
def test_the_forms_of_one_etag_are_the_same(a: str, b: str) -> None:
    assert same(a, b) and same(b, a) and quoted(a) == quoted(b) == f'"{b.strip().strip(chr(34))}"'


def test_other_etags_and_none_are_not_the_same() -> None:
    assert not same(HEX, HEX[:-1] + "0")
    assert not same(None, HEX) and not same(HEX, None)


def check(**over: object) -> Answered:
    args: dict[str, object] = {
        "key": "k", "start": 100, "end": 200, "ranged": True, "if_match": f'"{HEX}"',
        "etag": HEX, "content_range": "bytes 100-199/1000", "length": 100,
    }  # fmt: skip
    args.update(over)
    return check_answer(**args)  # type: ignore[arg-type]


def test_an_exact_answer_is_passed_on_whole() -> None:
    assert check() == Answered(0, None)
    assert check(content_range="bytes 100-999/1000", end=None) == Answered(0, None)


def test_another_version_is_a_version_change() -> None:
    with pytest.raises(VersionChanged):
        check(etag='"' + "0" * 32 + '"')
    with pytest.raises(VersionChanged):
        check(etag=None)


def test_a_range_answered_whole_gives_the_range_from_it() -> None:
    assert check(content_range=None, length=1000) == Answered(100, 100)
    assert check(content_range=None, length=150) == Answered(100, 50)
    assert check(content_range=None, length=1000, end=None) == Answered(100, None)


def test_more_than_asked_is_cut_and_less_or_elsewhere_is_refused() -> None:
    assert check(content_range="bytes 100-299/1000") == Answered(0, 100)
    assert check(content_range="bytes 100-149/150") == Answered(0, None)  # the object's end
    for wrong in ("bytes 0-99/1000", "bytes 100-149/1000", "items 100-199/1000", "bytes x-y/z"):
        with pytest.raises(StoreError):
            check(content_range=wrong)


def test_an_unranged_read_is_checked_by_its_version_alone() -> None:
    assert check(ranged=False, content_range=None, start=0, end=None) == Answered()
