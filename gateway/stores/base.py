"""The one small interface every under-store implements (fsspec-style primitives).

Keys given to a store are relative to the mount; the store joins them with its own
root or prefix. Nothing here knows about HTTP requests from clients.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store knows of one object version."""

    key: str
    size: int
    etag: str  # quoted, exactly as S3 sends it: '"abc..."'
    last_modified: datetime  # timezone-aware, UTC
    content_type: str | None = None
    content_encoding: str | None = None
    content_disposition: str | None = None
    content_language: str | None = None
    cache_control: str | None = None
    expires: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)  # x-amz-meta-* without the prefix
    storage_class: str = "STANDARD"


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a listing; keys and prefixes are relative to the mount, sorted by UTF-8 bytes."""

    objects: list[ObjectInfo]
    common_prefixes: list[str]
    next_token: str | None  # None: the listing is complete


class StoreError(Exception):
    """Base of the typed errors every store raises instead of its client's own exceptions."""


class ObjectNotFound(StoreError):
    """The key does not exist (or is a directory, for file-like stores)."""


class StoreAccessDenied(StoreError):
    """The store refused our credentials for this operation."""


class StoreUnavailable(StoreError):
    """The store could not be reached or answered with a server error; retrying may help."""


class VersionChanged(StoreError):
    """The object no longer has the ETag the reader asked for (it was overwritten)."""


class Store(abc.ABC):
    """An under-store: stat, ranged read as an async byte stream, list page."""

    scheme: str = ""

    @abc.abstractmethod
    async def stat(self, key: str) -> ObjectInfo:
        """Metadata of one object; ObjectNotFound if there is none."""

    @abc.abstractmethod
    def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the object (end None: to the end), as they arrive.

        With `if_match`, raise VersionChanged rather than return bytes of another version.
        Callers close the iterator (contextlib.aclosing) when they stop early.
        """

    @abc.abstractmethod
    async def list_page(
        self,
        prefix: str = "",
        delimiter: str | None = None,
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        """Up to max_keys entries (objects and common prefixes together) after token/start_after."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the store is not used afterwards."""
