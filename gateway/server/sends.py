"""The send side of one connection: its answers' bytes in order, each body handed to the kernel
a slice at a time as the socket drains, bodies in files sent from the page cache by the kernel
(sendfile(2), plain TCP only), and the connections with more to send served in turn, a slice
each (nginx's `sendfile_max_chunk` is the model).

So a connection holds at most a slice the socket has not taken, whatever the size of its
answer and however slowly its client reads: a body in memory is never copied (a view of it is
written piece by piece; the caller keeps it until it is sent), a body in a file is never read
into the process. No answer is written in one piece while other connections wait: after a
slice, the connection's next one waits for the loop's next turn, behind the others' slices
and whatever else is ready. A connection whose client takes nothing for the send timeout is
cut off.

A body in a file may not be in the page cache yet (a block on disk that a thread reads in
first, checking it: PageStore.peek_sendable): its head and its file wait in the queue, and
whatever is queued after them, until the read ends; the loop never waits for it. If the read
fails, an error answer goes instead, and the connection closes after it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

log = logging.getLogger(__name__)

# Bytes one connection hands the kernel in a turn. Small enough that 64 connections' turns
# take a few milliseconds, large enough that a turn's cost (a call and a system call) is
# small against the copy (docs/performance.md, "Fair sends").
SLICE = 256 << 10
# A head followed by a file: the kernel holds it for the file's first bytes (one segment, not
# two: docs/performance.md, "Hot blocks sent from their files"); never waits for room.
_MORE = socket.MSG_MORE | socket.MSG_DONTWAIT


class Owner(Protocol):
    """The connection an outbox sends for."""

    def sent(self) -> None:
        """Everything queued is handed over (the transport may hold the end of it)."""

    def send_timed_out(self) -> None:
        """The client took nothing for the send timeout: the connection is to be cut off."""


class _File:
    """Bytes of an open file still to send; `release` runs once they are sent or dropped."""

    __slots__ = ("count", "fd", "offset", "release")

    def __init__(self, fd: int, offset: int, count: int, release: Callable[[], None] | None):
        self.fd = fd
        self.offset = offset
        self.count = count
        self.release = release

    def done(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            release()


class _Pending:
    """A file's head and bytes held in the queue until `reading` (the read of its bytes into
    the page cache, on a thread) is done; `instead()`: the answer to send if it failed."""

    __slots__ = ("file", "head", "instead", "reading")

    def __init__(
        self,
        head: bytes,
        file: _File,
        reading: asyncio.Future[None],
        instead: Callable[[], bytes],
    ) -> None:
        self.head = head
        self.file = file
        self.reading = reading
        self.instead = instead


Piece = bytes | bytearray | memoryview | _File | _Pending


class Outbox:
    """What one connection sends (see the module's docstring). `sock` is the socket's
    descriptor for sendfile(2) (plain TCP), or -1: then no file is sent. The transport's
    flow control is the outbox's: `pause` and `resume` come from the protocol's
    `pause_writing` and `resume_writing`."""

    def __init__(
        self, transport: asyncio.Transport, sock: int, timeout: float, owner: Owner
    ) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._timeout = timeout
        self._owner = owner
        self._queue: deque[Piece] = deque()
        self._paused = False  # the transport holds bytes the socket has not taken
        self._watching = False  # a file waits for room in the socket (on a duplicate of it)
        self._watch = -1  # that duplicate: uvloop watches no descriptor a transport owns
        self._heads: socket.socket | None = None  # a duplicate to send a file's head with
        self._turn: asyncio.Handle | None = None  # this connection's next slice, scheduled
        self._waiter: asyncio.Future[bool] | None = None  # a sender waiting for the queue
        self._timer: asyncio.TimerHandle | None = None  # the send timeout's check
        self._moved = 0.0  # loop time the client last took bytes
        self._close_when_sent = False  # a read failed: its error answer is the last one
        self.gone = False
        if sock >= 0:
            # Paused as soon as the transport holds a byte, resumed once it holds none: a
            # file's bytes go straight to the socket, so they wait until nothing is before
            # them; and what the transport holds is at most the rest of one slice.
            transport.set_write_buffer_limits(high=0, low=0)

    @property
    def idle(self) -> bool:
        """Nothing is queued (the transport may still hold the end of the last slice)."""
        return not self._queue

    def send(self, pieces: Iterable[bytes | bytearray | memoryview]) -> None:
        """Send `pieces` after what is queued: written now when nothing waits and they are
        small, else a slice at a time. They are not copied: the caller leaves them as they
        are until sent (`flushed`)."""
        if self.gone or self._close_when_sent or self._transport.is_closing():
            return  # nobody to send to, or the last answer is queued
        queue = self._queue
        if not queue and not self._paused and not self._watching:
            batch = list(pieces)
            if sum(map(len, batch)) <= SLICE:
                self._transport.writelines(batch)
                self._owner.sent()
                return
            queue.extend(batch)
        else:
            queue.extend(pieces)
        self._kick()

    def send_file(
        self,
        fd: int,
        offset: int,
        count: int,
        release: Callable[[], None] | None = None,
        head: bytes = b"",
        reading: asyncio.Future[None] | None = None,
        instead: Callable[[], bytes] | None = None,
    ) -> None:
        """Send `head`, then `count` bytes of the file `fd` from `offset`, after what is
        queued, by the kernel; `release` runs once they are sent, or dropped with the
        connection. The caller makes sure they are in the page cache, so that the loop never
        waits for the disk (PageStore.region), or gives `reading`, a read of them into it
        under way: the head, the file and all that is queued after them then wait for its
        end, and if it fails `instead()` is sent in their place and the connection closed
        after it."""
        if self._sock < 0:
            raise RuntimeError("files are sent on plain TCP connections only")
        if reading is not None and instead is not None:
            file = _File(fd, offset, count, release)
            if self.gone or self._close_when_sent or self._transport.is_closing():
                file.done()
                return
            self._queue.append(_Pending(head, file, reading, instead))
            if reading.done():
                self._kick()
            else:
                reading.add_done_callback(self._read)
            return
        if head:
            self._send_head(head)
        piece = _File(fd, offset, count, release)
        if self.gone or self._close_when_sent or count <= 0:
            piece.done()
            return
        self._queue.append(piece)
        self._kick()

    def _send_head(self, head: bytes) -> None:
        """A file's head: straight to the socket, marked as followed by more, when nothing
        is before it; else (or what the socket did not take) queued as any bytes."""
        view: bytes | memoryview = head
        if (
            not self._queue
            and not self._paused
            and not self._watching
            and not self.gone
            and not self._transport.is_closing()
            and not self._transport.get_write_buffer_size()
        ):
            heads = self._heads
            if heads is None:
                heads = self._heads = socket.socket(fileno=os.dup(self._sock))
            try:
                sent = heads.send(head, _MORE)
            except OSError:
                sent = 0  # no room, or the client is gone: the transport finds out
            if sent == len(head):
                return
            view = memoryview(head)[sent:]
        self.send((view,))

    def _read(self, reading: asyncio.Future[None]) -> None:
        """A held file's read has ended: the queue goes on if it was first."""
        if not self.gone and self._queue:
            self._kick()

    def _closing(self) -> None:
        """What is queued now is the last this connection sends: closed once it is out."""
        self._close_when_sent = True
        self._transport.pause_reading()

    async def flushed(self) -> bool:
        """Wait until all that is queued is handed over; False when the connection went
        first (the rest unsent)."""
        if not self._queue:
            return not self.gone
        waiter = self._waiter = self._loop.create_future()
        return await waiter

    # -- the transport's flow control ----------------------------------------------------

    def pause(self) -> None:
        self._paused = True
        self._arm()

    def resume(self) -> None:
        self._paused = False
        self._moved = self._loop.time()
        if self._queue and self._turn is None and not self._watching:
            self._turn = self._loop.call_soon(self._pump)

    def lost(self) -> None:
        """The connection is gone: what is queued is dropped (its files released)."""
        self.gone = True
        for handle in (self._turn, self._timer):
            if handle is not None:
                handle.cancel()
        self._turn = self._timer = None
        self._drop()
        heads, self._heads = self._heads, None
        if heads is not None:
            heads.close()

    # -- sending -------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._turn is None and not self._paused and not self._watching:
            self._pump()

    def _pump(self) -> None:
        """One turn: up to SLICE bytes of what is queued, handed to the kernel."""
        self._turn = None
        queue = self._queue
        transport = self._transport
        budget = SLICE
        while queue and budget > 0 and not self._paused and not self._watching:
            if transport.is_closing():
                self._drop()
                return
            piece = queue[0]
            if isinstance(piece, _Pending):
                if not piece.reading.done():
                    return  # its read's end kicks the queue again
                self._release_pending(piece)
                continue
            if isinstance(piece, _File):
                budget -= self._send_file(piece, budget)
                continue
            size = len(piece)
            if size <= budget:
                queue.popleft()
                transport.write(piece)
                budget -= size
            else:
                view = piece if isinstance(piece, memoryview) else memoryview(piece)
                queue[0] = view[budget:]
                transport.write(view[:budget])
                budget = 0
        if not queue:
            # All handed over, though the transport may hold the end of the last slice (then
            # paused): its senders go on, and the send timeout watches what is held.
            self._emptied()
            if self._paused:
                self._arm()
        elif self._paused or self._watching:
            self._arm()
        elif self._turn is None:
            self._turn = self._loop.call_soon(self._pump)  # the other connections first

    def _release_pending(self, piece: _Pending) -> None:
        """The first piece's read has ended: its head and file go on, or, if the read failed,
        its error answer and nothing after it."""
        queue = self._queue
        queue.popleft()
        reading = piece.reading
        if not reading.cancelled() and reading.exception() is None:
            queue.appendleft(piece.file)
            if piece.head:
                queue.appendleft(piece.head)
            return
        piece.file.done()
        self._drop()
        queue.append(piece.instead())
        self._closing()

    def _send_file(self, piece: _File, budget: int) -> int:
        """A slice of a file, straight to the socket; the bytes of budget it used."""
        if self._transport.get_write_buffer_size():
            # Not expected (the transport is paused while it holds anything): its bytes go
            # first, once the socket has room.
            self._watch_room()
            return 0
        asked = min(piece.count, budget)
        try:
            sent = os.sendfile(self._sock, piece.fd, piece.offset, asked)
        except BlockingIOError:
            self._watch_room()
            return 0
        except OSError as exc:
            # The client is gone (a reset, a broken pipe), or the file is unreadable: the
            # answer cannot go on.
            if not isinstance(exc, ConnectionError):
                log.error("a body sent from a file failed: %s", exc)
            self._transport.abort()
            self._drop()
            return budget
        if sent == 0:
            log.error("a body's file ends %d bytes short", piece.count)
            self._transport.abort()
            self._drop()
            return budget
        self._moved = self._loop.time()
        piece.offset += sent
        piece.count -= sent
        if piece.count == 0:
            self._queue.popleft()
            piece.done()
        elif sent < asked:
            self._watch_room()  # the socket is full
        return sent

    def _watch_room(self) -> None:
        if self._watch < 0:
            self._watch = os.dup(self._sock)
        self._watching = True
        self._loop.add_writer(self._watch, self._room)

    def _room(self) -> None:
        self._loop.remove_writer(self._watch)
        self._watching = False
        self._moved = self._loop.time()
        if self._turn is None:
            self._pump()

    def _unwatch(self) -> None:
        if self._watch >= 0:
            if self._watching:
                self._loop.remove_writer(self._watch)
                self._watching = False
            os.close(self._watch)
            self._watch = -1

    def _emptied(self) -> None:
        self._unwatch()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(True)
        if self._close_when_sent:
            self.gone = True
            self._transport.close()  # after what it holds
            return
        self._owner.sent()

    def _drop(self) -> None:
        self._unwatch()
        for piece in self._queue:
            if isinstance(piece, _File):
                piece.done()
            elif isinstance(piece, _Pending):
                piece.file.done()
        self._queue.clear()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(False)

    # -- the send timeout ----------------------------------------------------------------

    def _arm(self) -> None:
        """Watch for a client that takes nothing: one timer, re-armed as it fires."""
        if self._timer is None and not self.gone:
            self._moved = self._loop.time()  # the wait begins: counted from now
            self._timer = self._loop.call_later(self._timeout, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.gone or not (self._paused or self._watching):
            return
        still = self._loop.time() - self._moved
        if still >= self._timeout:
            self._owner.send_timed_out()
            return
        self._timer = self._loop.call_later(self._timeout - still, self._check)
