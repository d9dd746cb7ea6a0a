"""One contract for every under-store: the file store on a temporary folder, S3 on moto (behind a
counting proxy), Azure Blob on Azurite, GCS on fake-gcs-server and HDFS on the WebHDFS test server,
each with a mount prefix, must answer the same calls with the same results.
"""

from __future__ import annotations

import os
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from gateway.stores import (
    ObjectNotFound,
    StoreUnavailable,
    VersionChanged,
    open_store,
)
from gateway.stores.local import CHUNK_SIZE as FILE_CHUNK
from gateway.stores.local import LocalStore
from gateway.stores.s3 import CHUNK_SIZE as S3_CHUNK
from gateway.stores.s3 import S3Store
from tests.support.net import free_port
from tests.support.origin import CountingProxy
from tests.support.real_origins import RealS3Origin
from tests.support.stores import (
    MOUNT_PREFIX,
    TREE,
    Origin,
    S3Origin,
    every_call_is_unavailable,
    list_all,
    oracle,
    range_cases,
    read_all,
    s3_options,
    utf8,
)

pytestmark = pytest.mark.anyio

MIB = 1 << 20


async def test_stat_reports_size_etag_mtime_and_type(origin: Origin) -> None:
    origin.put("docs/readme.txt", b"hello world", content_type="text/plain")
    info = await origin.store.stat("docs/readme.txt")
    assert info.key == "docs/readme.txt"
    assert info.size == 11
    assert info.etag.startswith('"') and info.etag.endswith('"') and len(info.etag) > 2
    assert info.last_modified.utcoffset() is not None
    assert info.last_modified.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert info.content_type == "text/plain"


async def test_prepare_ahead_of_the_first_request_changes_nothing(origin: Origin) -> None:
    """A mount's store is prepared when the mount loads (clients made off the first miss);
    preparing twice, or a store already used, is harmless."""
    origin.put("ready", b"set")
    await origin.store.prepare()
    await origin.store.prepare()
    assert await read_all(origin.store, "ready") == b"set"
    await origin.store.prepare()
    assert (await origin.store.stat("ready")).size == 3


async def test_stat_of_missing_key_is_not_found(origin: Origin) -> None:
    origin.put("there", b"x")
    with pytest.raises(ObjectNotFound):
        await origin.store.stat("not-there")
    with pytest.raises(ObjectNotFound):
        await read_all(origin.store, "not-there")


def _server(origin: Origin) -> str:
    """Which S3 server nobody here wrote the origin is ("" for the others)."""
    return origin.server.name if isinstance(origin, RealS3Origin) else ""


def _listing_quirks(origin: Origin) -> None:
    if _server(origin) == "seaweedfs":
        # It lists a folder's keys before its siblings ('a/b' before 'a-c'), not in S3's byte
        # order, and start-after follows that order; over this tree, pages of one or two keys
        # with a delimiter did not end within 100 pages (docs/stores/s3-and-file.md).
        pytest.skip("SeaweedFS does not list in S3's order")


async def test_directory_like_key_is_not_an_object(origin: Origin) -> None:
    origin.put("dir/inner", b"x")
    # SeaweedFS answers a folder's name with a slash as an empty object (a quirk: AWS has
    # such an object only when a client made it).
    keys = ("dir", "") if _server(origin) == "seaweedfs" else ("dir", "dir/", "")
    for key in keys:
        with pytest.raises(ObjectNotFound):
            await origin.store.stat(key)
        with pytest.raises(ObjectNotFound):
            await read_all(origin.store, key)


async def test_ranges_return_exactly_the_requested_bytes(origin: Origin) -> None:
    data = os.urandom(3 * MIB + 123)
    n = len(data)
    origin.put("big.bin", data)
    for start, end in range_cases(n):
        got = await read_all(origin.store, "big.bin", start, end)
        assert got == data[start:end], (start, end)


async def test_reads_arrive_in_bounded_chunks(origin: Origin) -> None:
    data = os.urandom(3 * MIB + 1)
    origin.put("big.bin", data)
    async with aclosing(origin.store.read("big.bin")) as stream:  # type: ignore[type-var]
        chunks = [c async for c in stream]
    assert b"".join(chunks) == data
    limit = {"file": FILE_CHUNK, "s3": S3_CHUNK}.get(origin.kind, 4 * MIB)
    assert max(len(c) for c in chunks) <= limit
    if origin.kind == "file":
        assert len(chunks) == 4  # one thread hop per MiB, not per 64 KiB


