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
from collections import deque
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
    worth another try; a path no socket can have never does.
    """
    try:
        reply = exchange(endpoint, line, timeout)
    except TimeoutError:
        return "timed out", False
    except (ConnectionRefusedError, FileNotFoundError, NotADirectoryError, ValueError) as exc:
        return _failure(exc), True  # gone, or a path no socket can have (unencodable)
    except OSError as exc:
        return _failure(exc), False
    return judge_reply(reply)


class ResponsePool:
    """Every response being sent, with its retries, as callbacks on the edge's loop.

    Not tied to one actor's life: a restarted Peer must not drop a response
    mid-retry. `done(reason)` is called on the edge once per response: None
    when acked, else why it failed for good or after the last retry. It must
    be quick (it shares the loop with every send).

    A send is a few callbacks on the loop's own selector (connect, write
    when writable, read when readable, a deadline), not a task: at 10,000
    answers a coroutine, a transport and a timeout context per send cost
    twice the time of the exchange itself.
    """

    def __init__(self, capacity: int = RESPONSE_QUEUE, flights: int = FLIGHTS,
                 edge: Edge | None = None) -> None:
        self.capacity = capacity
        self.flights = flights
        self.edge = edge or shared_edge()
        self._room = threading.BoundedSemaphore(max(capacity, 0))
        self._flying: set[_Send] = set()  # holding a socket: at most `flights`
        self._waiting: deque[_Send] = deque()  # for a socket, in order
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
        if self._closed or not self._room.acquire(blocking=False):
            return False
        self.edge.call(self._take, _Send(self, qid, endpoint, line, timeout, pauses, done))
        return True

    def _take(self, send: _Send) -> None:
        """On the loop: the send gets a socket now, or waits for one."""
        if self._closed:
            return
        if len(self._flying) < self.flights:
            self._flying.add(send)
            send.attempt()
        else:
            self._waiting.append(send)

    def _landed(self, send: _Send, outcome: Outcome) -> None:
        """On the loop: an attempt is over; its socket goes to the next send waiting."""
        self._flying.discard(send)
        while self._waiting and len(self._flying) < self.flights:
            self._take(self._waiting.popleft())
        reason, final = outcome
        if not final and send.pauses:
            pause, send.pauses = send.pauses[0], send.pauses[1:]
            send.later = self.edge.loop.call_later(pause, self._take, send)
            return
        self._room.release()
        try:
            send.done(reason)
        except Exception as exc:
            report(f"response for {send.qid}: {exc!r}")

    def close(self) -> None:
        """Drop every send in progress (for a pool that is not the process's own: tests,
        tools). `done` is not called for those: what was not sent stays owed."""
        self._closed = True
        self.edge.call(self._drop_all)

    def _drop_all(self) -> None:
        for send in list(self._flying):
            send.drop()
        self._flying.clear()
        self._waiting.clear()


class _Send:
    """One response: its attempts, each a connect, a write and a read within a deadline."""

    __slots__ = ("deadline", "done", "endpoint", "later", "line", "pauses", "pool", "qid",
                 "reply", "sock", "timeout", "unsent")

    # set by each attempt
    deadline: asyncio.TimerHandle | None
    later: asyncio.TimerHandle | None  # a connect retry, or the next attempt
    unsent: memoryview
    reply: bytearray

    def __init__(self, pool: ResponsePool, qid: str, endpoint: str, line: bytes,
                 timeout: float, pauses: tuple[float, ...],
                 done: Callable[[str | None], None]) -> None:
        self.pool = pool
        self.qid = qid
        self.endpoint = endpoint
        self.line = line
        self.timeout = timeout
        self.pauses = pauses
        self.done = done
        self.sock: socket.socket | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.pool.edge.loop

    def attempt(self) -> None:
        self.unsent = memoryview(self.line)
        self.reply = bytearray()
        self.deadline = self.loop.call_later(self.timeout, self.land, ("timed out", False))
        self.connect()

    def connect(self) -> None:
        """A full listen backlog (EAGAIN) is tried again every CONNECT_RETRY_S."""
        self.later = None
        try:
            sock = self.sock = socket.socket(
                socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            try:
                sock.connect(self.endpoint)
            except BlockingIOError:
                sock.close()
                self.sock = None
                self.later = self.loop.call_later(CONNECT_RETRY_S, self.connect)
                return
            self.write()
        except OSError as exc:
            self.land((_failure(exc), exc.errno in _GONE))
        except Exception as exc:  # a path no socket can have, say: final, it stays so
            self.land((_failure(exc), True))

    def write(self) -> None:
        sock = self.sock
        assert sock is not None
        try:
            while self.unsent:
                self.unsent = self.unsent[sock.send(self.unsent):]
        except BlockingIOError:
            self.loop.add_writer(sock.fileno(), self.write)  # again: the same registration
            return
        except OSError as exc:
            self.land((_failure(exc), False))
            return
        self.loop.remove_writer(sock.fileno())
        self.loop.add_reader(sock.fileno(), self.read)

    def read(self) -> None:
        sock = self.sock
        assert sock is not None
        try:
            chunk = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError as exc:
            self.land((_failure(exc), False))
            return
        self.reply += chunk
        if not chunk or b"\n" in chunk or len(self.reply) > MAX_REPLY:
            self.land(judge_reply(bytes(self.reply)))

    def land(self, outcome: Outcome) -> None:
        """The attempt is over: let go of its socket and timers, then the pool decides."""
        self.drop()
        self.pool._landed(self, outcome)

    def drop(self) -> None:
        for handle in (self.deadline, self.later):
            if handle is not None:
                handle.cancel()
        sock, self.sock = self.sock, None
        if sock is not None:
            self.loop.remove_reader(sock.fileno())
            self.loop.remove_writer(sock.fileno())
            sock.close()


_SHARED: ResponsePool | None = None
_SHARED_LOCK = threading.Lock()


def shared_responses() -> ResponsePool:
    """The process's response sender, made on first use: it outlives every Peer."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = ResponsePool()
        return _SHARED
