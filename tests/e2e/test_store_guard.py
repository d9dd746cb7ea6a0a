"""The gateway's own files stay out of its mounts: a file mount (or a bucket store) whose folder
holds the data dir or the cache dir, or lies inside one, would let clients read `gateway.db`
and `secret.key` and write over them. `gateway mount add` refuses such a mount, a node refuses
one it finds in the database (and serves the others), and a node refuses such a bucket store."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, run_cli, start_gateway
from tests.support.net import eventually
from tests.support.postgres import temp_database


@pytest.mark.parametrize("where", ["holds the data dir", "inside the cache dir", "symlink"])
def test_mount_add_refuses_a_folder_of_the_gateways_own_files(tmp_path: Path, where: str) -> None:
    data = tmp_path / "srv" / "data"
    data.mkdir(parents=True)
    (data / "cache" / "blocks").mkdir(parents=True)
    folder = {
        "holds the data dir": tmp_path / "srv",
        "inside the cache dir": data / "cache" / "blocks",
        "symlink": tmp_path / "link",
    }[where]
    if where == "symlink":
        folder.symlink_to(tmp_path / "srv")
    out = run_cli(data, None, "mount", "add", "leak", folder.as_uri(), check=False)
    assert out.returncode != 0
    message = " ".join(out.stderr.split())
    assert ("cache dir" if where == "inside the cache dir" else "data dir") in message
    # Nothing was mounted (and no node was made by the refused command to list it).
    listed = run_cli(data, None, "mount", "list", check=False)
    assert "leak" not in listed.stdout


def test_mount_add_takes_a_folder_beside_the_data_dir(tmp_path: Path) -> None:
    data, beside = tmp_path / "data", tmp_path / "share"
    beside.mkdir()
    run_cli(data, None, "mount", "add", "share", beside.as_uri())
    assert "share" in run_cli(data, None, "mount", "list").stdout


def test_node_serves_none_of_its_own_files_through_a_mount_found_in_the_database(
    tmp_path: Path,
) -> None:
    """Mounts another machine's CLI added to the fleet's database: it checked its own data dir,
    not this node's."""
    data, cache = tmp_path / "srv" / "data", tmp_path / "ssd" / "cache"
    fine = tmp_path / "fine"
    fine.mkdir()
    (fine / "a.txt").write_bytes(b"served")
    (cache / "area").mkdir(parents=True)
    elsewhere = tmp_path / "cli"
    with temp_database() as db:
        for bucket, folder in (("leak", tmp_path / "srv"), ("blocks", cache / "area")):
            # Unchecked: the folder of the node to be (its data dir) is not there yet.
            run_cli(elsewhere, db, "mount", "add", bucket, folder.as_uri(), "--no-check")
        node = start_gateway(data, database_url=db, args=("--cache-dir", str(cache)))
        _serves_the_others(node, elsewhere, db, tmp_path)
    assert not (data / "secret.key").exists()  # the key came from the environment: none written


def _serves_the_others(node: GatewayNode, elsewhere: Path, db: str, tmp_path: Path) -> None:
    fine = tmp_path / "fine"
    try:
        s3 = node.client()
        run_cli(elsewhere, db, "mount", "add", "fine", fine.as_uri())
        eventually(lambda: s3.get_object(Bucket="fine", Key="a.txt")["Body"].read() == b"served")
        for bucket, key in (("leak", "data/gateway.db"), ("blocks", "x")):
            with pytest.raises(ClientError) as exc:
                s3.get_object(Bucket=bucket, Key=key)
            assert exc.value.response["Error"]["Code"] == "NoSuchBucket"
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket="leak", Key="data/secret.key", Body=b"attacker's key")
        assert exc.value.response["Error"]["Code"] == "NoSuchBucket"
        assert "leak" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
        # Said once each, with why, not at every refresh of the mount table: a mount added
        # later is served, so refreshes went on meanwhile.
        (tmp_path / "later").mkdir()
        run_cli(elsewhere, db, "mount", "add", "later", (tmp_path / "later").as_uri())
        eventually(lambda: s3.list_objects_v2(Bucket="later")["KeyCount"] == 0)
        log = node.log()
        processes = max(1, len(node.workers()))  # each worker says it, once
        assert 1 <= log.count("mount leak") <= processes
        assert "contains the gateway's data dir" in log
        assert 1 <= log.count("mount blocks") <= processes
        assert "inside the gateway's cache dir" in log
    finally:
        node.stop()


def test_node_refuses_a_bucket_store_over_its_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "srv" / "data"
    with pytest.raises(RuntimeError) as exc:
        start_gateway(data, args=("--bucket-store", (tmp_path / "srv").as_uri()))
    assert "bucket_store" in str(exc.value) and "contains the gateway's data dir" in str(exc.value)


def test_create_bucket_in_a_bucket_store_beside_the_data_dir(tmp_path: Path) -> None:
    node: GatewayNode = start_gateway(
        tmp_path / "data", args=("--bucket-store", (tmp_path / "buckets").as_uri())
    )
    try:
        s3 = node.client()
        name = f"b-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=name)
        s3.put_object(Bucket=name, Key="k", Body=b"v")
        assert (tmp_path / "buckets" / name / "k").read_bytes() == b"v"
    finally:
        node.stop()
