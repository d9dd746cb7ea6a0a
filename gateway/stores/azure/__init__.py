"""The az:// store (also abfs://, wasb://): a container (and prefix) of Azure Blob Storage."""

from gateway.stores.azure.store import CHUNK_SIZE, AzureStore, open_azure

__all__ = ["CHUNK_SIZE", "AzureStore", "open_azure"]
