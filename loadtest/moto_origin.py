"""moto's S3 server as the origin, with ranged GETs that read only their range, listings
that cost a page, and in-process seeding.

Ranges. Stock moto (5.x) answers a ranged GET by reading the whole object out of its temp
file and slicing it: a 1 MiB range of a 1 GiB object costs ~1.6 s of moto's CPU here, under a
per-object lock. A gateway that fetches 4 MiB blocks by range would then measure moto, not
the WAN or itself. Here `FakeKey.value`, read for a ranged GET, is a lazy view that reads
only the bytes asked for; everything else (signatures, headers, status codes, 416s, full
GETs) is moto's own code. Request bodies are read in one piece, which only makes seeding
large objects faster.

Listings. Stock moto answers every ListObjectsV2 page by walking all the bucket's keys,
sorting every match under the prefix, then scanning from the start for the continuation
point: ~0.35 s of moto's CPU per 1000-key page of a 100,000-key bucket, so a listing of
100,000 keys (100 pages) took ~35 s of moto alone and measured moto, not the gateway or the
WAN. Here `S3Backend.list_objects_v2` keeps each bucket's key names sorted (rebuilt once
after any change to the bucket's keys, which every mutation of moto's key store marks),
bisects to the later of the prefix and the continuation token or StartAfter, and walks only
as far as the page (skipping a whole CommonPrefix by bisection): a page costs a page, as in a
real store. The page (keys, CommonPrefixes, their order, IsTruncated, the token and moto's
token table) is what moto's own code returns; it falls back to that code for table buckets,
unknown tokens and negative MaxKeys. ListObjects (v1) and ListObjectVersions are moto's own.
The backend's part of a 1000-key page fell from ~350 ms to ~2 ms; what a page still costs
(~80-180 ms of CPU here, busy machine) is moto's response serializer writing 1000 entries,
which grows with the page, not the bucket.

Seeding. Putting objects over HTTP runs at ~300 a second (moto's CPU per request), too slow
for 100,000 keys. `POST /_loadtest/seed` (moto's own port; only the harness knows it) takes
`{"bucket", "keys", "size", "first_index", "block_seed"}` and creates the objects in moto's
backend with `S3Backend.put_object`, the call moto's PUT handler makes, plus what that
handler keeps of a boto3 PUT (the bucket's ACL, the `x-amz-content-sha256` header): etag,
size, last-modified, GET, HEAD and listings are moto's own. Key i holds
`loadtest.data.payload(first_index + i, size, random_block(size, block_seed))`, the bytes
the harness writes to its local mirror. A GET of that path answers `{"loadtest_seed": 1}`,
so the harness can tell the endpoint is there.

`--stock` runs moto unchanged (the harness then seeds over HTTP).

    python -m loadtest.moto_origin [--stock] -H HOST -p PORT
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

_local = threading.local()
SEED_PATH = "/_loadtest/seed"


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


_stamps = itertools.count(1)  # next() is atomic under the GIL: every mutation gets its own


def _sorted_names(store: Any) -> list[str]:
    """The store's key names, sorted; rebuilt only after a mutation (see `patch_listing`)."""
    state = store.__dict__
    stamp = state.get("_lt_stamp", 0)
    cached = state.get("_lt_index")
    if cached is not None and cached[0] == stamp:
        return cached[1]
    names = sorted(dict.__iter__(store))  # C iteration: no other thread runs meanwhile
    state["_lt_index"] = (stamp, names)  # a mutation meanwhile changed the stamp: rebuilt
    return names