async def test_zero_length_object(origin: Origin) -> None:
    origin.put("empty", b"")
    assert (await origin.store.stat("empty")).size == 0
    assert await read_all(origin.store, "empty") == b""
    assert await read_all(origin.store, "empty", 0, 10) == b""
    assert await read_all(origin.store, "empty", 5) == b""


async def test_if_match_guards_against_another_version(origin: Origin) -> None:
    origin.put("obj", b"version one")
    old = (await origin.store.stat("obj")).etag
    assert await read_all(origin.store, "obj", if_match=old) == b"version one"
    assert await read_all(origin.store, "obj", 0, 7, if_match=old) == b"version"
    with pytest.raises(VersionChanged):
        await read_all(origin.store, "obj", if_match='"0123-45"')
    origin.put("obj", b"version two, longer")
    assert (await origin.store.stat("obj")).etag != old
    with pytest.raises(VersionChanged):
        await read_all(origin.store, "obj", 0, 4, if_match=old)


async def test_odd_keys_round_trip(origin: Origin) -> None:
    for i, key in enumerate(TREE):
        origin.put(key, f"body {i}".encode())
    for i, key in enumerate(TREE):
        assert (await origin.store.stat(key)).size == len(f"body {i}")
        assert await read_all(origin.store, key) == f"body {i}".encode()


async def test_listing_without_delimiter_matches_sorted_keys(origin: Origin) -> None:
    _listing_quirks(origin)
    for key in TREE:
        origin.put(key, b"x")
    if origin.folder is not None:  # a file system keeps empty directories: never listed
        (origin.folder / "a" / "emptydir" / "deeper").mkdir(parents=True)
    for prefix in ("", "a", "a/", "a/b", "café/", "nothing"):
        entries, pages = await list_all(origin.store, prefix)
        assert entries == oracle(TREE, prefix, None, ""), prefix
    entries, pages = await list_all(origin.store, max_keys=4)
    assert entries == sorted(TREE, key=utf8)
    assert pages > 2
    for listed in (await origin.store.list_page("a/")).objects:
        stat = await origin.store.stat(listed.key)
        assert (listed.etag, listed.size) == (stat.etag, stat.size)  # one version, one ETag


async def test_listing_with_delimiter_rolls_up_prefixes(origin: Origin) -> None:
    _listing_quirks(origin)
    for key in TREE:
        origin.put(key, b"x")
    if origin.folder is not None:
        (origin.folder / "empty" / "dir").mkdir(parents=True)
        (origin.folder / "a" / "emptydir").mkdir()
    combos = [("", "/"), ("a", "/"), ("a/", "/"), ("a/x/", "/"), ("a/b", "/"), ("", "-")]
    combos += [("a/", "b"), ("", "y/"), ("zz", "/"), ("nothing/", "/")]
    if _server(origin) == "rclone":
        # rclone rolls up "/" only (docs/stores/s3-and-file.md): a known defect, not fixed.
        combos = [c for c in combos if c[1] == "/"]
    for prefix, delimiter in combos:
        for max_keys in (1, 2, 1000):
            entries, _ = await list_all(origin.store, prefix, delimiter, max_keys=max_keys)
            assert entries == oracle(TREE, prefix, delimiter, ""), (prefix, delimiter, max_keys)
    page = await origin.store.list_page("", "/")
    assert "a/" in page.common_prefixes and "a0" in [o.key for o in page.objects]
    assert page.next_token is None


async def test_a_listing_tells_each_key_s_version_as_a_stat_does(origin: Origin) -> None:
    """What revalidation by listing relies on (docs/cache.md, "Freshness"): a key listed with
    the ETag and size a stat answers for it, so that a listing confirms or refutes many held
    versions at once; after an overwrite, the listing tells the new one."""
    for key, body in (("v/a", b"one"), ("v/b", b"two two"), ("v/c/d", b"three")):
        origin.put(key, body)
    stats = {k: await origin.store.stat(k) for k in ("v/a", "v/b", "v/c/d")}
    listed = {
        o.key: o for o in (await origin.store.list_page("v/", None, None, None, 1000)).objects
    }
    for key, info in stats.items():
        assert (listed[key].etag, listed[key].size) == (info.etag, info.size), key
    origin.put("v/b", b"rewritten, longer")
    again = {o.key: o for o in (await origin.store.list_page("v/", None, None, None, 1000)).objects}
    new = await origin.store.stat("v/b")
    assert (again["v/b"].etag, again["v/b"].size) == (new.etag, new.size)
    assert again["v/b"].etag != stats["v/b"].etag


