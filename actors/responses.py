"""Sending response envelopes to askers (W15): every send a task on the I/O edge.

A response is one line written to the asker's socket, then one reply line read
back (ack or nack). The asker is another process: a send spends nearly all its
time waiting for it, so it waits on the edge's loop, never in a thread of its
own. Any number of slow askers cost no thread and at most FLIGHTS descriptors;
at most `capacity` sends wait or run at once, and past that `submit` refuses
(the response then stays owed in the outbox; the Peer says so).

`send_envelope` is the same exchange, blocking, for one-off callers (the
`cancel` command sends its cancel envelope with it).
"""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import threading
from collections.abc import Callable

from .base import report
from .edge import Edge, shared_edge

__all__ = ["FLIGHTS", "MAX_REPLY", "RESPONSE_QUEUE", "ResponsePool", "send_envelope",
           "shared_responses"]

MAX_REPLY = 65536  # bytes of reply read before judging it (a reply is one short line)
# Responses waiting to be sent, retries included: room for every question the
# daemon may hold open (--max-open, 10,000 by default) to be answered at once,
# plus as many owed from the last run.
RESPONSE_QUEUE = 20_000
FLIGHTS = 64  # sends in progress at once (one socket each); the rest wait their turn
# A full listen backlog makes a non-blocking connect fail at once (EAGAIN) where a
# blocking one would wait: it is tried again this often until the send's deadline.
CONNECT_RETRY_S = 0.005
# connect() errors that mean the asker is gone for good (W15): final, no retry.
_GONE = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.ENOTDIR})

Outcome = tuple[str | None, bool]
"""(why it failed, or None on an ack; whether that is final, i.e. not worth a retry)."""


def judge_reply(reply: bytes) -> Outcome:
    """What the asker's reply says: an ack, a nack, silence, or something else."""
    text = reply.partition(b"\n")[0].decode("utf-8", "replace")
    if not text.strip():
        return "connection closed without a reply", False
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return f"unexpected reply: {text[:200]}", True
    if isinstance(body, dict) and body.get("type") == "ack":
        return None, True
    if isinstance(body, dict) and body.get("type") == "nack":
        return f"nack: {body.get('error')}", True
    return f"unexpected reply: {text[:200]}", True


