"""The client's side of short-circuit reads (gateway/s3/local.py on the node): ask the node on
this host for objects' cached block files, many objects in one request, keep the descriptors
it hands over (a bounded LRU, each object's for the mount's metadata TTL), and read them with
pread.

A connection proves the client's access key once: the node sends a nonce, the client answers
with a presigned GET of `/_gateway/short-circuit?nonce=...` (`sign_hello`). Requests then
name a bucket and keys, unsigned.

A descriptor stays readable after the node evicts or replaces its file (an unlinked file
lives while it is open), and names one version: a lease never outlives its TTL, so an
overwrite is read after at most that long, as through HTTP. A lease is also never kept past
its node: when the node stops answering (its socket refuses, or it hung up the connection),
every lease is dropped and the socket left alone for RETRY_AFTER seconds (reads go over HTTP).

Leases of a process that reads are renewed ahead of their lapse, in a thread of the client's
(`renew_ahead`): a lease with less than RENEW_BEFORE of its TTL left is renewed (the node's
word that its version holds, many keys a request), so that a read past the TTL finds its
lease valid rather than wait for a renewal. The renewer only ever extends a lease whose
version the node confirmed, from the time it asked: a read is still never more than one TTL
behind the store, and a lease of another version, or refused, runs out as it would have.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import resource
import select
import socket
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.cache import blockfile
from gateway.client.stats import ClientStats

HELLO_PATH = "/_gateway/short-circuit"  # as gateway/s3/local.py verifies it
MAX_BLOCKS = 64  # blocks of one object in one answer (the node's limit)
MAX_KEYS = 1024  # keys asked in one request (as many as the node takes)
# Leases past their time renewed with the one read (an epoch's run out together): at most
# this many requests' worth. The node answers them from listings of their prefixes, a
# thousand keys a store request (docs/cache.md, "Freshness"), not a request each.
RENEW_AHEAD_REQUESTS = 8
# Renewal ahead of the lapse (the renewer thread): a lease is renewed once less than this share
# of its TTL is left, while the process has read within HOT_FOR of its TTLs (a process that
# stopped reading lets its leases run out); the renewer looks every TICK of the shortest
# mount's TTL leased from (at least MIN_TICK seconds, at most MAX_TICK).
RENEW_BEFORE = 0.4
# ... and the node asked for versions fresh for at least this share of the TTL (it lists their
# prefix again where its newest listing is older): a renewal then lasts past the next look.
FRESH_FOR = 0.5
HOT_FOR = 4
TICK = 0.1
MIN_TICK = 0.05
MAX_TICK = 5.0
MAX_FDS = 253  # descriptors in one message (the kernel's SCM_MAX_FD)
REFUSED_FOR = 60.0  # seconds a client whose uid the node refused reads over HTTP only
RETRY_AFTER = 10.0  # seconds after the node stopped answering before its socket is tried again
NODE_CHECK = 1.0  # seconds between looks whether the node hung up (a process reading leases)
_RECV = 1 << 18
# The node hung up: it ended (a crash, a restart) or closed the connection on its side.
_GONE = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)

log = logging.getLogger(__name__)


class ShortCircuitError(Exception):
    """The node refused (its S3 error code and message), or could not be asked."""

    def __init__(self, code: str, message: str, status: int = 0, scope: str = "") -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.status = status
        self.scope = scope  # "uid": this process may not ask; "connection": its hello failed


@dataclass(slots=True)
class Lease:
    """One version of an object as the node handed it: its blocks' descriptors by index."""

    etag: str
    size: int
    block_size: int
    until: float  # monotonic time after which it is asked for again
    fds: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (fd, length)
    verified: set[int] = field(default_factory=set)  # blocks read whole and checked
    ttl: float = -1.0  # the mount's metadata_ttl, as the node said (-1: for good)

    def close(self) -> None:
        for fd, _ in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _descriptor_budget() -> int:
    """Descriptors the leases may hold: the process's limit but 4,096 left to the rest of it
    (at least half its limit), at most 65,536."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, min(65536, max(soft // 2, soft - 4096)))


class ShortCircuit:
    """Leases of cached blocks from the node at `path`. Thread-safe; after a fork, the child
    keeps the leases (its own copies of the descriptors) and opens its own connection.

    `sign_hello(nonce)` gives the presigned hello (request target, Host it was signed for);
    `max_fds` bounds the descriptors held (default: half the process's limit);
    `renew_ahead`: renew leases in a thread before they lapse (see the module)."""

    def __init__(
        self,
        path: str,
        sign_hello: Callable[[str], tuple[str, str]],
        stats: ClientStats | None = None,
        max_fds: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        renew_ahead: bool = True,
    ) -> None:
        self.path = path
        self._sign_hello = sign_hello
        self.stats = stats if stats is not None else ClientStats()
        self._max_fds = max_fds or _descriptor_budget()
        self._clock = clock
        self._renew_ahead = renew_ahead
        self._read_at = -float("inf")  # when this process last asked for a lease
        # The longest a lease of each bucket was given: its mount's TTL, near enough (a lease
        # lasts what is left of the node's TTL for the version).
        self._ttls: dict[str, float] = {}
        self._renewer: threading.Thread | None = None
        self._closed = threading.Event()
        self._leases: OrderedDict[tuple[str, str], Lease] = OrderedDict()
        self._open_fds = 0
        self._lock = threading.Lock()  # the leases
        self._talking = threading.Lock()  # the connection
        self._conn: socket.socket | None = None
        self._inbox = b""
        self._fd_queue: list[int] = []
        self._pid = os.getpid()
        self._refused_until = -float("inf")  # the node refused this process's uid
        self._down_until = -float("inf")  # the node stopped answering: HTTP until then
        self._check_at = -float("inf")  # when to look again whether the node hung up
        # A child forked while a thread of the parent held a lock would wait for it forever.
        os.register_at_fork(after_in_child=functools.partial(_forked, weakref.ref(self)))

    def room(self) -> int:
        """Descriptors that more leases may take before older ones are let go."""
        return self._max_fds - self._open_fds

    def is_held(self, bucket: str, key: str) -> bool:
        """Whether a valid lease of the object is held (nothing counted, nothing moved)."""
        lease = self._leases.get((bucket, key))
        return lease is not None and self._clock() < lease.until

    def held(self, bucket: str, key: str) -> Lease | None:
        """The object's lease if one is held and still valid: no round trip."""
        now = self._clock()
        self._read_at = now
        if now >= self._check_at:
            self._check_node(now)
        with self._lock:
            lease = self._leases.get((bucket, key))
            if lease is None or now >= lease.until:
                return None
            self._leases.move_to_end((bucket, key))
            self.stats.leases_reused += 1
            return lease

    def lease(self, bucket: str, key: str) -> Lease:
        """The object's lease, asked for when there is none or it has expired."""
        lease = self.held(bucket, key)
        if lease is not None:
            return lease
        got = self.leases(bucket, [key])[key]
        if isinstance(got, ShortCircuitError):
            raise got
        return got

    def leases(self, bucket: str, keys: Iterable[str]) -> dict[str, Lease | ShortCircuitError]:
        """Leases of many keys: those held, and the others asked of the node in as few
        requests as it takes (MAX_KEYS keys each). A key's error is its answer."""
        now = self._clock()
        self._read_at = now
        if now >= self._check_at:
            self._check_node(now)
        found: dict[str, Lease | ShortCircuitError] = {}
        missing: list[str] = []
        stale: list[str] = []
        with self._lock:
            for key in keys:
                if key in found:
                    continue
                lease = self._leases.get((bucket, key))
                if lease is not None and now < lease.until:
                    self._leases.move_to_end((bucket, key))
                    self.stats.leases_reused += 1
                    found[key] = lease
                elif lease is not None and key not in stale:
                    stale.append(key)
                elif lease is None and key not in missing:
                    missing.append(key)
        if stale:
            missing += self._revalidate(bucket, stale, now, found)
        for i in range(0, len(missing), MAX_KEYS):
            chunk = missing[i : i + MAX_KEYS]
            try:
                asked = self._ask(bucket, chunk, now)
            except ShortCircuitError as exc:
                found.update(dict.fromkeys(chunk, exc))
                continue
            self._keep(bucket, asked)
            found.update(asked)
        return found

    def drop(self, bucket: str, key: str) -> None:
        """Forget an object's lease (its bytes failed their check, or the store changed)."""
        with self._lock:
            old = self._leases.pop((bucket, key), None)
            if old is not None:
                self._open_fds -= len(old.fds)
                old.close()

    def read(self, lease: Lease, index: int, start: int, end: int) -> bytes | None:
        """Bytes [start, end) of block `index`, or None when the lease has no descriptor for
        it. Checked against the block's CRC32C until it has been read whole once; then a
        whole block is one pread (the file of a committed block never changes)."""
        held = lease.fds.get(index)
        if held is None:
            return None
        fd, length = held
        if start == 0 and end == length:
            if index in lease.verified:
                data = os.pread(fd, length, 0)
                if len(data) != length:
                    raise blockfile.Corrupt(f"a block file of {len(data)} bytes, not {length}")
                return data
            data = blockfile.read_fd(fd, length, 0, length, True)
            lease.verified.add(index)
            return data
        return blockfile.read_fd(fd, length, start, end - start, index not in lease.verified)

    def close(self) -> None:
        self._closed.set()
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(timeout=5)
        with self._lock:
            for lease in self._leases.values():
                lease.close()
            self._leases.clear()
            self._open_fds = 0
        with self._talking:
            self._hang_up()

    # -- the node ------------------------------------------------------------------------

    def _check_node(self, now: float) -> None:
        """Every NODE_CHECK seconds, whether the node hung up this process's connection (it
        ended): its leases are dropped then. No request: one poll of the connection."""
        self._check_at = now + NODE_CHECK
        if not self._talking.acquire(blocking=False):
            return  # a request is under way: it finds out for itself
        try:
            conn = self._conn
            if conn is not None and self._pid == os.getpid() and _hung_up(conn):
                self._node_lost("it hung up")
        finally:
            self._talking.release()

    def _node_lost(self, why: str) -> None:
        """The node does not answer: every lease is dropped (a lease is a live node's word
        that its version is current) and its socket is not asked again for RETRY_AFTER
        seconds: reads go over HTTP, to another node when the client's endpoint is down too.
        Called holding _talking."""
        self._hang_up()
        self._down_until = self._clock() + RETRY_AFTER
        with self._lock:
            dropped = len(self._leases)
            for lease in self._leases.values():
                lease.close()
            self._leases.clear()
            self._open_fds = 0
        self.stats.leases_lost += dropped
        log.warning(
            "the gateway node on this host (%s) does not answer: %s; %d leases dropped, "
            "reading over HTTP for %.0f s", self.path, why, dropped, RETRY_AFTER,
        )  # fmt: skip

    def _keep(self, bucket: str, asked: dict[str, Lease | ShortCircuitError]) -> None:
        with self._lock:
            for key, fresh in asked.items():
                if isinstance(fresh, ShortCircuitError):
                    continue
                old = self._leases.pop((bucket, key), None)
                if old is not None:
                    self._open_fds -= len(old.fds)
                    old.close()
                self._leases[(bucket, key)] = fresh
                self._open_fds += len(fresh.fds)
                if fresh.ttl > self._ttls.get(bucket, 0.0):
                    self._ttls[bucket] = fresh.ttl
            while self._open_fds > self._max_fds and len(self._leases) > 1:
                _, evicted = self._leases.popitem(last=False)
                self._open_fds -= len(evicted.fds)
                evicted.close()
        if self._renew_ahead and any(isinstance(a, Lease) and a.ttl > 0 for a in asked.values()):
            self._start_renewer()

    def _revalidate(
        self, bucket: str, keys: list[str], now: float, found: dict[str, Lease | ShortCircuitError]
    ) -> list[str]:
        """Leases past their time kept valid by the node's word that their versions are still
        the current ones: one request for many keys (count 0: versions only, no descriptor,
        answered from what the node knows), for `keys` and the other leases of the bucket
        past their time (an epoch's leases run out together; the first read past the TTL
        renews them all). A key still of its version is put in `found`, renewed for another
        TTL; a key refused is put there with its error; the keys to lease again (another
        version, or the node could not be asked) are returned."""
        asked = set(keys)
        with self._lock:
            others = [
                k for (b, k), held in self._leases.items()
                if b == bucket and now >= held.until and k not in asked
            ]  # fmt: skip
        room = max(0, RENEW_AHEAD_REQUESTS * MAX_KEYS - len(keys))
        batch = keys + others[:room]
        again: list[str] = []
        for i in range(0, len(batch), MAX_KEYS):
            chunk = batch[i : i + MAX_KEYS]
            try:
                objects, fds = self._request({"bucket": bucket, "keys": chunk, "first": 0,
                                              "count": 0})  # fmt: skip
            except ShortCircuitError:
                # A node that does not answer versions alone (or cannot be asked): lease again.
                again += [k for k in chunk if k in asked]
                continue
            _close(fds)  # none is asked for
            if len(objects) != len(chunk):
                again += [k for k in chunk if k in asked]
                continue
            for key, answer in zip(chunk, objects, strict=True):
                kept = self._renewed(bucket, key, answer, now)
                if key not in asked:
                    continue
                if isinstance(kept, Lease | ShortCircuitError):
                    found[key] = kept
                else:
                    again.append(key)
        if self._renew_ahead and any(isinstance(f, Lease) and f.ttl > 0 for f in found.values()):
            self._start_renewer()  # the process reads again after a pause: renew ahead again
        return again

    def _renewed(
        self, bucket: str, key: str, answer: dict[str, Any], now: float
    ) -> Lease | ShortCircuitError | None:
        """The lease of `key` renewed when the node's answer names its version, its error when
        the node refuses the key, None (the lease dropped) for another version."""
        with self._lock:
            lease = self._leases.get((bucket, key))
            if lease is None:
                return None
            if "error" in answer:
                refusal: Lease | ShortCircuitError | None = _refusal(answer)
            elif _names(answer, lease):
                ttl = float(answer["ttl"])
                lease.until = now + ttl if ttl >= 0 else float("inf")
                lease.ttl = ttl
                if ttl > self._ttls.get(bucket, 0.0):
                    self._ttls[bucket] = ttl
                self._leases.move_to_end((bucket, key))
                self.stats.leases_renewed += 1
                return lease
            else:
                refusal = None
            del self._leases[(bucket, key)]
            self._open_fds -= len(lease.fds)
            lease.close()
            return refusal

    # -- renewal ahead of the lapse (a thread of its own) ------------------------------------

    def _start_renewer(self) -> None:
        renewer = self._renewer
        if (renewer is not None and renewer.is_alive()) or self._closed.is_set():
            return
        with self._lock:  # two threads keeping leases at once start one renewer
            if self._renewer is not renewer:
                return
            self._renewer = threading.Thread(
                target=self._renewing, name="gateway-lease-renewer", daemon=True
            )
            self._renewer.start()

    def _renewing(self) -> None:
        """Renew the leases near their lapse while the process reads; end when it stopped
        reading for HOT_FOR of its TTLs, or holds no lease of a TTL (started again when it
        leases or renews one)."""
        tick = MIN_TICK
        try:
            while not self._closed.wait(tick):
                if self._pid != os.getpid() or self._clock() < self._down_until:
                    continue  # not this process's connection to use; the node is down
                due, shortest = self._due(self._clock())
                if shortest is None:
                    return
                tick = min(MAX_TICK, max(MIN_TICK, TICK * shortest))
                for bucket, keys in due.items():
                    self._renew(bucket, keys)
        except Exception as exc:  # reads renew their leases themselves meanwhile
            log.warning("short-circuit: leases not renewed ahead: %r", exc)
        finally:
            with self._lock:
                if self._renewer is threading.current_thread():
                    self._renewer = None

    def _due(self, now: float) -> tuple[dict[str, list[str]], float | None]:
        """The keys of the leases to renew now, by bucket: valid, with less than RENEW_BEFORE
        of their mount's TTL left; and the shortest TTL of a mount leased from (None: no lease
        of a TTL to renew, or the process stopped reading)."""
        due: dict[str, list[str]] = {}
        ttls = self._ttls
        with self._lock:
            for (bucket, key), lease in self._leases.items():
                if lease.ttl <= 0 or now >= lease.until:
                    continue  # for good, or run out already: a read renews it
                if lease.until - now < RENEW_BEFORE * ttls.get(bucket, lease.ttl):
                    due.setdefault(bucket, []).append(key)
            held = [t for t in ttls.values() if t > 0]
        if not held or now - self._read_at > HOT_FOR * max(held):
            return {}, None
        return due, min(held)

    def _renew(self, bucket: str, keys: list[str]) -> None:
        """Renew these leases, MAX_KEYS a request (count 0: the versions only), asking the node
        for versions it knows fresh for at least FRESH_FOR of the mount's TTL (it revalidates
        those it does not, from a listing of their prefix). A lease is only extended, from when
        its request was sent, where the node names its version: one of another version,
        refused or not answered is left to run out (a read then asks again); a reader may hold
        it meanwhile, so its descriptors are never closed here."""
        fresh_for = round(FRESH_FOR * self._ttls.get(bucket, 0.0), 3)
        for i in range(0, len(keys), MAX_KEYS):
            chunk = keys[i : i + MAX_KEYS]
            now = self._clock()
            try:
                objects, fds = self._request({"bucket": bucket, "keys": chunk, "first": 0,
                                              "count": 0, "fresh_for": fresh_for})  # fmt: skip
            except ShortCircuitError:
                return
            _close(fds)  # none is asked for
            if len(objects) != len(chunk):
                return
            renewed = 0
            with self._lock:
                for key, answer in zip(chunk, objects, strict=True):
                    lease = self._leases.get((bucket, key))
                    if lease is None or "error" in answer or not _names(answer, lease):
                        continue
                    ttl = float(answer["ttl"])
                    until = now + ttl if ttl >= 0 else float("inf")
                    if until > lease.until:
                        lease.until, lease.ttl = until, ttl
                        renewed += 1
                    if ttl > self._ttls.get(bucket, 0.0):
                        self._ttls[bucket] = ttl
                self.stats.leases_renewed_ahead += renewed

    def _ask(
        self, bucket: str, keys: list[str], now: float
    ) -> dict[str, Lease | ShortCircuitError]:
        if now < self._refused_until:
            raise ShortCircuitError("AccessDenied", "this user may not read the node's files")
        objects, fds = self._request({"bucket": bucket, "keys": keys, "first": 0,
                                      "count": MAX_BLOCKS})  # fmt: skip
        if len(objects) != len(keys):
            _close(fds)
            raise ShortCircuitError("InternalError", "the node answered for other keys")
        found: dict[str, Lease | ShortCircuitError] = {}
        fds_left = iter(fds)
        for key, answer in zip(keys, objects, strict=True):
            if "error" in answer:
                found[key] = _refusal(answer)
                continue
            ttl = float(answer["ttl"])
            until = now + ttl if ttl >= 0 else float("inf")
            lease = Lease(answer["etag"], answer["size"], answer["block_size"], until, ttl=ttl)
            for index, length in answer["blocks"]:
                lease.fds[index] = (next(fds_left), length)
            found[key] = lease
        for key, got in found.items():
            if isinstance(got, Lease) and MAX_BLOCKS * got.block_size < got.size:
                found[key] = self._rest(bucket, key, got, now)
        self.stats.leases += len(keys)
        return found

    def _rest(self, bucket: str, key: str, lease: Lease, now: float) -> Lease | ShortCircuitError:
        """The blocks past the first MAX_BLOCKS of a large object, a request per MAX_BLOCKS."""
        first = MAX_BLOCKS
        while first * lease.block_size < lease.size:
            try:
                objects, fds = self._request({"bucket": bucket, "keys": [key], "first": first,
                                              "count": MAX_BLOCKS})  # fmt: skip
            except ShortCircuitError as exc:
                lease.close()
                return exc
            answer = objects[0] if len(objects) == 1 else {"error": "InternalError"}
            if "error" in answer or answer["etag"] != lease.etag:
                # Refused, or overwritten between two requests: HTTP reads it (the new one).
                _close(fds)
                lease.close()
                if "error" in answer:
                    return _refusal(answer)
                return ShortCircuitError("PreconditionFailed", "overwritten while leased")
            for (index, length), fd in zip(answer["blocks"], fds, strict=True):
                lease.fds[index] = (fd, length)
            first += MAX_BLOCKS
        return lease

    def _request(self, message: dict[str, object]) -> tuple[list[dict[str, Any]], list[int]]:
        """One request and its answer (the objects of all its messages, their descriptors in
        order); a connection lost before the answer is made again once."""
        body = json.dumps(message).encode()
        with self._talking:
            if self._clock() < self._down_until:
                raise ShortCircuitError("ServiceUnavailable", "the node did not answer lately")
            for attempt in range(2):
                conn = self._connection()
                objects: list[dict[str, Any]] = []
                fds: list[int] = []
                try:
                    conn.sendall(len(body).to_bytes(4, "big") + body)
                    self.stats.lease_requests += 1
                    while True:
                        answer = self._message(conn)
                        if "error" in answer:
                            refusal = _refusal(answer)
                            if refusal.scope:
                                self._hang_up()
                            raise refusal
                        for obj in answer["objects"]:
                            objects.append(obj)
                            for _ in obj.get("blocks", ()):
                                fds.append(self._fd_queue.pop(0))
                        if not answer["more"]:
                            return objects, fds
                except (OSError, ValueError, IndexError) as exc:
                    _close(fds)
                    self._hang_up()
                    if attempt:
                        if isinstance(exc, OSError):  # lost twice, the second time a new one
                            self._node_lost(f"{type(exc).__name__}: {exc}")
                        raise ShortCircuitError("ServiceUnavailable", str(exc)) from None
                except BaseException:
                    _close(fds)
                    raise
        raise AssertionError("unreachable")

    def _message(self, conn: socket.socket) -> dict[str, Any]:
        """The next message, its descriptors queued in order (a read may hold the end of one
        message and the beginning of the next, whose descriptors come with its first byte)."""
        while True:
            if len(self._inbox) >= 4:
                size = int.from_bytes(self._inbox[:4], "big")
                if len(self._inbox) >= 4 + size:
                    body = self._inbox[4 : 4 + size]
                    self._inbox = self._inbox[4 + size :]
                    answer = json.loads(body)
                    if not isinstance(answer, dict):
                        raise ValueError("the node sent something that is no answer")
                    return answer
            data, fds, flags, _ = socket.recv_fds(conn, _RECV, MAX_FDS)
            self._fd_queue.extend(fds)
            if flags & socket.MSG_CTRUNC:
                raise ValueError("descriptors were cut off")
            if not data:
                raise ConnectionError("the node closed the connection")
            self._inbox += data

    def _connection(self) -> socket.socket:
        if self._pid != os.getpid():  # forked: the parent's connection is not ours
            self._conn, self._pid = None, os.getpid()
            self._inbox, self._fd_queue = b"", []
        if self._conn is not None:
            return self._conn
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(60)
        try:
            conn.connect(self.path)
        except OSError as exc:
            conn.close()
            self._node_lost(f"{type(exc).__name__}: {exc}")
            raise ShortCircuitError("ServiceUnavailable", f"{self.path}: {exc}") from None
        self._conn = conn
        self.stats.connections += 1
        try:
            greeting = self._message(conn)
            if "error" in greeting:
                raise _refusal(greeting)
            target, host = self._sign_hello(str(greeting["nonce"]))
            hello = json.dumps({"hello": target, "host": host}).encode()
            conn.sendall(len(hello).to_bytes(4, "big") + hello)
            answer = self._message(conn)
            if "error" in answer:
                raise _refusal(answer)
        except ShortCircuitError as exc:
            if exc.scope == "uid":
                self._refused_until = self._clock() + REFUSED_FOR
            self._hang_up()
            raise
        except (OSError, ValueError, KeyError) as exc:
            self._hang_up()
            raise ShortCircuitError("ServiceUnavailable", f"hello: {exc}") from None
        return conn

    def _hang_up(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None
        self._inbox = b""
        _close(self._fd_queue)
        self._fd_queue = []


def _names(answer: dict[str, Any], lease: Lease) -> bool:
    """Whether the node's answer names the lease's version (and cuts it into the same blocks)."""
    return bool(
        answer.get("etag") == lease.etag and answer.get("size") == lease.size
        and answer.get("block_size") == lease.block_size
    )  # fmt: skip


def _forked(ref: weakref.ReferenceType[ShortCircuit]) -> None:
    """In a forked child: the parent's locks (a thread of the parent may have held one at the
    fork) and renewer thread (not in the child) are not the child's."""
    self = ref()
    if self is not None:
        self._lock = threading.Lock()
        self._talking = threading.Lock()
        self._renewer = None
        closed, self._closed = self._closed, threading.Event()
        if closed.is_set():
            self._closed.set()


def _refusal(answer: dict[str, Any]) -> ShortCircuitError:
    return ShortCircuitError(
        str(answer["error"]),
        str(answer.get("message", "")),
        int(answer.get("status", 0)),
        str(answer.get("scope", "")),
    )


def _hung_up(conn: socket.socket) -> bool:
    """Whether the other end of `conn` has closed it (nothing of it is read)."""
    poller = select.poll()
    poller.register(conn, select.POLLIN | _GONE)
    for _, events in poller.poll(0):
        if events & _GONE:
            return True
        if events & select.POLLIN:  # readable while no answer is due: the end, or an error
            try:
                return conn.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True
    return False


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()
