"""The Azure Blob under-store: `az://account/container[/prefix]`, and the Hadoop forms
`abfs[s]://container@account.dfs.core.windows.net/prefix` and `wasb[s]://container@account.blob...`.
The blob client in `blobs` (over the requests of `wire`), writes and containers in `writes`,
headers and metadata in `metadata`; listing here."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import SplitResult, unquote

from defusedxml import ElementTree

from gateway.stores.azure.blobs import CHUNK_SIZE, Blobs, utc
from gateway.stores.azure.metadata import etag_of
from gateway.stores.azure.wire import AzureError, Settings, Transport
from gateway.stores.azure.writes import Writes
from gateway.stores.base import ListPage, ListRequest, ObjectInfo, StoreUnavailable
from gateway.stores.delegating import DelegatingStore
from gateway.stores.retry import SYSTEM_CLOCK, Clock

__all__ = ["CHUNK_SIZE", "AzureStore", "open_azure"]

# Azure answers at most this many entries a List Blobs call.
LIST_LIMIT = 5000

OPTIONS = frozenset(
    {"endpoint", "account_key", "sas_token", "max_attempts", "connect_timeout", "read_timeout",
     "retry_deadline"}
)  # fmt: skip

_ACCOUNT = re.compile(r"[a-z0-9]{3,24}\Z")
_CONTAINER = re.compile(r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]\Z")
_HADOOP_HOST = re.compile(r"(?P<account>[^.]+)\.(?:dfs|blob)\.(?P<suffix>.+)\Z")


class AzureStore(DelegatingStore):
    """Blobs under `prefix` in one container of one storage account.

    A mount prefix names a folder: 'az://acct/c/pre/fix' holds 'pre/fix/<key>', never
    'pre/fixture'. ETags are S3's: the MD5 (from Content-MD5, which Azure keeps base64) or
    the multipart form we keep in metadata; Azure's own ETag guards reads and writes.
    """

    scheme = "az"
    writes: Writes

    def __init__(
        self,
        account: str,
        container: str,
        prefix: str = "",
        options: Mapping[str, str] | None = None,
        default_endpoint: str | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
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
            endpoint,
            account,
            settings,
            options.get("account_key"),
            options.get("sas_token"),
            clock,
        )
        self.blobs = Blobs(account, container, self.prefix, self.http)
        self.writes = self.uploads = Writes(self.blobs)

    def __repr__(self) -> str:
        return repr(self.blobs)

    async def close(self) -> None:
        await self.http.close()

    # -- stat and read -----------------------------------------------------------------------

    async def stat(self, key: str) -> ObjectInfo:
        return (await self.blobs.find(key)).info

    def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        return self.blobs.read(key, start, end, if_match)

    # -- list --------------------------------------------------------------------------------

    async def get_tags(self, key: str, version_id: str | None = None) -> dict[str, str]:
        return await self.writes.get_tags(key, version_id)

    async def put_tags(
        self, key: str, tags: Mapping[str, str], version_id: str | None = None
    ) -> None:
        await self.writes.put_tags(key, tags, version_id)

    async def _list_page(self, q: ListRequest) -> ListPage:
        """Azure has no start-after, and its markers are opaque: entries up to start_after are
        skipped here, and each call asks for no more than it still needs, so that no answer
        has to be cut and Azure's own marker always resumes exactly after the last entry."""
        prefix, delimiter, max_keys = q.prefix, q.delimiter, q.max_keys
        marker, after = _untoken(q.token) if q.token else ("", q.start_after or "")
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
            raise self.blobs.error(exc, prefix) from None
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
            last_modified=utc(props.findtext("Last-Modified")),
        )


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


def open_azure(
    parts: SplitResult, options: Mapping[str, str], *, clock: Clock = SYSTEM_CLOCK
) -> AzureStore:
    """`az://account/container[/prefix]`; `abfs[s]://container@account.dfs.<suffix>/prefix`;
    `wasb[s]://container@account.blob.<suffix>/prefix`. Without an `endpoint` option, the
    Blob endpoint of the account in that cloud, always over HTTPS. `clock` times the retries."""
    scheme = parts.scheme.lower()
    url = parts.geturl()
    if scheme == "az":
        if parts.username is not None or not parts.netloc:
            raise ValueError(f"azure URI {url!r} must be az://account/container[/prefix]")
        container, _, prefix = unquote(parts.path).lstrip("/").partition("/")
        return AzureStore(parts.netloc, container, prefix, options, clock=clock)
    host = _HADOOP_HOST.match(parts.hostname or "")
    if not parts.username or parts.password is not None or parts.port or host is None:
        raise ValueError(
            f"azure URI {url!r} must be {scheme}://container@account.dfs|blob.<suffix>/prefix"
        )
    endpoint = f"https://{host['account']}.blob.{host['suffix']}"
    prefix = unquote(parts.path)
    return AzureStore(host["account"], parts.username, prefix, options, endpoint, clock=clock)
