"""The Azure Blob under-store: `az://account/container[/prefix]`, and the Hadoop forms
`abfs[s]://container@account.dfs.core.windows.net/prefix` and `wasb[s]://container@account.blob...`.
Reads and containers here; writes in azure_write; requests and headers in azure_auth."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncGenerator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import SplitResult, unquote

import httpx
from defusedxml import ElementTree

from gateway.stores.azure_auth import (
    AzureError,
    Found,
    Settings,
    Transport,
    etag_of,
    read_metadata,
    same_etag,
)
from gateway.stores.azure_write import AzureWrites
from gateway.stores.base import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    VersionChanged,
)

# Large enough that per-chunk overhead vanishes, small enough to start streaming early.
CHUNK_SIZE = 512 * 1024
# Azure answers at most this many entries a List Blobs call.
LIST_LIMIT = 5000

OPTIONS = frozenset(
    {"endpoint", "account_key", "sas_token", "max_attempts", "connect_timeout", "read_timeout",
     "retry_deadline"}
)  # fmt: skip

_ACCOUNT = re.compile(r"[a-z0-9]{3,24}\Z")
_CONTAINER = re.compile(r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]\Z")
_HADOOP_HOST = re.compile(r"(?P<account>[^.]+)\.(?:dfs|blob)\.(?P<suffix>.+)\Z")


def _utc(value: str) -> datetime:
    return parsedate_to_datetime(value).astimezone(UTC)


class AzureStore(AzureWrites):
    """Blobs under `prefix` in one container of one storage account.

    A mount prefix names a folder: 'az://acct/c/pre/fix' holds 'pre/fix/<key>', never
    'pre/fixture'. ETags are S3's: the MD5 (from Content-MD5, which Azure keeps base64) or
    the multipart form we keep in metadata; Azure's own ETag guards reads and writes.
    """

    scheme = "az"

    def __init__(
        self,
        account: str,
        container: str,
        prefix: str = "",
        options: Mapping[str, str] | None = None,
        default_endpoint: str | None = None,
    ) -> None:
        options = dict(options or {})
        unknown = set(options) - OPTIONS
        if unknown:
            raise ValueError(f"unknown azure store options: {', '.join(sorted(unknown))}")
        if options.get("account_key") and options.get("sas_token"):
            raise ValueError("azure store options take account_key or sas_token, not both")
        if not _ACCOUNT.match(account):
            raise ValueError(f"azure account name {account!r} is not 3-24 lowercase letters/digits")
        if not _CONTAINER.match(container):
            raise ValueError(f"azure container name {container!r} is not a valid container name")
        try:
            settings = Settings(
                max_attempts=int(options.get("max_attempts", 4)),
                connect_timeout=float(options.get("connect_timeout", 5)),
                read_timeout=float(options.get("read_timeout", 30)),
                retry_deadline=float(options.get("retry_deadline", 20)),
            )
        except ValueError:
            raise ValueError("azure max_attempts and timeouts must be numbers") from None
        if settings.max_attempts < 1 or min(settings.connect_timeout, settings.read_timeout) <= 0:
            raise ValueError("azure max_attempts must be >= 1 and timeouts > 0")
        if {".", ".."} & set(prefix.split("/")) or "\\" in prefix:
            raise ValueError(f"azure mount prefix {prefix!r} has '.', '..' or '\\' in it")
        endpoint = options.get("endpoint") or default_endpoint
        endpoint = endpoint or f"https://{account}.blob.core.windows.net"
        self.account = account
        self.container = container
        prefix = prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.http = Transport(
            endpoint, account, settings, options.get("account_key"), options.get("sas_token")
        )

    def __repr__(self) -> str:
        return (
            f"AzureStore(az://{self.account}/{self.container}/{self.prefix} at {self.http.origin})"
        )

    async def close(self) -> None:
        await self.http.close()

    # -- errors ------------------------------------------------------------------------------

    def _error(self, exc: AzureError, key: str) -> StoreError:
        """A read's typed error; messages carry the blob's place, never a credential."""
        where = f"az://{self.account}/{self.container}/{self.prefix}{key}"
        if exc.code == "ContainerNotFound":
            # The mount points at a container that is not there: a misconfiguration, not a miss.
            return StoreUnavailable(f"azure container {self.container!r} does not exist")
        if exc.status == 404:
            return ObjectNotFound(key)
        if exc.status in (401, 403):
            return StoreAccessDenied(f"{where}: {exc.code}")
        if exc.status == 412:
            return VersionChanged(f"{where}: ETag no longer matches")
        if exc.status >= 500 or exc.status in (408, 429):
            return StoreUnavailable(f"{where}: Azure answered {exc.status} {exc.code}")
        return StoreError(f"{where}: Azure answered {exc.status} {exc.code}")

    # -- stat and read -----------------------------------------------------------------------

    async def _find(self, key: str) -> Found:
        path = self._path(key, reading=True)
        try:
            response = await self.http.send("HEAD", path)
        except AzureError as exc:
            raise self._error(exc, key) from None
        return self._found(key, response.headers)

    def _found(self, key: str, h: httpx.Headers) -> Found:
        meta = {k[10:]: v for k, v in h.items() if k.lower().startswith("x-ms-meta-")}
        md5 = h.get("x-ms-blob-content-md5") or h.get("content-md5")
        total = h.get("content-range", "").rpartition("/")[2] or h.get("content-length", "0")
        user, expires, checksums = read_metadata(meta)
        info = ObjectInfo(
            key=key,
            size=int(total),
            etag=etag_of(meta, md5, h["etag"]),
            last_modified=_utc(h["last-modified"]),
            content_type=h.get("content-type"),
            content_encoding=h.get("content-encoding"),
            content_disposition=h.get("content-disposition"),
            content_language=h.get("content-language"),
            cache_control=h.get("cache-control"),
            expires=expires,
            metadata=user,
            checksums=checksums,
        )
        return Found(info, h["etag"])

    async def stat(self, key: str) -> ObjectInfo:
        return (await self._find(key)).info

    async def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        if end is not None and end <= start:
            # No bytes to send, but a missing key or a changed version must still be reported.
            await self._check(key, if_match)
            return
        headers = {}
        # No range for the whole object: Azure answers 416 to any range of an empty blob.
        if start > 0 or end is not None:
            headers["x-ms-range"] = f"bytes={start}-{'' if end is None else end - 1}"
        path = self._path(key, reading=True)
        try:
            response = await self.http.send("GET", path, headers=headers, stream=True)
        except AzureError as exc:
            if exc.status == 416:
                # The range starts at or past the end, so [start, end) is empty; the blob is
                # there, but a version asked for must still be checked.
                if if_match is not None:
                    await self._check(key, if_match)
                return
            raise self._error(exc, key) from None
        try:
            # Checked on this very answer, so the bytes that follow are of the version asked
            # for: our ETag is not Azure's, and an If-Match with ours would always fail.
            if if_match is not None and not same_etag(
                self._found(key, response.headers).info.etag, if_match
            ):
                raise VersionChanged(f"{key}: is no longer {if_match}")
            chunks = response.aiter_raw(CHUNK_SIZE)
            while True:
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except httpx.TransportError as exc:
                    raise StoreUnavailable(f"{key}: read cut short: {type(exc).__name__}") from None
                yield chunk
        finally:
            # Closes the connection rather than pooling it when the body was not read to the end.
            await response.aclose()

    async def _check(self, key: str, if_match: str | None) -> None:
        info = (await self._find(key)).info
        if if_match is not None and not same_etag(info.etag, if_match):
            raise VersionChanged(f"{key}: is no longer {if_match}")

    # -- list --------------------------------------------------------------------------------

    async def list_page(
        self,
        prefix: str = "",
        delimiter: str | None = None,
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        """Azure has no start-after, and its markers are opaque: entries up to start_after are
        skipped here, and each call asks for no more than it still needs, so that no answer
        has to be cut and Azure's own marker always resumes exactly after the last entry."""
        if max_keys <= 0:
            return ListPage([], [], None)
        marker, after = _untoken(token) if token else ("", start_after or "")
        skip = after.encode("utf-8", "surrogatepass")
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        while True:
            need = min(max_keys - len(objects) - len(prefixes), LIST_LIMIT)
            page, marker = await self._list_blobs(prefix, delimiter, marker, need)
            # Each entry on its own: a page's prefixes need not come in order with its blobs.
            for entry in page:
                name = entry if isinstance(entry, str) else entry.key
                if after and _utf8(name) <= skip:
                    continue
                if isinstance(entry, str):
                    prefixes.append(entry)
                else:
                    objects.append(entry)
            if not marker or len(objects) + len(prefixes) >= max_keys:
                # Azure sorts names by UTF-16 code units, S3 by UTF-8 bytes; they differ only
                # where a name has characters beyond U+FFFF, and only within a page is it ours.
                objects.sort(key=lambda o: _utf8(o.key))
                prefixes.sort(key=_utf8)
                return ListPage(objects, prefixes, _token(marker, after) if marker else None)

    async def _list_blobs(
        self, prefix: str, delimiter: str | None, marker: str, limit: int
    ) -> tuple[list[ObjectInfo | str], str]:
        query = [("restype", "container"), ("comp", "list"), ("include", "metadata")]
        query += [("prefix", self.prefix + prefix), ("maxresults", str(limit))]
        if delimiter:
            query.append(("delimiter", delimiter))
        if marker:
            query.append(("marker", marker))
        try:
            response = await self.http.send("GET", f"/{self.container}", query)
        except AzureError as exc:
            raise self._error(exc, prefix) from None
        try:
            root = ElementTree.fromstring(response.content)
        except ElementTree.ParseError as exc:
            raise StoreUnavailable(f"azure answered an unreadable listing: {exc}") from None
        cut = len(self.prefix)
        entries: list[ObjectInfo | str] = []
        blobs = root.find("Blobs")
        for element in blobs if blobs is not None else ():
            name = _name(element)
            if element.tag == "BlobPrefix":
                if delimiter and not name.endswith(delimiter) and name[-1:] == delimiter[0]:
                    # Azurite cuts a prefix one character after where a delimiter of several
                    # characters starts; Azure itself ends prefixes with the whole delimiter.
                    name = name[:-1] + delimiter
                entries.append(name[cut:])
            elif element.tag == "Blob":
                entries.append(self._listed(name[cut:], element))
        return entries, root.findtext("NextMarker") or ""

    def _listed(self, key: str, blob: Any) -> ObjectInfo:
        props = blob.find("Properties")
        found = blob.find("Metadata")
        meta = {m.tag: m.text or "" for m in (found if found is not None else ())}
        md5 = props.findtext("Content-MD5") or None
        return ObjectInfo(
            key=key,
            size=int(props.findtext("Content-Length") or 0),
            etag=etag_of(meta, md5, props.findtext("Etag") or ""),
            last_modified=_utc(props.findtext("Last-Modified")),
        )

    # -- the container itself ----------------------------------------------------------------

    def _whole_container(self) -> str:
        if self.prefix:
            raise ValueError(
                f"a container URI names no prefix: az://{self.account}/{self.container}"
            )
        return f"/{self.container}"

    async def create_container(self) -> None:
        path = self._whole_container()
        try:
            await self.http.send("PUT", path, [("restype", "container")])
        except AzureError as exc:
            if exc.code in ("ContainerAlreadyExists", "ContainerBeingDeleted"):
                raise ContainerExists(f"container {self.container!r} exists") from None
            raise self._error(exc, "") from None

    async def delete_container(self) -> None:
        """Azure deletes a container with all its blobs: we look first, so a blob written
        between the look and the delete goes with it (Azure has no delete-if-empty)."""
        path = self._whole_container()
        query = [("restype", "container"), ("comp", "list"), ("maxresults", "1")]
        try:
            r = await self.http.send("GET", path, query)
            if ElementTree.fromstring(r.content).find("Blobs/Blob") is not None:
                raise ContainerNotEmpty(f"container {self.container!r} is not empty")
            await self.http.send("DELETE", path, [("restype", "container")])
        except AzureError as exc:
            if exc.code in ("ContainerNotFound", "ContainerBeingDeleted"):
                raise ContainerNotFound(f"container {self.container!r} does not exist") from None
            raise self._error(exc, "") from None


