"""The PeerActor: the bridge's face in the coms pool (W3, W5-W8, W11-W17).

It owns the listening socket, the registry entry and the heartbeat, and it
sends response envelopes to askers. Everything that waits (accepting and
reading clients, waiting for the Router's word, connecting to an asker, the
heartbeat's beat) runs on the I/O edge, so the actor's own mailbox only ever
holds quick work: rewriting the entry and handing a response to the sender.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka
from pydantic import ValidationError

from ..messages.commands import (
    Address,
    CancelQuestion,
    Heartbeat,
    HeartbeatDue,
    LogEvent,
    NewQuestion,
    QueueDepthQuery,
    SendResponse,
    UnknownMessage,
)
from ..messages.contract import NOT_ADMITTED, iso, log_record
from ..messages.model import is_valid_qid
from ..messages.wire import (
    Ack,
    AgentCard,
    CancelEnvelope,
    Nack,
    Pong,
    PromptEnvelope,
    RegistryEntry,
    ResponseEnvelope,
    WireModel,
    invalid_text,
    loads,
)
from .base import Episode, PooledService, report, utc_now
from .edge import Edge, Timer, awaited, shared_edge
from .files import private_dir
from .registry import (
    PROBE_TIMEOUT_S,
    IdentityError,
    PeerIdentity,
    endpoint_accepts,
    remove_entry_if_ours,
    resolve_identity,
    write_entry,
)
from .responses import ResponsePool, send_envelope, shared_responses

__all__ = [
    "EndpointInUse",
    "IdentityError",
    "Listener",
    "PeerActor",
    "PeerIdentity",
    "ResponsePool",
    "bind_endpoint",
    "resolve_identity",
    "send_envelope",
]

MODEL = "hermes-bridge"
COLOR = "#38BDF8"
MAX_LINE = 65536
LINE_DEADLINE_S = 10.0  # for a whole request line, however it trickles in
REPLY_GRACE_S = 5.0  # for writing the reply once the line is in
MAX_CONNECTIONS = 64
ADMIT_TIMEOUT_S = 5.0  # for the Router to store a question before it is acked anyway
DEPTH_TIMEOUT_S = 2.0  # for the Router's open count; the last one seen is used after
ACCEPT_PAUSE_S = 0.1  # after accept() ran out of descriptors
ACCEPT_BATCH = 64
JOIN_TIMEOUT_S = 1.0

LINE_TOO_LARGE = "line too large"
INVALID_JSON = "invalid json"
NOT_TAKEN = "bridge accepts prompts, cancels, and pings"
INVALID_PROMPT = "invalid prompt envelope"
INVALID_CANCEL = "invalid cancel envelope"
BUSY = "bridge is busy: too many connections; try again"


class EndpointInUse(RuntimeError):
    """Another live process answers on our endpoint path (W11); we must not steal it."""


class _LineTooLarge(Exception):
    pass


def _take_line(buffer: bytes, eof: bool) -> tuple[bytes | None, bool]:
    """(the first non-blank line, done) from what a client sent so far.

    Done with no line: the client sent nothing but blank lines before EOF.
    Not done: more bytes are needed. The tail at EOF counts as a line (W12).
    """
    while b"\n" in buffer:
        line, _, buffer = buffer.partition(b"\n")
        if len(line) > MAX_LINE:
            raise _LineTooLarge
        if line.strip():
            return line, True
    if len(buffer) > MAX_LINE:
        raise _LineTooLarge
    if eof:
        return (buffer if buffer.strip() else None), True
    return None, False


def _refusal(kind: str, exc: ValidationError) -> str:
    """The nack for an envelope that is not one: `kind`, and the field when its text
    is not valid Unicode (X12); other faults keep the pool's plain words (W14)."""
    why = invalid_text(exc)
    return kind if why is None else f"{kind}: {why}"


def _reject_constant(name: str) -> Any:
    """JSON.parse refuses NaN and Infinity, so the pool would call such a line invalid."""
    raise ValueError(f"not JSON: {name}")


_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

