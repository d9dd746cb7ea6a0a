"""IAM's wildcards: `*` any run of characters (across `/` too), `?` any one character;
everything else literal. fnmatch differs (`[...]` classes, and `*` is fine but its escaping
and case rules are the platform's), so the pattern becomes an anchored regular expression."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

Matcher = Callable[[str], bool]


def _always(_: str) -> bool:
    return True


@functools.lru_cache(maxsize=4096)
def wildcard(pattern: str, ignore_case: bool = False, escaped: bool = False) -> Matcher:
    """A predicate: does a whole value match `pattern`? `escaped`: `\\*`, `\\?` and `\\\\` in
    the pattern are those characters as text (how a filled-in policy variable is put in)."""
    if pattern == "*":
        return _always
    if escaped and "\\" in pattern:
        return _escaped(pattern, ignore_case)
    if "*" not in pattern and "?" not in pattern:
        if ignore_case:
            folded = pattern.casefold()
            return lambda value: value.casefold() == folded
        return pattern.__eq__
    parts = []
    for char in pattern:
        if char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return _regex("".join(parts), ignore_case)


def _escaped(pattern: str, ignore_case: bool) -> Matcher:
    parts = []
    chars = iter(pattern)
    for char in chars:
        if char == "\\":
            parts.append(re.escape(next(chars, "\\")))
        elif char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return _regex("".join(parts), ignore_case)


def _regex(expression: str, ignore_case: bool) -> Matcher:
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    compiled = re.compile(expression, flags).fullmatch
    return lambda value: compiled(value) is not None