def _utf8(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


def _name(element: Any) -> str:
    """A listed name; names with characters XML 1.0 cannot carry come percent-encoded."""
    name = element.find("Name")
    text = name.text or ""
    return unquote(text) if name.get("Encoded") == "true" else text


def _token(marker: str, after: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([marker, after]).encode()).decode()


def _untoken(token: str) -> tuple[str, str]:
    try:
        marker, after = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(marker), str(after)
    except (ValueError, TypeError):
        raise ValueError("not a continuation token of this store") from None


def open_azure(parts: SplitResult, options: Mapping[str, str]) -> AzureStore:
    """`az://account/container[/prefix]`; `abfs[s]://container@account.dfs.<suffix>/prefix`;
    `wasb[s]://container@account.blob.<suffix>/prefix`. Without an `endpoint` option, the
    Blob endpoint of the account in that cloud, always over HTTPS."""
    scheme = parts.scheme.lower()
    url = parts.geturl()
    if scheme == "az":
        if parts.username is not None or not parts.netloc:
            raise ValueError(f"azure URI {url!r} must be az://account/container[/prefix]")
        container, _, prefix = unquote(parts.path).lstrip("/").partition("/")
        return AzureStore(parts.netloc, container, prefix, options)
    host = _HADOOP_HOST.match(parts.hostname or "")
    if not parts.username or parts.password is not None or parts.port or host is None:
        raise ValueError(
            f"azure URI {url!r} must be {scheme}://container@account.dfs|blob.<suffix>/prefix"
        )
    endpoint = f"https://{host['account']}.blob.{host['suffix']}"
    return AzureStore(host["account"], parts.username, unquote(parts.path), options, endpoint)
