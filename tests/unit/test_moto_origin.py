"""The tests' S3 origin (moto, started through tests/support/moto_main.py) computes a new
object's ETag under the object's lock, as it reads its value: otherwise a GET racing a PUT
can fix a wrong ETag on the object for good (moto_main.py)."""

from __future__ import annotations

import hashlib
from typing import Any

from moto.s3.models import FakeKey

import tests.support.moto_main  # noqa: F401  (the fix, as the server runs it)


class _Watched:
    """A value buffer that records, at each read, whether the key's lock was held."""

    def __init__(self, key: FakeKey) -> None:
        self.inner: Any = key._value_buffer
        self.key = key
        self.locked_at_reads: list[bool] = []

    def seek(self, *args: Any) -> int:
        return int(self.inner.seek(*args))

    def read(self, *args: Any) -> bytes:
        self.locked_at_reads.append(self.key.lock.locked())
        return bytes(self.inner.read(*args))


def test_an_objects_etag_is_computed_under_its_lock() -> None:
    body = b"0123456789" * 100_000
    key = FakeKey(
        name="k", value=body, account_id="123456789012", region_name="us-east-1",
        bucket_name="bucket",
    )  # fmt: skip
    watched = _Watched(key)
    key._value_buffer = watched
    assert key.etag == f'"{hashlib.md5(body).hexdigest()}"'
    assert watched.locked_at_reads and all(watched.locked_at_reads)
    assert not key.lock.locked()
    assert key.value == body  # the value still reads (its own lock was released)