async def test_start_after_skips_everything_up_to_it(origin: Origin) -> None:
    _listing_quirks(origin)
    for key in TREE:
        origin.put(key, b"x")
    cases = [("", None, "a/b"), ("", "/", "a/b"), ("", "/", "a/"), ("a/", "/", "a/x/y")]
    cases += [("", None, "zzzz"), ("", "/", "\U0010ffff"), ("", None, "")]
    for prefix, delimiter, after in cases:
        entries, _ = await list_all(origin.store, prefix, delimiter, start_after=after)
        assert entries == oracle(TREE, prefix, delimiter, after), (prefix, delimiter, after)


async def test_missing_root_or_bucket_is_unavailable(origin: Origin, tmp_path: Path) -> None:
    if isinstance(origin, S3Origin):
        store = open_store("s3://no-such-bucket-here/x", s3_options(origin.proxy.url))
    else:
        store = open_store((tmp_path / "no-such-dir").as_uri(), {})
    try:
        await every_call_is_unavailable(store)
    finally:
        await store.close()


async def test_stopping_a_read_early_releases_it(origin: Origin) -> None:
    data = os.urandom(4 * MIB)
    origin.put("big.bin", data)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        async with aclosing(origin.store.read("big.bin")) as stream:  # type: ignore[type-var]
            async for _chunk in stream:
                break
    if origin.kind == "file":
        assert len(os.listdir("/proc/self/fd")) == fds
    assert await read_all(origin.store, "big.bin", 10, 20) == data[10:20]


# -- file store only ---------------------------------------------------------------------------


async def test_file_store_refuses_keys_that_escape_the_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "a").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (root / "a" / "ok").write_bytes(b"ok")
    (root / "escape").symlink_to(outside / "secret")
    (root / "escape-dir").symlink_to(outside)
    (root / "alias").symlink_to(root / "a" / "ok")
    (root / "a" / "loop").symlink_to(root)
    store = LocalStore(str(root))
    bad = ["../outside/secret", "a/../../outside/secret", str(outside / "secret"), "/etc/passwd"]
    bad += ["a\0b", "./a/ok", "a//ok", "a/./ok", "escape", "escape-dir/secret", "\udcff"]
    for key in bad:
        with pytest.raises(ObjectNotFound):
            await store.stat(key)
        with pytest.raises(ObjectNotFound):
            await read_all(store, key)
    assert await read_all(store, "alias") == b"ok"
    entries, _ = await list_all(store)
    assert entries == ["a/ok", "alias"]  # no escapes, and the loop is not followed forever
    entries, _ = await list_all(store, "", "/")
    assert entries == ["a/", "alias"]


