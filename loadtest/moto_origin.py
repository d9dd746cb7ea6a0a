"""moto's S3 server as the origin, with ranged GETs that read only their range.

Stock moto (5.x) answers a ranged GET by reading the whole object out of its temp file and
slicing it: a 1 MiB range of a 1 GiB object costs ~1.6 s of moto's CPU here, under a
per-object lock. A gateway that fetches 4 MiB blocks by range would then measure moto, not
the WAN or itself. Here `FakeKey.value`, read for a ranged GET, is a lazy view that reads
only the bytes asked for; everything else (signatures, headers, status codes, 416s, full
GETs) is moto's own code. Request bodies are read in one piece, which only makes seeding
large objects faster. `--stock` runs moto unchanged.

    python -m loadtest.moto_origin [--stock] -H HOST -p PORT
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_local = threading.local()


class _LazyValue:
    """Enough of `bytes` for moto's range handling: len(), truth, and one slice."""

    def __init__(self, key: Any) -> None:
        self._key = key

    def __len__(self) -> int:
        return int(self._key.contentsize)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, item: slice) -> bytes:
        start, stop, step = item.indices(len(self))
        if step != 1:
            raise ValueError("only contiguous slices")
        key = self._key
        with key.lock:
            key._value_buffer.seek(start)
            return bytes(key._value_buffer.read(max(0, stop - start)))


def patch_ranges() -> None:
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    full_value: property = FakeKey.__dict__["value"]
    assert full_value.fget is not None

    def value(self: Any) -> Any:
        if getattr(_local, "ranged_get", False):
            return _LazyValue(self)
        return full_value.fget(self)  # type: ignore[misc]

    setattr(FakeKey, "value", property(value, full_value.fset))  # noqa: B010 (a property)
    key_response = S3Response.key_response

    def ranged_key_response(self: Any, request: Any, full_url: str, headers: Any) -> Any:
        _local.ranged_get = request.method == "GET" and bool(request.headers.get("range"))
        try:
            status, out_headers, body = key_response(self, request, full_url, headers)
        finally:
            _local.ranged_get = False
        if isinstance(body, _LazyValue):  # a 200 to a Range moto ignored: the whole object
            body = body[:]
        return status, out_headers, body

    S3Response.key_response = ranged_key_response  # type: ignore[method-assign]


def patch_uploads() -> None:
    """werkzeug reads a request body 64 KiB at a time into a growing bytearray: a 1 GiB PUT
    took ~25 s of moto's CPU. Read it with one read of the announced length instead (it only
    makes seeding faster; no measured request has a body)."""
    from werkzeug.wsgi import LimitedStream

    def readall(self: Any) -> bytes:
        if self.is_exhausted:
            self.on_exhausted()
            return b""
        want = self.limit - self._pos
        data = bytes(self._stream.read(want))  # one buffer, filled in place
        self._pos += len(data)
        if len(data) < want:
            self.on_disconnect()
        return data

    LimitedStream.readall = readall  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--stock" in args:
        args.remove("--stock")
    else:
        patch_ranges()
        patch_uploads()
    from moto.server import main as moto_main

    moto_main(args)


if __name__ == "__main__":
    main()
