"""A WebHDFS server for tests, written from the Apache Hadoop WebHDFS REST API specification
and the NameNode/DataNode handlers it describes: a NameNode port that answers metadata
operations and redirects OPEN, CREATE, APPEND and GETFILECHECKSUM with 307 to a distinct
DataNode port, which moves the bytes. The namespace lives in `webhdfs_fs`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from gateway.stores import open_store
from tests.support.stores import MOUNT_PREFIX, Origin
from tests.support.webhdfs_fs import Namespace, RemoteError, decode_value

PREFIX = "/webhdfs/v1"
_CHUNK = 1 << 20
GET_OPS = {
    "OPEN", "GETFILESTATUS", "LISTSTATUS", "LISTSTATUS_BATCH", "GETCONTENTSUMMARY",
    "GETFILECHECKSUM", "GETHOMEDIRECTORY", "GETXATTRS", "GETSERVERDEFAULTS", "LISTXATTRS",
    "GETACLSTATUS", "GETTRASHROOT", "CHECKACCESS", "GETDELEGATIONTOKEN",
}  # fmt: skip
PUT_OPS = {"CREATE", "MKDIRS", "RENAME", "SETXATTR", "REMOVEXATTR", "SETPERMISSION", "SETTIMES"}
POST_OPS = {"APPEND", "CONCAT", "TRUNCATE"}
WRITES = {"CREATE", "MKDIRS", "RENAME", "SETXATTR", "APPEND", "CONCAT", "DELETE"}
SERVER_DEFAULTS = {
    "FsServerDefaults": {
        "blockSize": 134217728,
        "bytesPerChecksum": 512,
        "writePacketSize": 65536,
        "replication": 3,
        "fileBufferSize": 4096,
        "encryptDataTransfer": False,
        "trashInterval": 0,
        "checksumType": 1,  # CRC32, which GETFILECHECKSUM reports
        "keyProviderUri": "",
        "defaultStoragePolicyId": 7,
    }
}


class _Unauthorized(Exception):
    """Security is on and the request carries no delegation token: SPNEGO would be next."""


class _Http(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, owner: WebHdfsServer, port: int, role: str) -> None:
        self.owner, self.role = owner, role
        super().__init__(("127.0.0.1", port), _Handler)


class WebHdfsServer:
    """NameNode and DataNode on 127.0.0.1 over `root`; see the module docstring.

    `requests` logs (port, method, op, path) of every request, `queries` its parameters.
    `batch_size` is dfs.ls.limit (LISTSTATUS_BATCH entries per answer); `readers`/`writers`
    limit which users may read/write (None: anyone); `tokens` maps delegation tokens to users;
    `secure` refuses requests without a token, as a Kerberos cluster without SPNEGO would.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        batch_size: int = 1000,
        xattrs: bool = True,
        readers: set[str] | None = None,
        writers: set[str] | None = None,
        tokens: Mapping[str, str] | None = None,
        secure: bool = False,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fs = Namespace(self.root, xattrs)
        self.batch_size = batch_size
        self.readers, self.writers = readers, writers
        self.tokens = dict(tokens or {})
        self.secure = secure
        self.requests: list[tuple[int, str, str, str]] = []
        self.queries: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._faults: list[tuple[int, str | None, str | None]] = []
        self._connections: set[socket.socket] = set()
        self._servers: list[_Http] = []
        self.port = self.datanode_port = 0
        self.start()

    @property
    def url(self) -> str:
        return f"hdfs://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        namenode = _Http(self, self.port, "namenode")
        datanode = _Http(self, self.datanode_port, "datanode")
        self.port, self.datanode_port = namenode.server_port, datanode.server_port
        self._servers = [namenode, datanode]
        for server in self._servers:
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        """Stop listening and cut every open connection, as a crashed server would."""
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers = []
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def restart(self) -> None:
        """Listen again on the same two ports."""
        self.stop()
        self.start()

    def fail_next(
        self, count: int, status: int = 503, exception: str | None = None, op: str | None = None
    ) -> None:
        """Answer the next `count` requests (either port; with `op`, only requests of that op)
        with `status`; with `exception`, as that RemoteException (e.g. 403 RetriableException,
        as a NameNode in safe mode)."""
        with self._lock:
            self._faults += [(status, exception, op)] * count

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.queries.clear()

    def ops(self, port: int | None = None) -> list[str]:
        with self._lock:
            return [op for p, _, op, _ in self.requests if port is None or p == port]

    def _take_fault(self, op: str) -> tuple[int, str | None] | None:
        with self._lock:
            for i, (status, exception, only) in enumerate(self._faults):
                if only is None or only == op:
                    del self._faults[i]
                    return status, exception
            return None

    def _log(self, port: int, method: str, op: str, path: str, params: dict[str, str]) -> None:
        with self._lock:
            self.requests.append((port, method, op, path))
            self.queries.append(params)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle on, the second waits for a delayed ACK.
    disable_nagle_algorithm = True
    server: _Http

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, True)

    def finish(self) -> None:
        self.server.owner._track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log is `requests`

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- plumbing ----------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        owner, role = self.server.owner, self.server.role
        # http.server decodes the request line as Latin-1; Hadoop's client sends non-ASCII path
        # characters as raw UTF-8, which Jetty reads as UTF-8.
        split = urlsplit(self.path.encode("latin-1").decode("utf-8", "replace"))
        if not split.path.startswith(PREFIX):
            self._drain()
            return self._reply(404, b"Not Found", "text/plain")
        path = unquote(split.path[len(PREFIX) :]) or "/"
        # ParamFilter: parameter names are case-insensitive; the op's value too.
        params = {k.lower(): v for k, v in parse_qsl(split.query, keep_blank_values=True)}
        op = params.get("op", "").upper()
        owner._log(self.server.server_port, method, op, path, params)
        self._body_started = False
        fault = owner._take_fault(op)
        try:
            if fault is not None:
                self._drain()
                status, exception = fault
                if exception is None:
                    return self._reply(status, b"Service Unavailable (injected)", "text/plain")
                raise RemoteError(exception, f"{exception} (injected)")
            user = self._user(params)
            if role == "datanode":
                return self._datanode(method, op, path, params, user)
            self._drain()
            self._namenode(method, op, path, params, user)
        except _Unauthorized:
            self._reply(401, b"<html><body>Authentication required</body></html>", "text/html",
                        {"WWW-Authenticate": "Negotiate"})  # fmt: skip
        except RemoteError as exc:
            if role == "datanode" and not self._body_started:
                # Read what the client sends before answering, so that closing the connection
                # does not reset it before the client has read the error.
                with contextlib.suppress(EOFError, OSError, ValueError):
                    self._drain()
            self._json(exc.status, exc.body(), close=role == "datanode")

    def _user(self, params: dict[str, str]) -> str:
        owner = self.server.owner
        token = params.get("delegation")
        if token:
            user = owner.tokens.get(token)
            if user is None:
                raise RemoteError("InvalidToken", "token can't be found in cache")
            return user
        if owner.secure:
            raise _Unauthorized()
        return params.get("user.name") or "dr.who"  # hadoop.http.staticuser.user

    def _allow(self, user: str, op: str, path: str) -> None:
        owner = self.server.owner
        wanted = owner.writers if op in WRITES else owner.readers
        if wanted is not None and user not in wanted:
            access = "WRITE" if op in WRITES else "READ"
            raise RemoteError(
                "AccessControlException",
                f'Permission denied: user={user}, access={access}, inode="{path}"'
                ":hdfs:supergroup:drwxr-xr-x",
            )

    def _drain(self) -> None:
        for _ in self._body():
            pass

    def _body(self) -> Iterator[bytes]:
        """The request body as it arrives (Content-Length or chunked); EOFError if cut short."""
        self._body_started = True
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                left = size
                while left:
                    data = self.rfile.read(min(left, _CHUNK))
                    if not data:
                        raise EOFError("chunked body cut short")
                    left -= len(data)
                    yield data
                self.rfile.readline()
        left = int(self.headers.get("Content-Length") or 0)
        while left:
            data = self.rfile.read1(min(left, _CHUNK))
            if not data:
                raise EOFError("body cut short")
            left -= len(data)
            yield data

    def _reply(
        self,
        status: int,
        body: bytes,
        ctype: str | None,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: object, close: bool = False) -> None:
        self._reply(status, json.dumps(doc).encode(), "application/json", close=close)

    # -- NameNode ------------------------------------------------------------------------------

    def _namenode(self, method: str, op: str, path: str, p: dict[str, str], user: str) -> None:
        fs = self.server.owner.fs
        known = {"GET": GET_OPS, "PUT": PUT_OPS, "POST": POST_OPS, "DELETE": {"DELETE"}}[method]
        if op not in known:
            kind = {"GET": "Get", "PUT": "Put", "POST": "Post", "DELETE": "Delete"}[method]
            raise RemoteError(
                "IllegalArgumentException",
                f'Invalid value for webhdfs parameter "op": No enum constant '
                f"org.apache.hadoop.hdfs.web.resources.{kind}OpParam.Op.{op}",
            )
        self._allow(user, op, path)
        if op in ("OPEN", "GETFILECHECKSUM", "APPEND"):
            status = fs.status(path) if fs.local(path).exists() else None
            if status is None:
                raise RemoteError("FileNotFoundException", f"File {path} not found.")
            offset, length = int(p.get("offset") or 0), status["length"]
            if op == "OPEN" and (offset < 0 or (offset >= length > 0)):
                raise RemoteError(
                    "IOException",
                    f"Offset={offset} out of the range [0, {length}); OPEN, path={path}",
                )
            return self._redirect(op, path, p, user)
        if op == "CREATE":
            return self._redirect(op, path, p, user)
        result: object = None
        with fs.lock:
            if op == "GETFILESTATUS":
                result = {"FileStatus": fs.status(path)}
            elif op in ("LISTSTATUS", "LISTSTATUS_BATCH"):
                result = self._list(op, path, p.get("startafter", ""))
            elif op == "GETXATTRS":
                encoding = p.get("encoding")
                if not encoding:
                    raise RemoteError(
                        "IllegalArgumentException",
                        "Required param encoding for op: GETXATTRS is null or empty",
                    )
                query = urlsplit(self.path.encode("latin-1").decode("utf-8", "replace")).query
                names = [v for k, v in parse_qsl(query) if k == "xattr.name"]
                result = fs.get_xattrs(path, names, encoding)
            elif op == "GETCONTENTSUMMARY":
                result = fs.content_summary(path)
            elif op == "GETHOMEDIRECTORY":
                result = {"Path": f"/user/{user}"}
            elif op == "GETSERVERDEFAULTS":
                result = SERVER_DEFAULTS
            elif op == "MKDIRS":
                result = {"boolean": fs.mkdirs(path)}
            elif op == "RENAME":
                result = self._rename(path, p)
            elif op == "DELETE":
                result = {"boolean": fs.delete(path, p.get("recursive", "false") == "true")}
            elif op == "CONCAT":
                sources = [s for s in p.get("sources", "").split(",") if s]
                if not sources:
                    raise RemoteError(
                        "IllegalArgumentException",
                        "Required param sources for op: CONCAT is null or empty",
                    )
                fs.concat(path, sources)
            elif op == "SETXATTR":
                flags = {f.strip().upper() for f in p.get("flag", "").split(",") if f.strip()}
                if "xattr.name" not in p or not flags:
                    raise RemoteError(
                        "IllegalArgumentException",
                        "Required param xattr.name for op: SETXATTR is null or empty",
                    )
                fs.set_xattr(path, p["xattr.name"], decode_value(p.get("xattr.value")), flags)
            else:
                raise RemoteError("UnsupportedOperationException", f"{op} is not supported")
        if result is None:
            return self._reply(200, b"", None)
        self._json(200, result)

    def _list(self, op: str, path: str, start_after: str) -> object:
        fs, limit = self.server.owner.fs, self.server.owner.batch_size
        if op == "LISTSTATUS_BATCH":
            entries, remaining = fs.listing(path, start_after, limit)
            return {
                "DirectoryListing": {
                    "partialListing": {"FileStatuses": {"FileStatus": entries}},
                    "remainingEntries": remaining,
                }
            }
        # LISTSTATUS pages through getListing itself and answers the whole directory.
        everything, after = [], ""
        while True:
            entries, remaining = fs.listing(path, after, limit)
            everything += entries
            if not remaining or not entries:
                return {"FileStatuses": {"FileStatus": everything}}
            after = entries[-1]["pathSuffix"]

    def _rename(self, path: str, p: dict[str, str]) -> object:
        fs = self.server.owner.fs
        destination = p.get("destination")
        if not destination:
            raise RemoteError(
                "IllegalArgumentException",
                "Required param destination for op: RENAME is null or empty",
            )
        options = {o.strip().upper() for o in p.get("renameoptions", "").split(",") if o.strip()}
        if not options:
            return {"boolean": fs.rename(path, destination)}
        fs.rename2(path, destination, "OVERWRITE" in options)
        return None

    def _redirect(self, op: str, path: str, p: dict[str, str], user: str) -> None:
        """307 to the DataNode, with the query NamenodeWebHdfsMethods.redirectURI builds."""
        owner = self.server.owner
        auth = {"delegation": p["delegation"]} if p.get("delegation") else {"user.name": user}
        passed = {
            k: v for k, v in p.items() if k in ("offset", "length", "overwrite", "buffersize")
        }
        query = {"op": op, **auth, "namenoderpcaddress": f"127.0.0.1:{owner.port}"}
        query.update(sorted(passed.items()))
        location = (
            f"http://127.0.0.1:{owner.datanode_port}{PREFIX}{quote(path, safe='/')}"
            f"?{urlencode(query, quote_via=quote)}"
        )
        if p.get("noredirect", "false").lower() == "true":
            return self._json(200, {"Location": location})
        self._reply(307, b"", "application/octet-stream", {"Location": location})

    # -- DataNode ------------------------------------------------------------------------------

    def _datanode(self, method: str, op: str, path: str, p: dict[str, str], user: str) -> None:
        fs = self.server.owner.fs
        if (method, op) in (("PUT", "CREATE"), ("POST", "APPEND")):
            self._allow(user, op, path)
            # WebHdfsHandler answers 100 Continue first, whether or not the client asked.
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            if op == "CREATE":
                out = fs.create(path, p.get("overwrite", "false").lower() == "true")
            else:
                out = fs.append(path)
            if not self._receive(out):
                return
            if op == "CREATE":
                location = {"Location": f"hdfs://127.0.0.1:{self.server.owner.port}{path}"}
                return self._reply(201, b"", None, location, close=True)
            return self._reply(200, b"", None, close=True)
        self._drain()
        if method == "GET" and op == "OPEN":
            self._allow(user, op, path)
            return self._send_file(path, int(p.get("offset") or 0), p.get("length"))
        if method == "GET" and op == "GETFILECHECKSUM":
            self._allow(user, op, path)
            return self._json(200, fs.checksum(path), close=True)
        raise RemoteError("IllegalArgumentException", f"Invalid operation {op}")

    def _receive(self, out: BinaryIO) -> bool:
        """Write the body into the new file; False if the client went away. As HdfsWriter
        does, the file is closed either way: a cut upload leaves what arrived."""
        try:
            with out:
                for data in self._body():
                    out.write(data)
            return True
        except (EOFError, OSError, ValueError):
            self.close_connection = True
            return False

    def _send_file(self, path: str, offset: int, length: str | None) -> None:
        f, size = self.server.owner.fs.open_file(path, offset)
        with f:
            count = size - offset
            if length is not None and int(length) >= 0:
                count = min(count, int(length))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(count))
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            while count > 0:
                data = f.read(min(count, _CHUNK))
                if not data:
                    break
                self.wfile.write(data)
                count -= len(data)


class HdfsOrigin(Origin):
    """The contract's origin on a WebHdfsServer: objects put behind the gateway's back as
    files under the mount folder, seen through `hdfs://…/pre/fix`."""

    kind = "hdfs"

    def __init__(self, server: WebHdfsServer, options: Mapping[str, str] | None = None) -> None:
        self.server = server
        self.base = self.folder = server.root / MOUNT_PREFIX
        self.base.mkdir(parents=True, exist_ok=True)
        for decoy in ("pre/fixture", "pre/fi", "other/x"):  # next to the mount, never in it
            (server.root / decoy).parent.mkdir(parents=True, exist_ok=True)
            (server.root / decoy).write_bytes(b"decoy")
        opts = {"user": "tester", **(options or {})}
        self.store = open_store(f"{server.url}/{MOUNT_PREFIX}", opts)

    def put(self, key: str, data: bytes, content_type: str | None = None) -> None:
        # HDFS keeps no content type: the store guesses it from the name, as for files.
        path = self.base / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