async def test_file_listing_prunes_folders_before_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(50):
        (tmp_path / f"d{i:03}").mkdir()
        (tmp_path / f"d{i:03}" / "f").write_bytes(b"x")
    store = LocalStore(str(tmp_path))
    scanned: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path: str) -> Any:
        scanned.append(path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    page = await store.list_page(start_after="d047/f", max_keys=1)
    assert [o.key for o in page.objects] == ["d048/f"] and page.next_token is not None
    page = await store.list_page(token=page.next_token)
    assert [o.key for o in page.objects] == ["d049/f"] and page.next_token is None
    # The root and the folders at or after the marker, never the 47 before it.
    assert sorted(os.path.basename(p) for p in scanned) == sorted(
        [tmp_path.name, "d047", "d048", "d049", tmp_path.name, "d048", "d049"]
    )


async def test_file_etag_is_not_md5_shaped_and_tracks_changes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    store = LocalStore(str(tmp_path))
    first = await store.stat("f")
    assert "-" in first.etag and first.content_type == "application/octet-stream"
    os.utime(tmp_path / "f", ns=(1, 1_000_000_000))
    assert (await store.stat("f")).etag != first.etag


async def test_file_read_detects_a_change_during_the_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(os.urandom(3 * MIB))
    store = LocalStore(str(tmp_path))
    with pytest.raises(VersionChanged):
        async with aclosing(store.read("f")) as stream:  # type: ignore[type-var]
            async for _chunk in stream:
                os.utime(tmp_path / "f", ns=(1, 1_000_000_000))


# -- S3 store only: what reaches the origin ----------------------------------------------------


async def test_s3_ranged_read_is_one_get_with_that_range(s3_origin: S3Origin) -> None:
    s3_origin.put("dir/obj", os.urandom(5000))
    s3_origin.proxy.reset()
    await read_all(s3_origin.store, "dir/obj", 1000, 2000)
    await read_all(s3_origin.store, "dir/obj")
    await read_all(s3_origin.store, "dir/obj", 4000)
    gets = [(r.method, r.path, r.range) for r in s3_origin.proxy.requests]
    path = f"/{s3_origin.bucket}/{MOUNT_PREFIX}/dir/obj"
    assert gets == [
        ("GET", path, "bytes=1000-1999"),
        ("GET", path, None),
        ("GET", path, "bytes=4000-"),
    ]


async def test_s3_stat_maps_headers_and_user_metadata(s3_origin: S3Origin) -> None:
    s3_origin.put(
        "meta.json",
        b"{}",
        content_type="application/json",
        ContentEncoding="identity",
        ContentDisposition='attachment; filename="m.json"',
        ContentLanguage="de",
        CacheControl="max-age=60",
        Expires="Wed, 21 Oct 2037 07:28:00 GMT",
        Metadata={"owner": "team-a", "Build": "42"},
    )
    info = await s3_origin.store.stat("meta.json")
    assert (
        info.etag
        == s3_origin.s3.head_object(Bucket=s3_origin.bucket, Key="pre/fix/meta.json")["ETag"]
    )
    assert (info.content_type, info.content_encoding) == ("application/json", "identity")
    assert info.content_disposition == 'attachment; filename="m.json"'
    assert (info.content_language, info.cache_control) == ("de", "max-age=60")
    assert info.expires == "Wed, 21 Oct 2037 07:28:00 GMT"
    assert dict(info.metadata) == {"owner": "team-a", "build": "42"}
    assert info.storage_class == "STANDARD"


async def test_s3_misses_check_the_bucket_only_once(s3_origin: S3Origin) -> None:
    for key in ("nope-1", "nope-2", "nope-3"):
        with pytest.raises(ObjectNotFound):
            await s3_origin.store.stat(key)
    assert s3_origin.proxy.count("HEAD", path_contains="/nope-") == 3
    assert s3_origin.proxy.count("HEAD") == 4  # plus one HEAD of the bucket


async def test_s3_listing_asks_for_the_mount_prefix(s3_origin: S3Origin) -> None:
    s3_origin.put("k", b"x")
    page = await s3_origin.store.list_page("k", "/", start_after="a")
    assert [o.key for o in page.objects] == ["k"]
    (request,) = s3_origin.proxy.requests
    assert "prefix=pre%2Ffix%2Fk" in request.query
    assert "start-after=pre%2Ffix%2Fa" in request.query


async def test_s3_unreachable_endpoint_is_unavailable() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    store = open_store("s3://bucket/p", s3_options(dead, max_attempts="1", connect_timeout="2"))
    try:
        await every_call_is_unavailable(store)
    finally:
        await store.close()


async def test_s3_server_errors_are_unavailable() -> None:
    gateway_to_nowhere = CountingProxy(f"http://127.0.0.1:{free_port()}")
    store = open_store("s3://bucket/p", s3_options(gateway_to_nowhere.url, max_attempts="2"))
    try:
        with pytest.raises(StoreUnavailable):
            await store.stat("k")
        with pytest.raises(StoreUnavailable):
            await read_all(store, "k", 0, 10)
        # The transport asks once more after a 502 (worth a retry), max_attempts in all, each
        # read once: no second path asks again.
        assert gateway_to_nowhere.count("HEAD") == 2
        assert gateway_to_nowhere.count("GET") == 2
    finally:
        await store.close()
        gateway_to_nowhere.stop()


# -- open_store --------------------------------------------------------------------------------


def test_open_store_dispatches_by_scheme(tmp_path: Path) -> None:
    local = open_store(tmp_path.as_uri(), {})
    assert isinstance(local, LocalStore) and local.root == str(tmp_path)
    remote = open_store("s3://bkt/pre/fix/", s3_options("http://127.0.0.1:1"))
    assert isinstance(remote, S3Store) and (remote.bucket, remote.prefix) == ("bkt", "pre/fix/")
    assert isinstance(open_store("s3://bkt", {}), S3Store)


@pytest.mark.parametrize(
    "uri",
    ["ftp://host/x", "file://relative/path", "file:relative", "s3:///prefix", "s3://", "bkt/x"],
)
def test_open_store_rejects_malformed_uris(uri: str) -> None:
    with pytest.raises(ValueError):
        open_store(uri, {})


def test_open_store_never_echoes_credentials_in_uris() -> None:
    with pytest.raises(ValueError) as err:
        open_store("s3://AKIDEXAMPLE:s3cr3t@bucket/p", {})
    assert "s3cr3t" not in str(err.value)


def test_s3_store_rejects_unknown_or_half_options() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        open_store("s3://bkt", {"endpoint": "http://x"})
    with pytest.raises(ValueError, match="secret_key"):
        open_store("s3://bkt", {"access_key": "a"})