def patch_listing() -> None:
    from moto.s3.models import FakeDeleteMarker, FakeTableStorageBucket, S3Backend
    from moto.s3.utils import _VersionedKeyStore

    def stamped(method: Callable[..., Any]) -> Callable[..., Any]:
        def mutate(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            finally:
                self.__dict__["_lt_stamp"] = next(_stamps)

        return mutate

    for name in ("__setitem__", "setlist", "pop"):  # moto's own
        setattr(_VersionedKeyStore, name, stamped(_VersionedKeyStore.__dict__[name]))
    for name in ("__delitem__", "__ior__", "clear", "update", "popitem", "setdefault"):
        setattr(_VersionedKeyStore, name, stamped(getattr(dict, name)))

    stock = S3Backend.list_objects_v2

    def list_objects_v2(
        self: Any,
        bucket: Any,
        prefix: str | None,
        delimiter: str | None,
        continuation_token: str | None,
        start_after: str | None,
        max_keys: int,
    ) -> Any:
        tokens = self._pagination_tokens
        if (
            isinstance(bucket, FakeTableStorageBucket)
            or max_keys < 0
            or (continuation_token and continuation_token not in tokens)
        ):
            return stock(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys)
        # As moto: the token wins over StartAfter; items (keys and CommonPrefixes) whose
        # name is <= the limit are dropped; "" prefix/delimiter/StartAfter mean none.
        limit = tokens[continuation_token] if continuation_token else (start_after or None)
        prefix = prefix or ""
        store = bucket.keys
        names = _sorted_names(store)
        n = len(names)
        i = bisect.bisect_left(names, prefix)
        if limit is not None:
            i = max(i, bisect.bisect_right(names, limit))
        items: list[Any] = []
        while i < n and len(items) <= max_keys:  # one past the page tells "truncated"
            name = names[i]
            if not name.startswith(prefix):
                break
            rest = name[len(prefix) :]
            if delimiter and delimiter in rest:
                folder = prefix + rest.split(delimiter)[0] + delimiter
                if limit is None or folder > limit:
                    items.append(folder)
                i = bisect.bisect_left(names, folder + "\U0010ffff", i)  # past the folder
                while i < n and names[i].startswith(folder):
                    i += 1
                continue
            key = store.get(name)  # the latest version, as moto's items()
            if key is not None and not isinstance(key, FakeDeleteMarker):
                items.append(key)
            i += 1
        return self._truncate_result(items, max_keys)

    S3Backend.list_objects_v2 = list_objects_v2  # type: ignore[method-assign]


def _seed(spec: dict[str, Any]) -> dict[str, Any]:
    """Create spec["keys"] in moto's backend, as moto's PUT handler would."""
    from moto.s3.models import s3_backends
    from moto.s3.utils import metadata_from_headers

    from loadtest.data import payload, random_block

    t0 = time.monotonic()
    bucket_name = spec["bucket"]
    partition, account_id = s3_backends.bucket_accounts[bucket_name]
    backend = s3_backends[account_id][partition]
    bucket = backend.get_bucket(bucket_name)
    size, first = int(spec["size"]), int(spec.get("first_index", 0))
    block = random_block(size, int(spec.get("block_seed", 7)))
    keys: Iterable[str] = spec["keys"]
    count = 0
    for count, key_name in enumerate(keys, 1):
        body = payload(first + count - 1, size, block)
        key = backend.put_object(bucket_name, key_name, body, storage="STANDARD")
        # What moto keeps of a boto3 PUT over http: the payload's SHA-256 header (which it
        # then returns on GET and HEAD) and the bucket's ACL.
        sha256 = hashlib.sha256(body).hexdigest()
        key.set_metadata(metadata_from_headers({"X-Amz-Content-SHA256": sha256}))
        key.set_acl(bucket.acl)
    return {"created": count, "seconds": round(time.monotonic() - t0, 3)}


def patch_seeding() -> None:
    """`SEED_PATH` in front of moto's own WSGI application (see the module docstring)."""
    import moto.server

    dispatcher = moto.server.DomainDispatcherApplication

    class SeedingApp:
        def __init__(self, create_app: Any) -> None:
            self.app = dispatcher(create_app)

        def __setattr__(self, name: str, value: Any) -> None:
            if name == "app":
                object.__setattr__(self, name, value)
            else:  # moto sets `debug` on its application
                setattr(self.app, name, value)

        def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            if environ.get("PATH_INFO") != SEED_PATH:
                return self.app(environ, start_response)
            status = "200 OK"
            answer: dict[str, Any] = {"loadtest_seed": 1}
            if environ["REQUEST_METHOD"] == "POST":
                length = int(environ.get("CONTENT_LENGTH") or 0)
                try:
                    answer = _seed(json.loads(environ["wsgi.input"].read(length)))
                except Exception as exc:  # the harness reads the error and stops
                    status, answer = "500 Internal Server Error", {"error": repr(exc)}
            body = json.dumps(answer).encode()
            start_response(
                status,
                [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
            )
            return [body]

    moto.server.DomainDispatcherApplication = SeedingApp  # type: ignore[misc,assignment]


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--stock" in args:
        args.remove("--stock")
    else:
        patch_ranges()
        patch_uploads()
        patch_listing()
        patch_seeding()
    from moto.server import main as moto_main

    moto_main(args)


if __name__ == "__main__":
    main()
