"""Sending response envelopes to askers (W15): one event loop for every send.

A response is one line written to the asker's socket, then one reply line read
back (ack or nack). The asker is another process: a send spends nearly all its
time waiting for it. A thread per send (or a few threads, each waiting in turn)
paid a thread wake and a handful of GIL hand-overs per response, and with
thousands of answers at once that cost more than everything else the bridge
did. So one thread runs every send as a non-blocking socket in a selector, and
a retry waits in a heap by its due time. Any number of slow askers cost one
thread and at most FLIGHTS descriptors; at most `capacity` sends wait or run
at once, and past that `submit` refuses (the response then stays owed in the
outbox; the Peer says so).

`send_envelope` is the same exchange, blocking, for one-off callers (the
`cancel` command sends its cancel envelope with it).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .base import report

__all__ = ["FLIGHTS", "MAX_REPLY", "RESPONSE_QUEUE", "ResponsePool", "send_envelope"]

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


@dataclass(order=True)
class _Send:
    """One response to send, with the pauses before its retries still left."""

    due: float
    seq: int
    qid: str = field(compare=False)
    endpoint: str = field(compare=False)
    line: bytes = field(compare=False)
    timeout: float = field(compare=False)
    pauses: tuple[float, ...] = field(compare=False)
    done: Callable[[str | None], None] = field(compare=False)
    started: float | None = field(default=None, compare=False)  # this attempt's first connect
    starting: bool = field(default=False, compare=False)  # counted in ResponsePool._starting


@dataclass
class _Flight:
    """A send in progress: its socket, what is left to write, what was read."""

    send: _Send
    sock: socket.socket
    deadline: float
    unsent: memoryview
    reply: bytearray = field(default_factory=bytearray)


class ResponsePool:
    """One thread sending responses, with their retries, for every Peer there will be.

    Not tied to one actor's life: a restarted Peer must not drop a response
    mid-retry. `done(reason)` is called from the pool's thread once per
    response: None when acked, else why it failed for good or after the last
    retry. It must not block for long (it shares the thread with every send).
    """

    def __init__(self, capacity: int = RESPONSE_QUEUE, flights: int = FLIGHTS) -> None:
        self.capacity = capacity
        self.flights = flights
        self._lock = threading.Lock()
        self._heap: list[_Send] = []  # waiting: new ones (due now) and retries
        self._seq = 0
        self._flying: dict[int, _Flight] = {}  # by socket fd
        self._starting = 0  # taken off the heap, not yet flying
        self._selector: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._asleep = False  # the loop is (about to be) in select(): wake it on submit
        self._closed = False

    @property
    def pending(self) -> int:
        """Sends waiting or in progress."""
        with self._lock:
            return len(self._heap) + len(self._flying) + self._starting

    def submit(
        self,
        qid: str,
        endpoint: str,
        line: bytes,
        timeout: float,
        pauses: tuple[float, ...],
        done: Callable[[str | None], None],
    ) -> bool:
        """Queue a send; False (nothing queued) when `capacity` sends already wait or run.

        Raises RuntimeError or OSError when the pool's thread cannot be started
        (nothing is queued then either).
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the response sender is closed")
            if len(self._heap) + len(self._flying) + self._starting >= self.capacity:
                return False
            self._start()  # first: if it cannot start, nothing is left queued
            send = _Send(time.monotonic(), 0, qid, endpoint, line, timeout, pauses, done)
            self._push(send)
            if self._asleep:  # under the lock, so a close cannot shut the pipe meanwhile
                self._asleep = False
                self._wake()
        return True

    # -- the loop -------------------------------------------------------------

    def _start(self) -> None:
        """Under the lock: the selector, the wake-up pipe and the thread, on first use."""
        if self._thread is not None:
            return
        selector = selectors.DefaultSelector()
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            selector.register(wake_r, selectors.EVENT_READ, None)
            thread = threading.Thread(target=self._run, name="peer-response", daemon=True)
            self._selector, self._wake_r, self._wake_w = selector, wake_r, wake_w
            thread.start()
        except BaseException:
            self._selector, self._wake_r, self._wake_w = None, -1, -1
            selector.close()
            os.close(wake_r)
            os.close(wake_w)
            raise
        self._thread = thread

    def _started(self, send: _Send) -> None:
        """Under the lock: the send is counted where it went (heap, flying, done), not
        as starting any more; in the same step, so `pending` never counts it twice."""
        if send.starting:
            send.starting = False
            self._starting -= 1

    def _push(self, send: _Send) -> None:
        self._started(send)
        self._seq += 1
        send.seq = self._seq
        heapq.heappush(self._heap, send)

    def _wake(self) -> None:
        if self._wake_w < 0:
            return  # closed
        with contextlib.suppress(BlockingIOError):  # a byte is there already: enough
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        """Stop the thread and close every socket; what was not sent stays unsent.

        For a pool that is not the process's own (tests, tools): the daemon's
        lives as long as the process, and what it had not sent is still owed
        in the outbox at the next start. `done` is not called for those sends.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._wake()  # under the lock: the loop cannot have closed the pipe yet
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        selector = self._selector
        assert selector is not None
        try:
            while not self._closed:
                try:
                    self._turn(selector)
                except Exception as exc:  # a bug here must not end every future response
                    report(f"response sender: {exc!r}", "error")
                    time.sleep(0.1)
        finally:
            with self._lock:
                flights, self._flying = list(self._flying.values()), {}
                self._heap.clear()
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1
            for flight in flights:
                flight.sock.close()
            selector.close()

    def _turn(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        due: list[_Send] = []
        with self._lock:
            while (
                self._heap
                and self._heap[0].due <= now
                and len(self._flying) + len(due) < self.flights
            ):
                send = heapq.heappop(self._heap)
                send.starting = True  # so that `pending` never dips meanwhile
                due.append(send)
            self._starting = len(due)
        for send in due:
            try:
                self._begin(selector, send, now)
            except Exception as exc:  # a fault in one send must not stop the others
                self._finish(send, (_failure(exc), False))
            finally:
                with self._lock:
                    self._started(send)  # if it ended without going anywhere
        wait = self._next_wait(time.monotonic())
        with self._lock:
            if self._heap and self._heap[0].due <= time.monotonic() and (
                len(self._flying) < self.flights
            ):
                wait = 0.0  # submitted meanwhile
            self._asleep = wait != 0.0
        events = selector.select(wait)
        with self._lock:
            self._asleep = False
        for key, mask in events:
            if key.data is None:  # the wake-up pipe
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
                continue
            flight = key.data
            assert isinstance(flight, _Flight)
            try:
                if mask & selectors.EVENT_WRITE:
                    self._write(selector, flight)
                elif mask & selectors.EVENT_READ:
                    self._read(selector, flight)
            except Exception as exc:  # this send fails (and may be retried); not the loop
                self._land(selector, flight, (_failure(exc), False))
        self._expire(selector, time.monotonic())

    def _next_wait(self, now: float) -> float | None:
        """How long select() may sleep: until the next due send or flight deadline."""
        with self._lock:
            moments = [f.deadline for f in self._flying.values()]
            if self._heap and len(self._flying) < self.flights:
                moments.append(self._heap[0].due)
        if not moments:
            return None
        return max(0.0, min(moments) - now)

    # -- one send -------------------------------------------------------------

    def _begin(self, selector: selectors.BaseSelector, send: _Send, now: float) -> None:
        try:
            sock = socket.socket(
                socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
            )
        except OSError as exc:  # out of descriptors, say: worth another try
            self._finish(send, (_failure(exc), False))
            return
        try:
            code = sock.connect_ex(send.endpoint)
        except (OSError, ValueError) as exc:  # a path too long for a socket address, say
            sock.close()
            self._finish(send, (_failure(exc), False))
            return
        if send.started is None:
            send.started = now
        if code in (errno.EAGAIN, errno.EWOULDBLOCK):  # backlog full: try again shortly
            sock.close()
            if now - send.started >= send.timeout:
                self._finish(send, ("timed out", False))
                return
            send.due = min(now + CONNECT_RETRY_S, send.started + send.timeout)
            with self._lock:
                self._push(send)
            return
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            error = OSError(code, os.strerror(code))
            self._finish(send, (_failure(error), code in _GONE))
            return
        flight = _Flight(send, sock, send.started + send.timeout, memoryview(send.line))
        try:
            selector.register(sock, selectors.EVENT_WRITE, flight)
        except BaseException:
            sock.close()
            raise
        with self._lock:
            self._flying[sock.fileno()] = flight
            self._started(send)
        self._write(selector, flight)

    def _write(self, selector: selectors.BaseSelector, flight: _Flight) -> None:
        try:
            while flight.unsent:
                flight.unsent = flight.unsent[flight.sock.send(flight.unsent) :]
        except BlockingIOError:
            return  # the rest when it is writable again
        except OSError as exc:
            self._land(selector, flight, (_failure(exc), False))
            return
        selector.modify(flight.sock, selectors.EVENT_READ, flight)

    def _read(self, selector: selectors.BaseSelector, flight: _Flight) -> None:
        try:
            chunk = flight.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError as exc:
            self._land(selector, flight, (_failure(exc), False))
            return
        flight.reply += chunk
        if chunk and b"\n" not in chunk and len(flight.reply) <= MAX_REPLY:
            return  # more to come
        self._land(selector, flight, judge_reply(bytes(flight.reply)))

    def _expire(self, selector: selectors.BaseSelector, now: float) -> None:
        with self._lock:
            late = [f for f in self._flying.values() if f.deadline <= now]
        for flight in late:
            self._land(selector, flight, ("timed out", False))

    def _land(self, selector: selectors.BaseSelector, flight: _Flight, outcome: Outcome) -> None:
        """The flight is over: close its socket, then finish or retry the send."""
        with self._lock:
            self._flying.pop(flight.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(flight.sock)
        flight.sock.close()
        self._finish(flight.send, outcome)

    def _finish(self, send: _Send, outcome: Outcome) -> None:
        reason, final = outcome
        if final or not send.pauses:
            try:
                send.done(reason)
            except Exception as exc:
                report(f"response for {send.qid}: {exc!r}")
            return
        send.started = None  # a retry gets a deadline of its own
        send.due = time.monotonic() + send.pauses[0]
        send.pauses = send.pauses[1:]
        with self._lock:
            self._push(send)

