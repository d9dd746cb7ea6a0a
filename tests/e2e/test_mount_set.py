"""`gateway mount set`: a mount's options changed in place, its cache kept, the new options
checked as `mount add` checks them and served by the node from its next refresh."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.gateway import run_cli, start_gateway
from tests.support.net import eventually


def _options(data: Path) -> dict[str, str]:
    rows = json.loads(run_cli(data, None, "mount", "list", "--json").stdout)
    options: dict[str, str] = rows[0]["options"]
    return options


def test_mount_set_changes_options_in_place(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "obj").write_bytes(b"old" * 100)
    data = tmp_path / "data"
    run_cli(data, None, "mount", "add", "dset", files.as_uri(), "-o", "metadata_ttl=600")
    node = start_gateway(data)
    try:
        s3 = node.client()
        assert s3.get_object(Bucket="dset", Key="obj")["Body"].read() == b"old" * 100
        (files / "obj").write_bytes(b"new" * 200)
        # Within the TTL the cached version is served: the mount's option is in force.
        assert s3.get_object(Bucket="dset", Key="obj")["Body"].read() == b"old" * 100

        bad = node.cli("mount", "set", "dset", "-o", "metadata_ttl=soon", check=False)
        assert bad.returncode != 0 and _options(data) == {"metadata_ttl": "600"}
        unknown = node.cli("mount", "set", "dset", "-o", "no_such_option=1", check=False)
        assert unknown.returncode != 0 and _options(data) == {"metadata_ttl": "600"}
        missing = node.cli("mount", "set", "nope", "-o", "metadata_ttl=0", check=False)
        assert missing.returncode != 0 and "not mounted" in missing.stderr
        assert node.cli("mount", "set", "dset", check=False).returncode != 0  # nothing to change

        out = node.cli("mount", "set", "dset", "-o", "metadata_ttl=0")
        assert "changed dset" in out.stdout and _options(data) == {"metadata_ttl": "0"}
        eventually(
            lambda: s3.get_object(Bucket="dset", Key="obj")["Body"].read() == b"new" * 200,
            timeout=15,
        )
        node.cli("mount", "set", "dset", "--unset", "metadata_ttl")
        assert _options(data) == {}
        assert s3.list_objects_v2(Bucket="dset")["KeyCount"] == 1  # the same mount, still served
    finally:
        node.stop()
