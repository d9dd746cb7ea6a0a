"""moto's S3 server, with one race of its own closed: run as `python moto_main.py ARGS...`
(the arguments of `moto_server`).

moto 5 computes a new object's ETag lazily (`FakeKey.etag`: seek to 0, read the buffer) without
the key's lock, which its `value` (seek to 0, read) takes. A PUT makes the key visible before
its answer asks the ETag, so a GET of the key in another of the server's threads can move the
buffer's position between the two steps: the ETag is then the MD5 of the bytes left (often of
none), kept for good, and every later answer pairs the object's bytes with that ETag. Measured
on FakeKey alone: 2 wrong ETags in 3,000 pairs of threads (one asking the ETag, one the value).
A test that overwrites an object while reading it (tests/e2e/test_cache_faults.py) saw the
gateway pass such an ETag on. The gateway cannot tell that from an origin's own answer, so the
origin is made right here: the ETag is computed under the same lock as the value.
"""

from __future__ import annotations

import hashlib
import sys

from moto.s3.models import FakeKey
from moto.server import main


def _etag(self: FakeKey) -> str:
    with self.lock:
        if self._etag is None:
            digest = hashlib.md5()
            self._value_buffer.seek(0)
            while block := self._value_buffer.read(16 << 20):
                digest.update(block)
            self._etag = digest.hexdigest()
    return f'"{self._etag}"'


FakeKey.etag = property(_etag)  # type: ignore[assignment,method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
