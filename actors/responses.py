"""Responses to askers (W15): each connects to the asker's endpoint, writes one line and
waits for its ack, on the loop, so a slow asker costs no thread and no mailbox turn."""

from __future__ import annotations

import asyncio
import errno
import functools
import socket
from collections.abc import Callable

from ..messages.wire import loads
from .loop import Edge, Spawned, shared_edge

RESPONSE_TIMEOUT_S = 10.0  # for an asker to ack one attempt
RETRY_PAUSES_S = (2.0, 10.0)
MAX_REPLY = 65536  # bytes of reply read at most before judging it (a reply is one short line)
# Responses waiting or being sent, retries included: every question --max-open allows
# (10,000 by default) answered at once, plus as many owed from the last run.
RESPONSE_QUEUE = 20_000
FLIGHTS = 64  # sends holding a socket at once; the rest wait their turn
# A full listen backlog makes a non-blocking connect fail at once (EAGAIN) where a
# blocking one would wait: it is tried again this often until the attempt's deadline.
CONNECT_RETRY_S = 0.005
_GONE = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.ENOTDIR})  # final, no retry

Outcome = tuple[str | None, bool]
"""(why it failed, or None on an ack; whether that is final, i.e. not worth a retry)."""


def judge_reply(reply: bytes) -> Outcome:
    """What the asker's reply says: an ack, a nack, silence, or something else."""
    text = reply.partition(b"\n")[0].decode("utf-8", "replace")
    if not text.strip():
        return "connection closed without a reply", False
    try:
        body = loads(text)
    except ValueError:  # not JSON as a JavaScript peer reads it, or nested too deep
        return f"unexpected reply: {text[:200]}", True
    if isinstance(body, dict) and body.get("type") == "ack":
        return None, True
    if isinstance(body, dict) and body.get("type") == "nack":
        return f"nack: {body.get('error')}", True
    return f"unexpected reply: {text[:200]}", True


def failure(exc: BaseException) -> str:
    """What went wrong, in words: a timeout's own text is empty, so its name stands in."""
    return str(exc) or type(exc).__name__


def exchange(endpoint: str, line: bytes, timeout: float) -> bytes:
    """`_exchange` for one-off callers off the loop (the `doctor` command). Raises OSError."""
    return asyncio.run(_exchange(endpoint, line, timeout))


def send_envelope(endpoint: str, line: bytes, timeout: float) -> Outcome:
    """`_attempt` for one-off callers off the loop (the `cancel` command)."""
    return asyncio.run(_attempt(endpoint, line, timeout))


class ResponsePool:
    """Slow askers cost no thread and at most `flights` descriptors. Not tied to one Peer's
    life: a restarted Peer must not drop a response mid-retry. `done(reason)` is called
    on the loop once per response (None when acked): it only tells."""

    def __init__(self, capacity: int = RESPONSE_QUEUE, flights: int = FLIGHTS,
                 edge: Edge | None = None) -> None:
        self.capacity = capacity
        self.edge = edge or shared_edge()
        self._flights = asyncio.Semaphore(flights)  # bound to the loop at its first use
        self._sends: set[Spawned[None]] = set()  # submitted, not done
        self._keys: set[object] = set()  # of the sends submitted with a key, not done

    def submit(self, endpoint: str, line: bytes, timeout: float,
               pauses: tuple[float, ...], done: Callable[[str | None], None],
               key: object = None) -> bool:
        """Queue a send; False (nothing queued) past `capacity`. One whose `key` is being
        sent already is not sent twice (a restarted Peer sends all it owes). From one
        thread at a time (the Peer's turns): a send's discard always follows its add."""
        if key is not None and key in self._keys:
            return True
        if len(self._sends) >= self.capacity:
            return False
        send = self.edge.spawn(self._send(endpoint, line, timeout, pauses, done))
        self._sends.add(send)
        send.add_done_callback(self._sends.discard)
        if key is not None:
            self._keys.add(key)
            send.add_done_callback(lambda _: self._keys.discard(key))
        return True

    async def _send(self, endpoint: str, line: bytes, timeout: float,
                    pauses: tuple[float, ...], done: Callable[[str | None], None]) -> None:
        for pause in (*pauses, None):
            async with self._flights:  # a socket is held only while an attempt runs
                reason, final = await _attempt(endpoint, line, timeout)
            if final or pause is None:
                break
            await asyncio.sleep(pause)
        done(reason)


async def _exchange(endpoint: str, line: bytes, timeout: float) -> bytes:
    """Connect, write the line, and read the reply up to its first newline, all within
    `timeout` (W12). A full backlog is waited out: room comes as the peer accepts.

    Never more than MAX_REPLY bytes are read, however the reply is cut into chunks: a
    longer line is judged on its first MAX_REPLY bytes alone."""
    loop = asyncio.get_running_loop()
    flags = socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
    with socket.socket(socket.AF_UNIX, flags) as sock:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    sock.connect(endpoint)
                    break
                except BlockingIOError:
                    await asyncio.sleep(CONNECT_RETRY_S)
            await loop.sock_sendall(sock, line)
            reply = bytearray()
            while len(reply) < MAX_REPLY:
                chunk = await loop.sock_recv(sock, min(4096, MAX_REPLY - len(reply)))
                reply += chunk
                if not chunk or b"\n" in chunk:
                    break
    return bytes(reply)


async def _attempt(endpoint: str, line: bytes, timeout: float) -> Outcome:
    """One send judged: an ack, a nack, or a socket refused or missing are final; a
    timeout, a full backlog or a dropped connection may pass. No socket to be had (out
    of descriptors, of memory) is this attempt's failure, not the response's."""
    try:
        return judge_reply(await _exchange(endpoint, line, timeout))
    except TimeoutError:
        return "timed out", False
    except OSError as exc:
        return failure(exc), exc.errno in _GONE
    except ValueError as exc:  # a path no socket can have (unencodable): final, it stays so
        return failure(exc), True


@functools.cache
def shared_responses() -> ResponsePool:
    """The process's response sender, made on first use: it outlives every Peer."""
    return ResponsePool()
