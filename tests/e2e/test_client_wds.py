"""WebDataset tar shards read through the gateway with `gw://` URLs (gateway/client/wds.py),
short-circuit and over HTTP, in a DataLoader with worker processes."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.utils.data
import webdataset as wds

import gateway.client.wds as gw_wds
from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, run_cli, start_gateway

SHARDS, PER_SHARD = 3, 20


def _sample(shard: int, i: int) -> bytes:
    return hashlib.sha256(f"{shard}/{i}".encode()).digest() * (100 + i)


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "files"
    (files / "train").mkdir(parents=True)
    for shard in range(SHARDS):
        with tarfile.open(files / "train" / f"shard-{shard:03d}.tar", "w") as tar:
            for i in range(PER_SHARD):
                for ext, data in (("bin", _sample(shard, i)), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"s{shard:03d}_{i:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    data = module_dir / "data"
    run_cli(data, None, "mount", "add", "shards", files.as_uri(), "-o", "metadata_ttl=-1")
    node = start_gateway(data, args=("--cache-block-size", "64KiB"))
    yield node
    node.stop()


def _expected() -> dict[str, tuple[bytes, int]]:
    return {
        f"s{s:03d}_{i:04d}": (_sample(s, i), i) for s in range(SHARDS) for i in range(PER_SHARD)
    }


@pytest.mark.parametrize("local", [True, False], ids=["short-circuit", "http"])
def test_a_webdataset_reads_gw_shards(node: GatewayNode, local: bool) -> None:
    options = {"endpoint_url": node.url, "key": ACCESS_KEY, "secret": SECRET_KEY}
    if local:
        options["local_socket"] = str(node.data_dir / "gateway.sock")
    gw_wds.register(**options)
    url = f"gw://shards/train/shard-{{000..{SHARDS - 1:03d}}}.tar"
    got = {s["__key__"]: (s["bin"], int(s["cls"])) for s in wds.WebDataset(url, shardshuffle=False)}
    assert got == _expected()
    stats = gw_wds.filesystem().stats
    if local:
        assert stats.short_circuit_reads > 0 and stats.http_reads == 0
    else:
        assert stats.http_reads > 0 and stats.short_circuit_reads == 0


def test_dataloader_workers_read_gw_shards(node: GatewayNode) -> None:
    gw_wds.register(
        endpoint_url=node.url, key=ACCESS_KEY, secret=SECRET_KEY,
        local_socket=str(node.data_dir / "gateway.sock"),
    )  # fmt: skip
    url = f"gw://shards/train/shard-{{000..{SHARDS - 1:03d}}}.tar"
    dataset = wds.WebDataset(url, shardshuffle=False, nodesplitter=None).to_tuple("__key__", "bin")
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    got = {key: data for key, data in loader}
    assert got == {k: v[0] for k, v in _expected().items()}


def test_gw_shards_are_opened_for_reading_only() -> None:
    with pytest.raises(ValueError, match="reading"):
        gw_wds.gopen_gw("gw://shards/train/shard-000.tar", "wb")
