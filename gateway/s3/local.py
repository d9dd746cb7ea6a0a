"""Short-circuit reads: a Unix socket on which a client on this host is handed read-only file
descriptors of objects' cached blocks, so that it reads them with pread as local files
(HDFS's short-circuit local reads, for the gateway's page store). docs/client.md.

A connection is accepted only from a process whose uid is allowed (the socket's peer
credentials, SO_PEERCRED). The client then proves its access key once for the connection: it
answers the node's nonce with a presigned SigV4 GET of `/_gateway/short-circuit?nonce=...`,
verified as any presigned URL. After that, requests name a bucket and many keys, with no
signature of their own; whether the connection's key may read each (bucket, key) is decided
by ONE function, `may_read`, per key (`may_read_all`, the same decision for a request's
keys). The answer gives, for each key, the version (ETag, size), how long the client may
trust it (what is left of the mount's metadata TTL for it) and, for each block this node
holds, its length, with the descriptors attached (SCM_RIGHTS; an answer too large for one
message, past 253 descriptors, comes as several). Blocks not cached are fetched first, the
keys of a request FETCHES at a time (one fetch for concurrent readers, as for HTTP); blocks of
peers are not handed over (the client reads them over HTTP).

Messages, both ways: a 4-byte big-endian length, then that many bytes of JSON.
  node, on connecting:  {"v": 2, "nonce": "..."}
                        or {"error": "AccessDenied", ..., "scope": "uid"} (uid refused)
  client, first:        {"hello": "/_gateway/short-circuit?nonce=...&X-Amz-...", "host": "..."}
  node:                 {"key": "<access key>"}, or an error with "scope": "connection" (and
                        the connection is closed)
  client, then:         {"bucket": "...", "keys": ["...", ...], "first": 0, "count": 64}
  node:                 {"objects": [<object>, ...], "more": true|false}, repeated while "more";
                        "count": 0 asks for versions only (no descriptor, one message): a
                        client renews its leases with it, many keys a request; with
                        "fresh_for": s (at most half the TTL), versions the node knows fresh
                        for less than s are revalidated first (a renewal ahead of the lapse)
    <object>:           {"etag": ..., "size": ..., "block_size": ..., "ttl": ...,
                         "blocks": [[index, length], ...]}   (descriptors in this order;
                         no "blocks" when "count" is 0)
                        or {"error": "NoSuchKey", "status": 404, "message": "..."}
  or, for the request:  {"error": "InvalidRequest", "status": 400, "message": "..."}
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import resource
import secrets
import socket
import struct
from collections import Counter as Tally
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import parse_qsl

from prometheus_client import Counter

from gateway import errors
from gateway.counters import REGISTRY
from gateway.s3 import limits
from gateway.s3.sigv4 import SigV4Verifier
from gateway.service import LocalBlocks, S3Service

log = logging.getLogger(__name__)

HELLO_PATH = "/_gateway/short-circuit"  # what the client presigns to prove its key
MAX_MESSAGE = 1 << 20  # bytes of one request's JSON
MAX_KEYS = 1024  # keys in one request
MAX_BLOCKS = 64  # blocks of one object in one answer (the client asks again for more)
MAX_FDS = 253  # descriptors in one message (the kernel's SCM_MAX_FD)
# Files opened on the event loop rather than in a thread: an open of a cached block file
# costs ~6-10 us of CPU, a thread hop ~50-200 us (measured on 2 busy cores), so a few opens
# are cheaper inline, and a request of many pays one hop for all of them.
INLINE_OPENS = 16
# Keys of one request fetched into the cache at once (each a store request, and a block held
# in memory while it fills): a batch of keys never read, one after another, cost a store
# round trip each in turn (21 objects/s over a 20 ms WAN).
FETCHES = 32
_UCRED = struct.Struct("3i")  # pid, uid, gid
# A connection that has not proved its key within this long is closed: an idle connection
# holds a descriptor of the node's.
HELLO_TIMEOUT = 10.0
# Connections one uid may hold at once (a DataLoader holds one per worker process), and the
# share of the node's descriptors all connections together may hold: the rest is the node's
# own work (block files, the database, its HTTP clients, the janitor, metrics).
PER_UID = 64
SHARE_OF_DESCRIPTORS = 4  # at most 1/4 of RLIMIT_NOFILE
# accept() failing for want of descriptors or memory: the accept loop waits and goes on.
_SCARCE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

HANDED = Counter(
    "gateway_local_reads",
    "Short-circuit answers (objects) and refusals to clients on this host, by outcome",
    ["outcome"],
    registry=REGISTRY,
)
_HANDED, _NONE = HANDED.labels("handed"), HANDED.labels("none")


def may_read(service: S3Service, access_key: str, bucket: str, key: str) -> bool:
    """Whether the connection's access key may read (bucket, key) through the socket: THE one
    decision of short-circuit reads, per key, as for an HTTP GET: the key is still known (with
    the secret it proved), the bucket is mounted, and the key's user may s3:GetObject it
    (docs/tenants.md; a Unix socket has no source address, so a policy that asks for one
    refuses)."""
    return may_read_all(service, access_key, bucket, [key])[0]


def may_read_all(service: S3Service, access_key: str, bucket: str, keys: list[str]) -> list[bool]:
    """may_read() of each of many keys of one bucket: what does not depend on the key (the
    access key, the mount) decided once, the policy per key."""
    if service.secret_for(access_key) is None or not service.has_bucket(bucket):
        return [False] * len(keys)
    decisions = []
    for key in keys:
        try:
            service.authorize(access_key, "s3:GetObject", bucket, key, None)
        except errors.AccessDenied:
            decisions.append(False)
        else:
            decisions.append(True)
    return decisions


class LocalReads:
    """The node's short-circuit socket (see the module's docstring)."""

    def __init__(
        self,
        service: S3Service,
        verifier: SigV4Verifier,
        path: Path,
        allowed_uids: frozenset[int],
        *,
        hello_timeout: float = HELLO_TIMEOUT,
        per_uid: int = PER_UID,
    ) -> None:
        self._service = service
        self._verifier = verifier
        self.path = path
        self._uids = allowed_uids
        self._hello_timeout = hello_timeout
        self._per_uid = per_uid
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = soft if soft != resource.RLIM_INFINITY else 1 << 16
        self._max_connections = max(8, limit // SHARE_OF_DESCRIPTORS)
        self._held: Tally[int] = Tally()  # connections by uid
        # A descriptor kept for the moment accept() finds none: closed, it lets the accept
        # loop take one waiting connection and close it (else it would stay in the backlog).
        self._reserve: int | None = None
        self._sock: socket.socket | None = None
        self._lock: int | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self) -> bool:
        """Listen, unless another worker process of this node already does (one socket per
        node: the first worker to take its lock file serves it). Whether this one listens."""
        lock = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            return False
        self._lock = lock
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a socket file left by a node that is gone (we hold the lock)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o666)  # who may connect is the peer credentials' to say
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self._reserve = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._accepting = asyncio.create_task(self._accept())
        log.info("short-circuit reads on %s (uids %s)", self.path, sorted(self._uids))
        return True

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        for task in list(self._clients):
            task.cancel()
        if self._sock is not None:
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    async def _accept(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:
                if exc.errno not in _SCARCE:
                    raise
                HANDED.labels("no_descriptor").inc()
                log.warning("short-circuit: cannot accept a connection: %s", exc.strerror)
                self._shed()
                await asyncio.sleep(0.1)  # let the node's own work close what it holds
                continue
            task = asyncio.create_task(self._serve(conn))
            self._clients.add(task)
            task.add_done_callback(self._clients.discard)

    def _shed(self) -> None:
        """With the reserve descriptor, take one waiting connection and close it: its client
        sees the connection end (and reads over HTTP), rather than a connect that hangs."""
        assert self._sock is not None
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        with contextlib.suppress(OSError):
            conn, _ = self._sock.accept()
            conn.close()
        with contextlib.suppress(OSError):
            self._reserve = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    async def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.setblocking(False)
            _, uid, _ = _UCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            )
            if uid not in self._uids:
                HANDED.labels("uid_refused").inc()
                log.warning("short-circuit: refused a client of uid %d", uid)
                error = errors.AccessDenied("This user may not read the node's cache files.")
                # For this uid, whatever it asks: the client need not ask again soon.
                await _send(conn, {**_error(error), "scope": "uid"}, [])
                return
            if self._held[uid] >= self._per_uid or len(self._clients) > self._max_connections:
                HANDED.labels("too_many").inc()
                log.warning("short-circuit: too many connections (uid %d holds %d)",
                            uid, self._held[uid])  # fmt: skip
                error = errors.SlowDown(
                    f"At most {self._per_uid} short-circuit connections per user; read over "
                    "HTTP, or close some."
                )
                await _send(conn, {**_error(error), "scope": "connection"}, [])
                return
            self._held[uid] += 1
            try:
                await self._converse(conn)
            finally:
                self._held[uid] -= 1
                if not self._held[uid]:
                    del self._held[uid]

    async def _converse(self, conn: socket.socket) -> None:
        """A connection of an allowed uid: its hello (in HELLO_TIMEOUT), then its requests."""
        nonce = secrets.token_hex(16)
        try:
            await _send(conn, {"v": 2, "nonce": nonce}, [])
            try:
                async with asyncio.timeout(self._hello_timeout):
                    hello = await _receive(conn)
            except TimeoutError:
                HANDED.labels("hello_timeout").inc()
                log.info("short-circuit: no hello in %.0f s", self._hello_timeout)
                return
            if hello is None:
                return
            if self._service.state_stale():
                await self._service.state_current()
            try:
                access_key, secret = self._hello(hello, nonce)
            except errors.S3Error as exc:
                HANDED.labels(exc.code).inc()
                await _send(conn, {**_error(exc), "scope": "connection"}, [])
                return
            await _send(conn, {"key": access_key}, [])
            while True:
                request = await _receive(conn)
                if request is None:
                    return
                if self._service.state_stale():
                    # A key, policy or mount changed on the node (another worker, the CLI):
                    # this request is decided on what holds now.
                    await self._service.state_current()
                if self._service.secret_for(access_key) != secret:
                    error = errors.InvalidAccessKeyId("The connection's key has changed.")
                    HANDED.labels(error.code).inc()
                    await _send(conn, {**_error(error), "scope": "connection"}, [])
                    return
                await self._answer(conn, access_key, request)
        except (ConnectionError, ValueError) as exc:
            log.info("short-circuit: dropped a client: %s", exc)

    def _hello(self, hello: dict[str, object], nonce: str) -> tuple[str, str]:
        """The access key that signed this connection's nonce (and its secret now)."""
        target, host = hello.get("hello"), hello.get("host")
        if not (isinstance(target, str) and isinstance(host, str)):
            raise errors.InvalidRequest("A short-circuit connection begins with a hello.")
        raw_path, _, qs = target.partition("?")
        query = dict(parse_qsl(qs, keep_blank_values=True))
        if raw_path != HELLO_PATH or query.get("nonce") != nonce:
            raise errors.AccessDenied("The hello must sign this connection's nonce.")
        auth = self._verifier.verify("GET", raw_path, qs, {"host": host})
        if auth is None:
            raise errors.AccessDenied("The hello must be signed.")
        secret = self._service.secret_for(auth.access_key)
        if secret is None:
            raise errors.InvalidAccessKeyId()
        return auth.access_key, secret

    async def _answer(
        self, conn: socket.socket, access_key: str, request: dict[str, object]
    ) -> None:
        """Answer one request: its objects, their descriptors in messages of at most MAX_FDS."""
        try:
            bucket, keys, first, count = _parse(request)
            if count == 0 and first == 0:
                renewal = await self._renewal(access_key, bucket, keys, _fresh_for(request))
                await _send(conn, {"objects": renewal, "more": False}, [])
                return
            found = await self._find(access_key, bucket, keys, first, count)
        except errors.S3Error as exc:
            HANDED.labels(exc.code).inc()
            await _send(conn, _error(exc), [])
            return
        # Each object's answer with its descriptors (which this list owns until they are sent).
        items: list[tuple[dict[str, object], list[int]]] = []
        handed = 0
        for entry in found:
            if isinstance(entry, errors.S3Error):
                HANDED.labels(entry.code).inc()
                items.append((_error(entry), []))
                continue
            blocks, opened = entry
            if None in opened:  # a file gone meanwhile: the client reads that block over HTTP
                kept = [
                    (f, fd) for f, fd in zip(blocks.files, opened, strict=True) if fd is not None
                ]
                owned = [fd for _, fd in kept if fd is not None]
                items.append((_object(blocks, [[f[0], f[1]] for f, _ in kept]), owned))
            else:
                owned = [fd for fd in opened if fd is not None]
                items.append((_object(blocks, [[f[0], f[1]] for f in blocks.files]), owned))
            handed += 1 if owned else 0
        _HANDED.inc(handed)
        _NONE.inc(len(found) - handed - sum(isinstance(e, errors.S3Error) for e in found))
        done = 0
        try:
            while True:
                end, fds = done, 0
                while end < len(items) and (end == done or fds + len(items[end][1]) <= MAX_FDS):
                    fds += len(items[end][1])
                    end += 1
                part = items[done:end]
                more = end < len(items)
                answer = {"objects": [o for o, _ in part], "more": more}
                await _send(conn, answer, [fd for _, held_fds in part for fd in held_fds])
                for _, held_fds in part:
                    _close_all(held_fds)
                done = end
                if not more:
                    return
        finally:
            for _, held_fds in items[done:]:
                _close_all(held_fds)

    async def _renewal(
        self, access_key: str, bucket: str, keys: list[str], fresh_for: float
    ) -> list[dict[str, object]]:
        """A request of versions only (count 0: a lease renewal): each key's version and how
        long it stays fresh, or its error, in one answer; no file looked up or opened. The
        versions are looked up together (Reader.local_versions), keys fresh for less than
        `fresh_for` seconds revalidated first."""
        service = self._service
        if not service.has_bucket(bucket):
            raise errors.NoSuchBucket()
        allowed = may_read_all(service, access_key, bucket, keys)
        mine = [key for key, ok in zip(keys, allowed, strict=True) if ok]
        looked_up = iter(await service.local_versions(bucket, mine, fresh_for))
        objects: list[dict[str, object]] = []
        denied = _error(errors.AccessDenied())
        answered = 0
        for ok in allowed:
            found = next(looked_up) if ok else None
            if found is None:
                HANDED.labels(denied["error"]).inc()
                objects.append(denied)
            elif isinstance(found, errors.S3Error):
                HANDED.labels(found.code).inc()
                objects.append(_error(found))
            else:
                # No "blocks" (none is asked for), the TTL cut to the millisecond below: a
                # thousand floats' seventeen digits were a good part of the answer's JSON.
                info, ttl = found.info, found.ttl
                if ttl > 0:
                    ttl = math.floor(ttl * 1000) / 1000
                objects.append({"etag": info.etag, "size": info.size,
                                "block_size": found.block_size, "ttl": ttl})  # fmt: skip
                answered += 1
        _NONE.inc(answered)
        return objects

    async def _find(
        self, access_key: str, bucket: str, keys: list[str], first: int, count: int
    ) -> list[tuple[LocalBlocks, list[int | None]] | errors.S3Error]:
        """Each key's blocks and their descriptors (None: a file gone meanwhile), or its error.
        The files of all keys are opened at once (in one thread hop, or inline for a few); the
        keys of which a file is not there are asked again through the Reader's local_blocks,
        which fetches them, FETCHES at a time."""
        service = self._service
        if not service.has_bucket(bucket):
            raise errors.NoSuchBucket()
        allowed: list[str] = []
        refused: dict[int, errors.S3Error] = {}
        for i, key in enumerate(keys):
            if may_read(service, access_key, bucket, key):
                allowed.append(key)
            else:
                refused[i] = errors.AccessDenied()
        if first == 0:
            listed = await service.local_files(bucket, allowed, count)
        else:  # the later blocks of large objects: rare, one key at a time
            listed = []
            for key in allowed:
                try:
                    listed.append(await service.local_blocks(bucket, key, first, count))
                except errors.S3Error as exc:
                    listed.append(exc)
        paths = [f[2] for e in listed if not isinstance(e, errors.S3Error) for f in e.files]
        opened = iter(await _opened(paths))
        found: list[tuple[LocalBlocks, list[int | None]] | errors.S3Error] = []
        again: list[int] = []  # in `found`: keys of which a file was not there
        try:
            for entry in listed:
                if isinstance(entry, errors.S3Error):
                    found.append(entry)
                    continue
                fds = [next(opened) for _ in entry.files]
                if None in fds and first == 0:
                    _close_all(fds)
                    again.append(len(found))
                    fds = []
                found.append((entry, fds))
            if again:
                await self._fetched(bucket, allowed, again, count, found)
        except BaseException:
            for e in found:
                if not isinstance(e, errors.S3Error):
                    _close_all(e[1])
            _close_all(opened)
            raise
        pending = iter(found)
        return [refused[i] if i in refused else next(pending) for i in range(len(keys))]

    async def _fetched(
        self, bucket: str, keys: list[str], again: list[int], count: int,
        found: list[tuple[LocalBlocks, list[int | None]] | errors.S3Error],
    ) -> None:  # fmt: skip
        """The keys at `again` (not cached, or evicted) fetched through the cache and their
        files opened, FETCHES at a time: one after another, a batch of keys never read cost a
        store round trip each in turn. Each key's answer replaces its entry in `found`."""
        slots = asyncio.Semaphore(FETCHES)
        service = self._service

        async def one(i: int) -> None:
            async with slots:
                try:
                    entry = await service.local_blocks(bucket, keys[i], 0, count)
                except errors.S3Error as exc:
                    found[i] = exc
                    return
                found[i] = (entry, await _opened([f[2] for f in entry.files]))

        # Every fetch ended before this returns (or raises): the caller closes what they opened.
        for outcome in await asyncio.gather(*(one(i) for i in again), return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome


def _parse(request: dict[str, object]) -> tuple[str, list[str], int, int]:
    bucket, keys = request.get("bucket"), request.get("keys")
    first, count = request.get("first", 0), request.get("count", MAX_BLOCKS)
    if not (
        isinstance(bucket, str) and bucket and isinstance(keys, list)
        and all(isinstance(k, str) and k for k in keys)
        and isinstance(first, int) and isinstance(count, int) and first >= 0 and count >= 0
    ):  # fmt: skip
        raise errors.InvalidRequest("A short-circuit request needs bucket, keys, first, count.")
    if len(keys) > MAX_KEYS:
        raise errors.InvalidRequest(f"At most {MAX_KEYS} keys in one request.")
    for key in keys:
        limits.check_key(key)
    return bucket, keys, first, min(count, MAX_BLOCKS)


def _fresh_for(request: dict[str, object]) -> float:
    """A renewal's "fresh_for": seconds its versions should stay fresh at least (0: any)."""
    value = request.get("fresh_for", 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise errors.InvalidRequest('"fresh_for" is a number of seconds.')
    return float(value)


def _object(found: LocalBlocks, blocks: list[list[int]]) -> dict[str, object]:
    return {
        "etag": found.info.etag,
        "size": found.info.size,
        "block_size": found.block_size,
        "ttl": found.ttl,
        "blocks": blocks,
    }


async def _opened(paths: list[str]) -> list[int | None]:
    """_open_all, on the event loop for a few files, else in one thread hop for all."""
    if len(paths) <= INLINE_OPENS:
        return _open_all(paths)
    return await asyncio.to_thread(_open_all, paths)


def _open_all(paths: list[str]) -> list[int | None]:
    """Each file opened read-only; None for one gone (evicted, or not cached yet)."""
    fds: list[int | None] = []
    for path in paths:
        try:
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except FileNotFoundError:
            fds.append(None)
    return fds


def _close_all(fds: Iterable[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _error(exc: errors.S3Error) -> dict[str, object]:
    return {"error": exc.code, "status": exc.status, "message": exc.detail}


async def _receive(conn: socket.socket) -> dict[str, object] | None:
    loop = asyncio.get_running_loop()
    head = await _exactly(loop, conn, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_MESSAGE:
        raise ValueError(f"a request of {size} bytes")
    body = await _exactly(loop, conn, size)
    if body is None:
        raise ConnectionError("the client went away mid-request")
    try:
        request = json.loads(body)
    except RecursionError:  # nested too deep for the parser: a bad request, not a dead task
        raise ValueError("a request nested too deep") from None
    if not isinstance(request, dict):
        raise ValueError("a request must be a JSON object")
    return request


async def _exactly(loop: asyncio.AbstractEventLoop, conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = await loop.sock_recv(conn, n - len(data))
        if not chunk:
            if data:
                raise ConnectionError("the client went away mid-message")
            return None
        data += chunk
    return data


async def _send(conn: socket.socket, answer: dict[str, object], fds: list[int]) -> None:
    """The answer with the descriptors attached to its first byte; the rest as it fits."""
    body = json.dumps(answer, separators=(",", ":")).encode()
    data = len(body).to_bytes(4, "big") + body
    loop = asyncio.get_running_loop()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    while True:
        try:
            sent = conn.sendmsg([data], ancillary)
            break
        except BlockingIOError:
            writable = loop.create_future()
            loop.add_writer(conn.fileno(), writable.set_result, None)
            try:
                await writable
            finally:
                loop.remove_writer(conn.fileno())
    if sent < len(data):
        await loop.sock_sendall(conn, data[sent:])
