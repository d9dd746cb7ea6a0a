"""The Date and Numeric condition operators: policy values parsed once (W3C ISO 8601 dates and
times, or epoch seconds; decimal numbers) and compared with the request's time, which
`request_time` gives as AWS does, to the whole second."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation

CURRENT_TIME = "aws:currenttime"  # the request's time, ISO 8601 (2026-12-04T10:00:00Z)
EPOCH_TIME = "aws:epochtime"  # the same, in seconds since the epoch (1796378400)
TIME_KEYS = frozenset({CURRENT_TIME, EPOCH_TIME})

# W3C's profile of ISO 8601 (https://www.w3.org/TR/NOTE-datetime): YYYY-MM, YYYY-MM-DD, and
# with a time of hh:mm, hh:mm:ss or hh:mm:ss.s... a zone (Z or +hh:mm). A year alone is
# left out: "2026" is read as epoch seconds, as any value of digits only is.
_W3C = re.compile(
    r"(\d{4})-(\d{2})(?:-(\d{2})"
    r"(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?(Z|[+-]\d{2}:\d{2}))?)?"
)
_EPOCH = re.compile(r"-?\d+(?:\.\d+)?")
_EPOCH_START = datetime(1970, 1, 1, tzinfo=UTC)

Compare = Callable[[Decimal, Decimal], bool]
# operator (less Date/Numeric) -> (comparison, negated)
COMPARISONS: dict[str, tuple[Compare, bool]] = {
    "Equals": (operator.eq, False),
    "NotEquals": (operator.eq, True),
    "LessThan": (operator.lt, False),
    "LessThanEquals": (operator.le, False),
    "GreaterThan": (operator.gt, False),
    "GreaterThanEquals": (operator.ge, False),
}


def instant(text: str) -> Decimal | None:
    """Seconds since the epoch of a W3C date or time, or of epoch seconds; None if it is
    neither. A date alone is its midnight UTC."""
    if _EPOCH.fullmatch(text):
        return Decimal(text)
    m = _W3C.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = m.groups()
    try:
        tz = UTC
        if zone not in (None, "Z"):
            if int(zone[4:6]) >= 60:
                return None
            sign = -1 if zone[0] == "-" else 1
            tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
        moment = datetime(
            int(year), int(month), int(day or 1), int(hour or 0), int(minute or 0),
            int(second or 0), tzinfo=tz,
        )  # fmt: skip
    except ValueError:  # a month 13, a day 31 of April, a zone past 24 h
        return None
    whole = (moment - _EPOCH_START) // timedelta(seconds=1)
    return Decimal(whole) + (Decimal("0." + fraction) if fraction else 0)


def number(text: str) -> Decimal | None:
    """A Numeric operator's value: a decimal number, written plainly (no exponent, no NaN)."""
    if not _EPOCH.fullmatch(text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


@dataclass(frozen=True, slots=True)
class Ordered:
    """A Date or Numeric test: the request's value (parsed by `parse`) against the policy's
    values, parsed when the policy was compiled. Called as the other operators' tests are,
    with the values as written, which it does not need."""

    compare: Compare
    bounds: tuple[Decimal, ...]
    parse: Callable[[str], Decimal | None]

    def __call__(self, value: str, values: tuple[str, ...]) -> bool:
        got = self.parse(value)
        return got is not None and any(self.compare(got, b) for b in self.bounds)


def request_time(now: float) -> dict[str, str]:
    """The condition keys of a request made at `now` (seconds since the epoch): to the whole
    second, as AWS gives them."""
    second = int(now // 1)
    stamp = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {CURRENT_TIME: stamp, EPOCH_TIME: str(second)}