Admit = Callable[[PromptEnvelope, Callable[[str | None], None]], None]
"""Hand a prompt to admission; the callback gets None (ack) or the nack's error."""
Depth = Callable[[Callable[[int], None]], None]
"""Ask for the open count; the callback gets it."""


class Listener:
    """Reads request lines for every client on the edge and answers each (W12-W17).

    Kept apart from the actor so that a slow or hostile client never reaches
    the actor's mailbox. Every limit is fixed: at most `max_connections` open
    at once (the next one gets a `bridge is busy` nack and is closed at once),
    and a whole request line within `line_deadline_s` (a client trickling one
    byte a second is dropped when it runs out, however often it sends). A
    client costs a descriptor, its buffer and a task on the loop: no thread.
    """

    def __init__(
        self,
        server: socket.socket,
        questions: Address,
        pong_card: Callable[[int | None], AgentCard],
        admit: Admit | None = None,
        depth: Depth | None = None,
        *,
        edge: Edge | None = None,
        max_connections: int = MAX_CONNECTIONS,
        line_deadline_s: float = LINE_DEADLINE_S,
    ) -> None:
        server.setblocking(False)  # accept() in a batch must never wait
        self._server = server
        self._questions = questions
        self._pong_card = pong_card
        self._admit = admit or (lambda prompt, reply: questions.tell(NewQuestion(prompt, reply)))
        self._depth = depth or (lambda reply: questions.tell(QueueDepthQuery(reply)))
        self.edge = edge or shared_edge()
        self.max_connections = max_connections
        self.line_deadline_s = line_deadline_s
        self._clients: set[asyncio.Task[None]] = set()
        self._broken = False  # the listening socket could not be watched: restart the Peer
        self._stopped = False
        self._refused = Episode()  # connections refused while the cap was reached
        self._short = Episode()  # accept() out of descriptors

    @property
    def open_connections(self) -> int:
        return len(self._clients)

    @property
    def serving(self) -> bool:
        """False once the listening socket could not be watched (the heartbeat then fails
        the Peer, and its restart binds afresh); a pause for descriptors is still serving."""
        return not self._broken

    def start(self) -> None:
        self.edge.call(self._listen, self._server)

    def stop(self) -> None:
        """Stop listening and drop every client, on the loop (waiting briefly for it when
        called from another thread)."""
        done = concurrent.futures.Future[None]()
        if self.edge.on_loop():
            self._shut(done)
            return
        self.edge.call(self._shut, done)
        with contextlib.suppress(concurrent.futures.TimeoutError):
            done.result(JOIN_TIMEOUT_S)

    def replace_server(self, server: socket.socket) -> None:
        """Serve on a newly bound socket (the old path was deleted under us)."""
        server.setblocking(False)
        self.edge.call(self._swap, server)

    # -- on the loop ----------------------------------------------------------

    def _listen(self, server: socket.socket) -> None:
        if self._stopped:
            server.close()
            return
        try:
            self.edge.loop.add_reader(server.fileno(), self._accept, server)
        except (ValueError, OSError) as exc:  # closed meanwhile
            self._broken = True
            report(f"cannot listen for coms connections: {exc}", "error")

    def _unlisten(self, server: socket.socket) -> None:
        with contextlib.suppress(ValueError, OSError):
            self.edge.loop.remove_reader(server.fileno())
        with contextlib.suppress(OSError):
            server.close()

    def _swap(self, server: socket.socket) -> None:
        old, self._server = self._server, server
        self._unlisten(old)
        self._listen(server)

    def _shut(self, done: concurrent.futures.Future[None]) -> None:
        self._stopped = True
        self._unlisten(self._server)
        for task in list(self._clients):
            task.cancel()
        done.set_result(None)

    def _accept(self, server: socket.socket) -> None:
        """Take every waiting connection; out of descriptors, pause and try again."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = server.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if self._stopped or server is not self._server:
                    return
                if exc.errno in _SHORTAGE and self._short.happened():
                    report(f"cannot accept a coms connection: {exc.strerror or exc}; "
                           f"retrying every {ACCEPT_PAUSE_S:g}s", "warning")
                elif exc.errno not in _SHORTAGE:
                    report(f"cannot accept a coms connection: {exc}", "warning")
                self._unlisten_for(server, ACCEPT_PAUSE_S)
                return
            if self._short.over():
                report("accepting coms connections again", "info")
            if len(self._clients) >= self.max_connections:
                self._refuse(conn)
                continue
            refused = self._refused.over()
            if refused:
                report(f"refused {refused} coms connection(s) while "
                       f"{self.max_connections} were open", "warning")
            conn.setblocking(False)
            task = self.edge.loop.create_task(self._client(conn))
            self._clients.add(task)
            task.add_done_callback(self._clients.discard)

    def _unlisten_for(self, server: socket.socket, pause: float) -> None:
        """Stop reading the listening socket for a while (its backlog waits meanwhile)."""
        loop = self.edge.loop
        loop.remove_reader(server.fileno())

        def resume() -> None:
            if server is self._server and not self._stopped:
                self._listen(server)

        loop.call_later(pause, resume)

    def _refuse(self, conn: socket.socket) -> None:
        """Past the connection cap: a nack if it fits in the socket buffer, then close."""
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
        """Exactly one reply line per connection; never raise."""
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
        except Exception as exc:
            report(f"error serving a coms connection: {exc!r}")
        finally:
            # a well-formed cancel is handled even if its sender left before the ack
            if then is not None:
                try:
                    then()
                except Exception as exc:
                    report(f"error handing on a coms envelope: {exc!r}")

    @staticmethod
    async def _read_line(
        loop: asyncio.AbstractEventLoop, conn: socket.socket
    ) -> bytes | type[_LineTooLarge] | None:
        buffer = bytearray()
        while True:
            chunk = await loop.sock_recv(conn, MAX_LINE)
            buffer += chunk
            if chunk and b"\n" not in chunk and len(buffer) <= MAX_LINE:
                continue  # still mid-line: no need to look at the whole buffer again
            try:
                found, done = _take_line(bytes(buffer), eof=not chunk)
            except _LineTooLarge:
                return _LineTooLarge
            if done:
                return found

    async def reply_to(self, line: bytes) -> tuple[WireModel, Callable[[], None] | None]:
        """The reply for one line, and what to do once it is written.

        A prompt is admitted (stored) before its ack, so an ack means the
        question survives a crash; a cancel is acked first and handled after
        (C12).
        """
        try:
            body = loads(line.decode("utf-8"), parse_constant=_reject_constant)
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
            def admit(reply: Callable[[str | None], None]) -> None:
                self._admit(prompt, reply)

            error: str | None
            try:
                error = await awaited(admit, ADMIT_TIMEOUT_S)
            except TimeoutError:
                report(f"question {prompt.msg_id} is queued but was not stored within "
                       f"{ADMIT_TIMEOUT_S:g}s; acking it anyway")
                error = None
            except Exception as exc:  # unforeseen: our words to the peer, the cause to stderr
                report(f"could not take question {prompt.msg_id!r}: {exc!r}", "error")
                error = NOT_ADMITTED
            if error is not None:
                return Nack(msg_id=prompt.msg_id, error=error), None
            return Ack(msg_id=prompt.msg_id), None
        if kind == "cancel":
            try:
                cancel = CancelEnvelope.model_validate(body)
            except ValidationError as exc:
                return Nack(msg_id=msg_id, error=_refusal(INVALID_CANCEL, exc)), None
            return Ack(msg_id=cancel.msg_id), lambda: self._questions.tell(CancelQuestion(cancel))
        if kind == "ping":
            try:
                depth: int | None = await awaited(self._depth, DEPTH_TIMEOUT_S)
            except TimeoutError:
                depth = None
            return Pong(msg_id=msg_id, agent_card=self._pong_card(depth)), None
        return Nack(msg_id=msg_id, error=NOT_TAKEN), None


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


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
    except BaseException:
        server.close()
        raise
    return server


class PeerActor(PooledService):
    """Owns the coms identity: socket, registry entry, heartbeat, outgoing responses."""

    def __init__(
        self,
        *,
        supervisor: Address,
        identity: PeerIdentity,
        questions: Address,
        depth: Depth | None = None,
        admit: Admit | None = None,
        settle: Callable[[str, str | None], None] | None = None,
        logger: Address | None = None,
        name: str = "peer",
        purpose: str = "Remote human via Hermes/Telegram",
        heartbeat_s: float = 30.0,
        response_timeout_s: float = 10.0,
        retry_pauses_s: tuple[float, ...] = (2.0, 10.0),
        responses: ResponsePool | None = None,
        edge: Edge | None = None,
    ) -> None:
        super().__init__(name, supervisor)
        self.identity = identity
        self.questions = questions
        self.edge = edge or shared_edge()
        self.depth = depth or (lambda reply: questions.tell(QueueDepthQuery(reply)))
        self.admit = admit
        self.settle = settle
        self.logger = logger
        self.purpose = purpose
        self.heartbeat_s = heartbeat_s
        self.response_timeout_s = response_timeout_s
        self.retry_pauses_s = retry_pauses_s
        self.responses = responses or shared_responses()
        self._last_depth = 0
        self._listener: Listener | None = None
        self._bound = False
        self._published = False
        self._beat: Timer | None = None
        self._asked_depth = False  # a depth asked for and not answered yet
        self._released = False
        self._failing = Episode()  # the registry entry cannot be written

    # -- life ---------------------------------------------------------------

    def begin(self) -> None:
        """Listen first and publish last: the entry's appearance means "ready" (W7)."""
        self._heal()  # a restart after the directories were deleted finds them again
        server = bind_endpoint(self.identity.endpoint)
        self._bound = True
        self._listener = Listener(server, self.questions, self._card, self.admit, self.depth)
        self._listener.start()
        self._publish(self._last_depth)
        self._next_beat()

    def release(self) -> None:
        """Undo on_start in reverse: unpublish before the socket stops answering (W8)."""
        if self._released:
            return
        self._released = True
        try:
            if self._beat is not None:
                self._beat.cancel()
            if self._published:
                remove_entry_if_ours(self.identity.entry_path, self.identity.session_id)
                self._published = False
            if self._listener is not None:
                self._listener.stop()
            if self._bound:
                with contextlib.suppress(OSError):
                    self.identity.endpoint.unlink()
                self._bound = False
        except Exception as exc:  # release must never raise: it runs inside failure handling
            report(f"peer release: {exc!r}")

    # -- mailbox ------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        match message:
            case HeartbeatDue():
                self._next_beat()
                if self._asked_depth:  # the Router is slow: beat with the last count
                    self._heartbeat(self._last_depth)
                else:
                    self._asked_depth = True
                    me = self.actor_ref
                    self.depth(lambda depth: _tell(me, Heartbeat(depth)))
            case Heartbeat(queue_depth=depth):
                self._asked_depth = False
                self._last_depth = depth
                self._heartbeat(depth)
            case SendResponse(prompt=prompt, response=response, error=error, owner=owner):
                self._send_response(prompt, response, error, owner)
            case _:
                raise UnknownMessage(self.child_name, message)
        return None

    # -- helpers ------------------------------------------------------------

    def _publish(self, depth: int) -> None:
        """W5, W6: (re)write our entry atomically with a fresh heartbeat."""
        ident = self.identity
        entry = RegistryEntry(
            session_id=ident.session_id,
            name=ident.name,
            purpose=self.purpose,
            model=MODEL,
            color=COLOR,
            pid=ident.pid,
            endpoint=str(ident.endpoint),
            cwd=ident.cwd,
            started_at=ident.started_at,
            explicit=False,
            version=1,
            context_used_pct=0,
            queue_depth=depth,
            heartbeat_at=iso(utc_now()),
        )
        write_entry(ident.entry_path, entry)
        self._published = True

    def _heartbeat(self, depth: int) -> None:
        """W6, healing what was deleted under us; a failed write waits for the next beat.

        A registry or sockets directory removed by hand (or by a clean-up job)
        is made again, and a deleted socket path is bound again, so the pool
        finds us within one beat. A write that fails (out of descriptors, disk
        full) is reported once, never a crash: restarting would not help.
        """
        if self._listener is not None and not self._listener.serving:
            raise RuntimeError("the coms listener stopped")
        try:
            self._heal()
            self._publish(depth)
        except OSError as exc:
            if self._failing.happened():
                report(f"cannot write the registry entry {self.identity.entry_path}: {exc}; "
                       "trying again at every heartbeat", "error")
            return
        if self._failing.over():
            report(f"registry entry {self.identity.entry_path} written again", "info")

    def _heal(self) -> None:
        ident = self.identity
        for directory in (ident.agents_dir, ident.endpoint.parent):
            if not directory.is_dir():
                private_dir(directory, tighten=False)
                report(f"{directory} was gone; made it again (0700)", "warning")
        if self._listener is not None and not _is_socket(ident.endpoint):
            self._listener.replace_server(bind_endpoint(ident.endpoint))
            report(f"{ident.endpoint} was gone; listening on it again", "warning")

    def _card(self, depth: int | None) -> AgentCard:
        """W17: our agent card for a pong (on the edge), with the Router's count or,
        when it did not answer in time, the last one seen."""
        if depth is None:
            depth = self._last_depth
        else:
            self._last_depth = depth
        return AgentCard(
            name=self.identity.name,
            purpose=self.purpose,
            model=MODEL,
            color=COLOR,
            context_used_pct=0,
            queue_depth=depth,
        )

    def _next_beat(self) -> None:
        """W6: the next heartbeat, `heartbeat_s` from now."""
        me = self.actor_ref
        self._beat = self.edge.after(self.heartbeat_s, lambda: _tell(me, HeartbeatDue()))

    def _settle(self, qid: str, owner: str | None) -> None:
        """The response is no longer owed: take it out of the durable outbox."""
        if self.settle is None:
            return
        try:
            self.settle(qid, owner)
        except Exception as exc:
            report(f"could not record the response for {qid} as sent: {exc!r}")

    def _undelivered(self, qid: str, reason: str) -> None:
        """The asker is gone: say so on stderr and in the bridge log; the question stays closed."""
        report(f"could not deliver response for {qid}: {reason}", "error")
        if self.logger is not None:
            record = log_record(
                utc_now(), qid if is_valid_qid(qid) else None, "response_failed", {"error": reason}
            )
            self.logger.tell(LogEvent(record))

    def _send_response(
        self, prompt: PromptEnvelope, response: Any, error: str | None, owner: str | None
    ) -> None:
        """W15, through the response pool: an asker's socket must never stall our mailbox."""
        try:
            envelope = ResponseEnvelope(
                msg_id=prompt.msg_id,
                sender_session=self.identity.session_id,
                sender_endpoint=str(self.identity.endpoint),
                hops=0,
                timestamp=iso(utc_now()),
                response=response,
                error=error,
            )
            line = envelope.to_line()
        except Exception as exc:  # it will never serialise: do not owe it forever
            self._undelivered(prompt.msg_id, repr(exc))
            self._settle(prompt.msg_id, owner)
            return
        qid = prompt.msg_id
        endpoint = prompt.sender_endpoint
        timeout = self.response_timeout_s

        def settled(reason: str | None) -> None:
            if reason is not None:
                self._undelivered(qid, reason)
            self._settle(qid, owner)  # answered, or the asker is gone for good

        if not self.responses.submit(qid, endpoint, line, timeout, self.retry_pauses_s, settled):
            # Refused, never dropped: it stays in the outbox (not settled) and
            # is sent again at the next start.
            report(
                f"response for {qid} not sent now: {self.responses.capacity} responses are "
                f"already being sent (the limit); it stays owed in the state database and "
                "is sent at the next start",
                "error",
            )


def _tell(ref: Any, message: Any) -> None:
    """From the edge: an actor that stopped meanwhile needs to hear nothing more."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)
