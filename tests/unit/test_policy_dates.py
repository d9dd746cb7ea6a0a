"""The Date operators (and the Numeric ones on aws:EpochTime) against the request's time, read
from the clock the decision is given: W3C ISO 8601 dates and times or epoch seconds in the
policy, the request's time to the whole second, and what the gateway cannot compare refused
when stored, never matched."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.iam import MalformedPolicy, RequestContext, compile_policy, is_allowed

NOW = datetime(2026, 12, 4, 10, 0, 0, tzinfo=UTC).timestamp()  # 1796378400


def when(operator: str, value: Any, key: str = "aws:CurrentTime", effect: str = "Allow") -> str:
    statement = {
        "Effect": effect, "Action": "s3:*", "Resource": "*",
        "Condition": {operator: {key: value}},
    }  # fmt: skip
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


def allowed(policy: str, at: float = NOW, **values: str) -> bool:
    ctx = RequestContext("s3:GetObject", "arn:aws:s3:::b/k", values, clock=lambda: at)
    return is_allowed([compile_policy(policy)], (), False, ctx)


def test_date_less_than_allows_before_and_not_at_or_after() -> None:
    until = when("DateLessThan", "2026-12-04T10:00:00Z")
    assert allowed(until, NOW - 1)
    assert not allowed(until, NOW)
    assert not allowed(until, NOW + 3600)
    assert allowed(when("DateLessThanEquals", "2026-12-04T10:00:00Z"), NOW)


def test_each_comparison() -> None:
    at = "2026-12-04T10:00:00Z"
    table = {
        "DateEquals": (False, True, False),
        "DateNotEquals": (True, False, True),
        "DateLessThan": (True, False, False),
        "DateLessThanEquals": (True, True, False),
        "DateGreaterThan": (False, False, True),
        "DateGreaterThanEquals": (False, True, True),
    }
    for operator, expected in table.items():
        got = tuple(allowed(when(operator, at), t) for t in (NOW - 1, NOW, NOW + 1))
        assert got == expected, operator


def test_the_request_time_is_to_the_whole_second() -> None:
    # As AWS gives aws:CurrentTime and aws:EpochTime: 10:00:00.7 is 10:00:00.
    assert allowed(when("DateEquals", "2026-12-04T10:00:00Z"), NOW + 0.7)
    assert allowed(when("DateLessThan", "2026-12-04T10:00:00.5Z"), NOW + 0.7)


def test_w3c_forms_offsets_and_epoch_seconds_are_one_instant() -> None:
    for written in (
        "2026-12-04T10:00:00Z",
        "2026-12-04T10:00Z",
        "2026-12-04T11:00:00+01:00",
        "2026-12-04T05:30:00.000-04:30",
        "1796378400",
    ):
        assert allowed(when("DateEquals", written), NOW), written
        assert allowed(when("DateEquals", written, "aws:EpochTime"), NOW), written
    assert allowed(when("DateEquals", 1796378400), NOW)  # a JSON number
    # A date alone is its midnight UTC; a month its first day's.
    assert allowed(when("DateGreaterThanEquals", "2026-12-04"), NOW)
    assert not allowed(when("DateGreaterThanEquals", "2026-12-05"), NOW)
    assert allowed(when("DateEquals", "2026-12"), datetime(2026, 12, 1, tzinfo=UTC).timestamp())


def test_a_window_between_two_dates() -> None:
    # AWS's example: access between two dates, both conditions of one statement.
    window = json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": "s3:*", "Resource": "*",
        "Condition": {
            "DateGreaterThan": {"aws:CurrentTime": "2026-04-01T00:00:00Z"},
            "DateLessThan": {"aws:CurrentTime": "2026-06-30T23:59:59Z"},
        },
    }]})  # fmt: skip
    assert allowed(window, datetime(2026, 5, 1, tzinfo=UTC).timestamp())
    assert not allowed(window, datetime(2026, 3, 31, tzinfo=UTC).timestamp())
    assert not allowed(window, NOW)


def test_several_values_are_alternatives_and_a_negation_needs_none_to_match() -> None:
    either = when("DateEquals", ["2026-12-04T09:00:00Z", "2026-12-04T10:00:00Z"])
    assert allowed(either, NOW) and not allowed(either, NOW + 1)
    neither = when("DateNotEquals", ["2026-12-04T09:00:00Z", "2026-12-04T10:00:00Z"])
    assert not allowed(neither, NOW) and allowed(neither, NOW + 1)


def test_if_exists_and_null() -> None:
    # The request's time is always there: IfExists compares it, Null says it is present.
    assert not allowed(when("DateLessThanIfExists", "2026-01-01"), NOW)
    assert allowed(when("DateGreaterThanIfExists", "2026-01-01"), NOW)
    assert not allowed(when("Null", "true"), NOW)
    assert allowed(when("Null", "false"), NOW)
    assert allowed(when("Null", "false", "aws:EpochTime"), NOW)


def test_numeric_operators_on_epoch_time() -> None:
    assert allowed(when("NumericLessThan", "1796378401", "aws:EpochTime"), NOW)
    assert not allowed(when("NumericLessThan", 1796378400, "aws:EpochTime"), NOW)
    assert allowed(when("NumericGreaterThanEquals", "1796378400", "aws:EpochTime"), NOW)
    assert allowed(when("NumericNotEquals", "1", "aws:EpochTime"), NOW)
    assert allowed(when("NumericEqualsIfExists", "1796378400.0", "aws:EpochTime"), NOW)


def test_a_deny_until_a_date() -> None:
    policy = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "s3:*", "Resource": "*",
         "Condition": {"DateLessThan": {"aws:CurrentTime": "2026-12-04T10:00:00Z"}}},
    ]})  # fmt: skip
    assert not allowed(policy, NOW - 1)
    assert allowed(policy, NOW)


def test_the_clock_is_read_once_a_decision_and_only_when_a_policy_names_the_time() -> None:
    reads: list[float] = []

    def clock() -> float:
        reads.append(NOW)
        return NOW

    plain = compile_policy(json.dumps({"Statement": [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))  # fmt: skip
    timed = compile_policy(when("DateLessThan", "2027-01-01"))
    ctx = RequestContext("s3:GetObject", "arn:aws:s3:::b/k", {}, clock=clock)
    assert is_allowed([plain], (), False, ctx) and reads == []
    assert is_allowed([timed, timed, plain], timed.statements, False, ctx)
    assert len(reads) == 1


@pytest.mark.parametrize(
    ("operator", "key", "value", "reason"),
    [
        ("DateLessThan", "aws:CurrentTime", "2026-12-04T10:00:00", "not an ISO 8601"),  # no zone
        ("DateLessThan", "aws:CurrentTime", "next week", "not an ISO 8601"),
        ("DateLessThan", "aws:CurrentTime", "2026-02-30", "not an ISO 8601"),
        ("DateLessThan", "aws:CurrentTime", "2026-12-04T10:00:00+05:99", "not an ISO 8601"),
        ("DateLessThan", "aws:CurrentTime", "${aws:username}", "Policy variables"),
        ("DateLessThan", "aws:CurrentTime", True, "must be a string"),
        ("DateLessThan", "s3:prefix", "2026-12-04", "compares aws:currenttime"),
        ("DateLessThan", "aws:TokenIssueTime", "2026-12-04", "cannot evaluate"),
        ("NumericLessThan", "aws:CurrentTime", "1796378400", "compares aws:epochtime only"),
        ("NumericLessThan", "aws:EpochTime", "1e9", "not a number"),
        ("StringEquals", "aws:EpochTime", "1796378400", "Date operators"),
        ("ForAnyValue:DateLessThan", "aws:CurrentTime", "2026-12-04", "Condition type"),
        ("DateBefore", "aws:CurrentTime", "2026-12-04", "Condition type"),
    ],
)
def test_what_cannot_be_compared_is_refused_when_stored(
    operator: str, key: str, value: Any, reason: str
) -> None:
    with pytest.raises(MalformedPolicy, match=reason):
        compile_policy(when(operator, value, key))


def test_the_time_is_no_policy_variable() -> None:
    policy = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::b/${aws:CurrentTime}"}
    ]})  # fmt: skip
    with pytest.raises(MalformedPolicy, match="cannot evaluate"):
        compile_policy(policy)
