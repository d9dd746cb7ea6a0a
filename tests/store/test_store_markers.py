"""The file store holds what a folder tree cannot hold as plain files: a directory marker
`a/` (the empty object pyarrow's write_dataset and console tools make), and a key `a` beside
`a/b`. Plain keys stay plain files; `a/` is `a/.s3gw-dir`, and `a` is `a/.s3gw-self` while
keys below `a/` exist (docs/stores/s3-and-file.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.stores import ObjectNotFound
from tests.support.stores import FileOrigin, list_all, read_all
from tests.support.writes import ATTRS, MIB, put, same_attrs, upload

pytestmark = pytest.mark.anyio


async def page(
    o: FileOrigin, prefix: str = "", delimiter: str | None = None
) -> tuple[list[str], list[str]]:
    listed = await o.store.list_page(prefix, delimiter)
    assert listed.next_token is None
    return [i.key for i in listed.objects], listed.common_prefixes


async def test_a_directory_marker_is_an_empty_object(tmp_path: Path) -> None:
    o = FileOrigin(tmp_path)
    await put(o, "ds/", b"")
    await put(o, "ds/part-0.parquet", b"p0")
    info = await o.store.stat("ds/")
    assert info.size == 0
    same_attrs(info, ATTRS)
    assert await read_all(o.store, "ds/") == b""
    assert (tmp_path / "ds" / ".s3gw-dir").is_file()
    assert (tmp_path / "ds" / "part-0.parquet").read_bytes() == b"p0"  # plain keys: plain files
    assert (await list_all(o.store))[0] == ["ds/", "ds/part-0.parquet"]  # pages of 3
    assert await page(o) == (["ds/", "ds/part-0.parquet"], [])
    assert await page(o, "", "/") == ([], ["ds/"])
    assert await page(o, "ds/", "/") == (["ds/", "ds/part-0.parquet"], [])
    await o.store.delete("ds/part-0.parquet")
    assert await page(o, "", "/") == ([], ["ds/"])  # the marker alone holds it
    await o.store.delete("ds/")
    with pytest.raises(ObjectNotFound):
        await o.store.stat("ds/")
    assert await page(o) == ([], [])
    assert not (tmp_path / "ds").exists()  # no empty folder left


async def test_a_marker_before_its_folder_and_on_a_file(tmp_path: Path) -> None:
    o = FileOrigin(tmp_path)
    await put(o, "x", b"plain x")
    await put(o, "x/", b"marker bytes")  # x becomes a folder keeping both
    assert await read_all(o.store, "x") == b"plain x"
    assert await read_all(o.store, "x/") == b"marker bytes"
    assert (await list_all(o.store))[0] == ["x", "x/"]


async def test_a_key_beside_keys_below_it(tmp_path: Path) -> None:
    o = FileOrigin(tmp_path)
    await put(o, "a", b"the a")
    await put(o, "a/b", b"the b")  # `a` moves into the folder it must become
    await put(o, "a-c", b"c")
    await put(o, "a0", b"0")
    assert await read_all(o.store, "a") == b"the a"
    same_attrs(await o.store.stat("a"), ATTRS)
    assert await read_all(o.store, "a/b") == b"the b"
    assert (await list_all(o.store))[0] == ["a", "a-c", "a/b", "a0"]
    assert await page(o, "", "/") == (["a", "a-c", "a0"], ["a/"])
    assert await page(o, "a", "/") == (["a", "a-c", "a0"], ["a/"])
    assert await page(o, "a/", "/") == (["a/b"], [])
    assert (await o.store.list_page(start_after="a")).objects[0].key == "a-c"
    await put(o, "a", b"the new a")  # an overwrite stays inside
    assert await read_all(o.store, "a") == b"the new a"
    await put(o, "a/b/c", b"deeper")  # and `a/b` becomes a folder in turn
    assert await read_all(o.store, "a/b") == b"the b"
    assert (await list_all(o.store, "a/"))[0] == ["a/b", "a/b/c"]

    await o.store.delete("a/b/c")
    await o.store.delete("a/b")
    assert (tmp_path / "a").is_file()  # the last key below gone: a plain file again
    assert await read_all(o.store, "a") == b"the new a"
    await o.store.delete("a")
    assert (await list_all(o.store))[0] == ["a-c", "a0"]


async def test_multipart_and_copy_onto_a_folder_key(tmp_path: Path) -> None:
    o = FileOrigin(tmp_path)
    await put(o, "m/inner", b"i")
    upload_id = await o.store.create_multipart("m", ATTRS)
    part = await upload(o, "m", upload_id, 1, os.urandom(MIB))
    await o.store.complete_multipart("m", upload_id, [part], ATTRS)
    assert (await o.store.stat("m")).size == MIB
    await o.store.copy("m/inner", "m/", None)
    assert await read_all(o.store, "m/") == b"i"
    assert (await list_all(o.store))[0] == ["m", "m/", "m/inner"]
