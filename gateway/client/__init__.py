"""A client for training jobs: an fsspec filesystem (`gw://bucket/key`) and a map-style dataset
for PyTorch's DataLoader, with short-circuit reads of the node's cache files on its host.
docs/client.md."""

from gateway.client.dataset import GatewayDataset
from gateway.client.fs import GatewayFileSystem
from gateway.client.stats import ClientStats

__all__ = ["ClientStats", "GatewayDataset", "GatewayFileSystem"]
