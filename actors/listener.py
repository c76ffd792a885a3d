"""The coms socket's server side (W11-W17). Whatever waits, waits on the loop, so a slow or
hostile peer never reaches an actor's mailbox and costs no thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import socket
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from ..messages.commands import Address, CancelQuestion, NewQuestion, QueueDepthQuery
from ..messages.contract import OPERATOR
from ..messages.wire import (
    Ack,
    AgentCard,
    CancelEnvelope,
    Nack,
    Pong,
    PromptEnvelope,
    WireModel,
    invalid_text,
    loads_envelope,
)
from .loop import Edge, Episode, awaited, report, shared_edge
from .registry import PROBE_TIMEOUT_S, endpoint_accepts
from .supervision import Slot

MAX_LINE = 65536
LINE_DEADLINE_S = 10.0  # for a whole request line, however it trickles in
REPLY_GRACE_S = 5.0  # for writing the reply once the line is in
MAX_CONNECTIONS = 64
ADMIT_TIMEOUT_S = 5.0  # for the Router to take a question before it is refused
DEPTH_TIMEOUT_S = 2.0  # for the Router's open count; the last one seen is used after
ACCEPT_PAUSE_S = 0.1  # after accept() ran out of descriptors

LINE_TOO_LARGE = "line too large"
INVALID_JSON = "invalid json"
NOT_TAKEN = "bridge accepts prompts, cancels, and pings"
INVALID_PROMPT = "invalid prompt envelope"
INVALID_CANCEL = "invalid cancel envelope"
BUSY = "bridge is busy: too many connections; try again"
RESTARTING = "bridge is restarting; try again"
ADMIT_BUSY = "bridge is busy: too many questions waiting; try again"

_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class EndpointInUse(RuntimeError):
    """Another live process answers on our endpoint path (W11); we must not steal it."""


class _LineTooLarge(Exception):
    pass


def bind_endpoint(path: Path, backlog: int = 128) -> socket.socket:
    """W11: take over a stale socket path, refuse one that someone still answers on."""
    if path.exists() or path.is_symlink():
        if endpoint_accepts(str(path), PROBE_TIMEOUT_S):
            raise EndpointInUse(f"endpoint already in use ({path})")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen(backlog)
    except BaseException:  # the socket's edge: closed, whatever stopped it
        server.close()
        raise
    return server


def _take_line(buffer: bytearray, eof: bool) -> tuple[bytes | None, bool]:
    """(the first non-blank line, done) from what a client sent so far: done with no line
    when it sent only blank lines; the tail at EOF counts as a line (W12)."""
    lead = len(buffer) - len(buffer.lstrip())
    del buffer[: buffer.rfind(b"\n", 0, lead) + 1]
    end = buffer.find(b"\n")
    if end > MAX_LINE or (end < 0 and len(buffer) > MAX_LINE):
        raise _LineTooLarge
    if end >= 0:
        return bytes(buffer[:end]), True
    if eof:
        return (bytes(buffer) if buffer.strip() else None), True
    return None, False


def _refusal(kind: str, exc: ValidationError) -> str:
    """`kind`, naming the field when its text is not valid Unicode (X12) or its number
    not finite (X17)."""
    why = invalid_text(exc)
    return kind if why is None else f"{kind}: {why}"


class Listener:
    """One request line from every client, answered (W12-W17). A client costs at most a
    descriptor, its buffer and a task: past `max_connections` a `busy` nack, past
    `line_deadline_s` nothing. All but start and stop runs on the loop."""

    def __init__(self, server: socket.socket, router: Address,
                 card: Callable[[int], AgentCard], *,
                 edge: Edge | None = None,
                 max_connections: int = MAX_CONNECTIONS,
                 line_deadline_s: float = LINE_DEADLINE_S) -> None:
        server.setblocking(False)  # accept() must never wait
        self._server = server
        self._router = router
        self._card = card
        self.edge = edge or shared_edge()
        self.max_connections = max_connections
        self.line_deadline_s = line_deadline_s
        self._clients: set[asyncio.Task[None]] = set()
        self._stopped = False
        self._depth = 0  # the Router's last open count, for when it is slow
        self._refused = Episode()  # connections refused while the cap was reached
        self._short = Episode()  # the socket could not be accepted on or watched

    def start(self) -> None:
        self.edge.call(self._listen)

    def stop(self) -> None:
        """Stop listening and drop every client, soon, on the loop."""
        self.edge.call(self._shut)

    def _listen(self) -> None:
        if self._stopped:
            self._server.close()
            return
        try:
            self.edge.loop.add_reader(self._server.fileno(), self._accept)
        except OSError as exc:  # the kernel is short of room for the watch
            self._pause(exc)

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors (or room to watch): its backlog waits, and it tries again."""
        if exc.errno not in _SHORTAGE:
            report(f"cannot accept a coms connection: {exc}", "warning")
        elif self._short.happened():
            report(f"cannot accept a coms connection: {exc.strerror or exc}; "
                   f"retrying every {ACCEPT_PAUSE_S:g}s", "warning")
        self.edge.loop.remove_reader(self._server.fileno())
        self.edge.loop.call_later(ACCEPT_PAUSE_S, self._listen)

    def _shut(self) -> None:
        self._stopped = True
        with contextlib.suppress(ValueError, OSError):
            self.edge.loop.remove_reader(self._server.fileno())
        with contextlib.suppress(OSError):
            self._server.close()
        for task in list(self._clients):
            task.cancel()

    def _accept(self) -> None:
        """One waiting connection (the loop calls again while more wait)."""
        try:
            conn, _ = self._server.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if not self._stopped:
                self._pause(exc)
            return
        if self._short.over():
            report("accepting coms connections again", "info")
        if len(self._clients) >= self.max_connections:
            self._refuse(conn)
            return
        if refused := self._refused.over():
            report(f"refused {refused} coms connection(s) while "
                   f"{self.max_connections} were open", "warning")
        conn.setblocking(False)
        task = self.edge.loop.create_task(self._client(conn))
        self._clients.add(task)
        task.add_done_callback(self._clients.discard)

    def _refuse(self, conn: socket.socket) -> None:
        """Past the cap: a nack if it fits in the socket buffer, then close."""
        if self._refused.happened():
            report(f"{self.max_connections} coms connections open; refusing more until some close",
                   "warning")
        with conn:
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.recv(MAX_LINE)  # what it already sent, so the close is not a reset
            with contextlib.suppress(OSError):
                conn.send(Nack(msg_id="", error=BUSY).to_line())

    async def _client(self, conn: socket.socket) -> None:
        """Exactly one reply line per connection; a client that leaves gets none."""
        loop = asyncio.get_running_loop()
        then: Callable[[], None] | None = None
        try:
            with conn:
                try:
                    async with asyncio.timeout(self.line_deadline_s):
                        found = await self._read_line(loop, conn)
                except TimeoutError:
                    return  # no whole line in time
                if found is None:
                    return  # W12: nothing said, nothing answered
                if isinstance(found, bytes):
                    reply, then = await self.reply_to(found)
                else:
                    reply = Nack(msg_id="", error=LINE_TOO_LARGE)
                async with asyncio.timeout(REPLY_GRACE_S):
                    await loop.sock_sendall(conn, reply.to_line())
        except (OSError, TimeoutError):
            pass  # the client went away or stalled; nobody is left to answer
        finally:
            if then is not None:  # a well-formed cancel counts even if its sender left
                then()

    @staticmethod
    async def _read_line(loop: asyncio.AbstractEventLoop, conn: socket.socket
                         ) -> bytes | type[_LineTooLarge] | None:
        buffer = bytearray()
        blank = 0  # bytes of blank lines skipped: bounded as a line is
        while True:
            chunk = await loop.sock_recv(conn, MAX_LINE)
            buffer += chunk
            if chunk and b"\n" not in chunk and len(buffer) <= MAX_LINE:
                continue
            before = len(buffer)
            try:
                found, done = _take_line(buffer, eof=not chunk)
            except _LineTooLarge:
                return _LineTooLarge
            blank += before - len(buffer)
            if blank > MAX_LINE:
                return _LineTooLarge
            if done:
                return found

    async def open_count(self) -> int:
        """The Router's open count (C21), or the last one seen when it is slow (W6, W17)."""
        with contextlib.suppress(TimeoutError):
            self._depth = await awaited(
                lambda reply: self._router.tell(QueueDepthQuery(reply)), DEPTH_TIMEOUT_S)
        return self._depth

    async def _admit(self, prompt: PromptEnvelope) -> str | None:
        """The Router's verdict; one not taken within ADMIT_TIMEOUT_S is withdrawn and
        nacked, so an ack always means stored (the asker's resend is acked, X2)."""
        verdict: concurrent.futures.Future[str | None] = concurrent.futures.Future()
        self._router.tell(NewQuestion(prompt, verdict))
        waiting = asyncio.wrap_future(verdict)
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), ADMIT_TIMEOUT_S)
        except TimeoutError:
            if verdict.cancel():  # not taken: it never will be
                report(f"question {prompt.msg_id} was not taken within {ADMIT_TIMEOUT_S:g}s; "
                       f"nacked it ({ADMIT_BUSY})")
                return ADMIT_BUSY
        # taken meanwhile: its verdict is set in the same turn
        return await asyncio.wait_for(waiting, REPLY_GRACE_S)

    async def reply_to(self, line: bytes) -> tuple[WireModel, Callable[[], None] | None]:
        """The reply for one line, and what to do once it is written: a prompt is acked
        once stored; a cancel is acked first (C12)."""
        try:
            body = loads_envelope(line.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is one
            return Nack(msg_id="", error=INVALID_JSON), None
        raw_id = body.get("msg_id") if isinstance(body, dict) else None
        msg_id = raw_id if isinstance(raw_id, str) else ""
        kind = body.get("type") if isinstance(body, dict) else None
        if kind == "prompt":
            try:
                prompt = PromptEnvelope.model_validate(body)
            except ValidationError as exc:
                return Nack(msg_id=msg_id, error=_refusal(INVALID_PROMPT, exc)), None
            # while the Router restarts, the asker tries again
            restarting = isinstance(self._router, Slot) and not self._router.alive
            error = RESTARTING if restarting else await self._admit(prompt)
            if error is not None:
                return Nack(msg_id=prompt.msg_id, error=error), None
            return Ack(msg_id=prompt.msg_id), None
        if kind == "cancel":
            try:
                cancel = CancelEnvelope.model_validate(body)
            except ValidationError as exc:
                return Nack(msg_id=msg_id, error=_refusal(INVALID_CANCEL, exc)), None
            told = CancelQuestion(cancel, by_operator=body.get("by") == OPERATOR)  # X15
            return Ack(msg_id=cancel.msg_id), lambda: self._router.tell(told)
        if kind == "ping":
            return Pong(msg_id=msg_id, agent_card=self._card(await self.open_count())), None
        return Nack(msg_id=msg_id, error=NOT_TAKEN), None