def _failure(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def exchange(endpoint: str, line: bytes, timeout: float) -> bytes:
    """One request line to a peer's socket and what it replied, up to the first newline
    (at most MAX_REPLY bytes), blocking at most `timeout` per step (W12). Raises OSError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(endpoint)
        conn.sendall(line)
        reply = b""
        while b"\n" not in reply and len(reply) <= MAX_REPLY:
            chunk = conn.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply


def send_envelope(endpoint: str, line: bytes, timeout: float) -> Outcome:
    """Send one envelope line (a response, W15; a cancel, C12) and judge the ack, blocking.

    Returns the failure reason (None on ack) and whether the outcome is final:
    an ack, a nack, or a refused or missing socket (the asker is gone).
    A timeout, a full backlog or a dropped connection may pass, so they are
    worth another try.
    """
    try:
        reply = exchange(endpoint, line, timeout)
    except TimeoutError:
        return "timed out", False
    except (ConnectionRefusedError, FileNotFoundError, NotADirectoryError) as exc:
        return _failure(exc), True
    except (OSError, ValueError) as exc:
        return _failure(exc), False
    return judge_reply(reply)


class ResponsePool:
    """Every response being sent, with its retries, as tasks on the edge.

    Not tied to one actor's life: a restarted Peer must not drop a response
    mid-retry. `done(reason)` is called on the edge once per response: None
    when acked, else why it failed for good or after the last retry. It must
    be quick (it shares the loop with every send).
    """

    def __init__(self, capacity: int = RESPONSE_QUEUE, flights: int = FLIGHTS,
                 edge: Edge | None = None) -> None:
        self.capacity = capacity
        self.edge = edge or shared_edge()
        self._room = threading.BoundedSemaphore(capacity) if capacity > 0 else None
        self._flights = flights
        self._flying: asyncio.Semaphore | None = None  # made on the loop, on first use
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def submit(
        self,
        qid: str,
        endpoint: str,
        line: bytes,
        timeout: float,
        pauses: tuple[float, ...],
        done: Callable[[str | None], None],
    ) -> bool:
        """Queue a send; False (nothing queued) when `capacity` sends already wait or run,
        or the pool is closed."""
        if self._closed or self._room is None or not self._room.acquire(blocking=False):
            return False
        self.edge.call(self._start, qid, endpoint, line, timeout, pauses, done)
        return True

    def _start(self, qid: str, endpoint: str, line: bytes, timeout: float,
               pauses: tuple[float, ...], done: Callable[[str | None], None]) -> None:
        task = self.edge.loop.create_task(self._send(qid, endpoint, line, timeout, pauses, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, qid: str, endpoint: str, line: bytes, timeout: float,
                    pauses: tuple[float, ...], done: Callable[[str | None], None]) -> None:
        assert self._room is not None
        try:
            reason, final = await self._attempt(endpoint, line, timeout)
            for pause in pauses:
                if final:
                    break
                await asyncio.sleep(pause)
                reason, final = await self._attempt(endpoint, line, timeout)
        except Exception as exc:  # a fault in one send is its failure, not the loop's
            reason = _failure(exc)
        finally:
            self._room.release()
        try:
            done(reason)
        except Exception as exc:
            report(f"response for {qid}: {exc!r}")

    async def _attempt(self, endpoint: str, line: bytes, timeout: float) -> Outcome:
        """One try, holding one of `flights` sockets; its deadline runs from its connect."""
        if self._flying is None:
            self._flying = asyncio.Semaphore(self._flights)
        async with self._flying:
            try:
                async with asyncio.timeout(timeout):
                    return await _exchange(endpoint, line)
            except TimeoutError:
                return "timed out", False
            except OSError as exc:
                return _failure(exc), exc.errno in _GONE

    def close(self) -> None:
        """Drop every send in progress (for a pool that is not the process's own: tests,
        tools). `done` is not called for those: what was not sent stays owed."""
        self._closed = True
        self.edge.call(self._cancel_all)

    def _cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class _Exchange(asyncio.Protocol):
    """The line written once connected; the reply read up to its first newline."""

    def __init__(self, line: bytes, reply: asyncio.Future[bytes]) -> None:
        self.line = line
        self.reply = reply
        self.received = bytearray()
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self.line)

    def data_received(self, data: bytes) -> None:
        self.received += data
        if b"\n" in data or len(self.received) > MAX_REPLY:
            self.eof_received()

    def eof_received(self) -> bool:
        if not self.reply.done():
            self.reply.set_result(bytes(self.received))
        if self.transport is not None:
            self.transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.reply.done():
            if exc is None:
                self.reply.set_result(bytes(self.received))
            else:
                self.reply.set_exception(exc)


async def _exchange(endpoint: str, line: bytes) -> Outcome:
    """Connect (a full backlog is tried again every CONNECT_RETRY_S), write the line,
    read the reply up to its first newline (at most MAX_REPLY bytes) and judge it."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK |
                         socket.SOCK_CLOEXEC)
    try:
        while True:
            try:
                sock.connect(endpoint)
                break
            except BlockingIOError:  # AF_UNIX: the listen backlog is full (EAGAIN)
                await asyncio.sleep(CONNECT_RETRY_S)
            except ValueError as exc:  # a path too long for a socket address, say
                raise OSError(errno.ENAMETOOLONG, str(exc)) from None
    except BaseException:
        sock.close()
        raise
    reply: asyncio.Future[bytes] = loop.create_future()
    transport, _ = await loop.create_unix_connection(lambda: _Exchange(line, reply), sock=sock)
    try:
        return judge_reply(await reply)
    finally:
        transport.abort()  # at once, whatever is left: the exchange is over


_SHARED: ResponsePool | None = None
_SHARED_LOCK = threading.Lock()


def shared_responses() -> ResponsePool:
    """The process's response sender, made on first use: it outlives every Peer."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = ResponsePool()
        return _SHARED
