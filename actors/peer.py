"""The PeerActor: the bridge's face in the coms pool (W3, W5-W8, W11-W17).

It owns the listening socket, the registry entry and the heartbeat, and it
sends response envelopes to askers. Everything that blocks (accept, reading a
client, connecting to an asker, asking the router for the queue depth) runs in
helper threads, so the actor's own mailbox only ever holds quick work:
rewriting the entry and starting a response sender.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..messages.commands import (
    Address,
    AdmissionRefused,
    CancelQuestion,
    Heartbeat,
    LogEvent,
    NewQuestion,
    SendResponse,
    UnknownMessage,
)
from ..messages.contract import iso, log_record
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
from .responses import ResponsePool, send_envelope

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
HANDLER_THREADS = 8
ACCEPT_POLL_S = 0.5
ACCEPT_PAUSE_S = 0.1  # after accept() ran out of descriptors
ACCEPT_BATCH = 64
JOIN_TIMEOUT_S = 1.0

LINE_TOO_LARGE = "line too large"
INVALID_JSON = "invalid json"
NOT_TAKEN = "bridge accepts prompts, cancels, and pings"
INVALID_PROMPT = "invalid prompt envelope"
INVALID_CANCEL = "invalid cancel envelope"
NOT_ADMITTED = "bridge could not take the question (internal error)"
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


@dataclass
class _Client:
    """One accepted connection still sending its request line."""

    conn: socket.socket
    deadline: float
    buffer: bytearray = field(default_factory=bytearray)


_Line = bytes | type[_LineTooLarge]


class Listener:
    """Reads request lines for many clients in one thread; a small pool answers them (W12-W17).

    Kept apart from the actor so that a slow or hostile client never reaches
    the actor's mailbox. Every limit is fixed: at most `max_connections` open
    at once (the next one gets a `bridge is busy` nack and is closed at once),
    a whole request line within `line_deadline_s` (a client trickling one
    byte a second is dropped when it runs out, however often it sends), and
    `handlers` threads to admit and answer complete lines. A client that
    waits costs a descriptor and its buffer, never a thread.
    """

    def __init__(
        self,
        server: socket.socket,
        questions: Address,
        pong_card: Callable[[], AgentCard],
        admit: Callable[[PromptEnvelope], None] | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        handlers: int = HANDLER_THREADS,
        line_deadline_s: float = LINE_DEADLINE_S,
    ) -> None:
        server.setblocking(False)  # accept() in a batch must never wait
        self._server = server
        self._questions = questions
        self._pong_card = pong_card
        self._admit = admit or (lambda prompt: questions.tell(NewQuestion(prompt)))
        self.max_connections = max_connections
        self.line_deadline_s = line_deadline_s
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._open = 0  # accepted and not yet closed, wherever they are
        self._ready: queue.Queue[tuple[socket.socket, _Line, float] | None] = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._serve, name="peer-listener", daemon=True)
        self._handlers = [
            threading.Thread(target=self._answer, name=f"peer-handler-{n}", daemon=True)
            for n in range(handlers)
        ]
        self._refused = Episode()  # connections refused while the cap was reached
        self._short = Episode()  # accept() out of descriptors

    @property
    def open_connections(self) -> int:
        with self._lock:
            return self._open

    def start(self) -> None:
        for handler in self._handlers:
            handler.start()
        self._thread.start()

    def stop(self) -> None:
        """Close the listening socket and wake the loop, then wait briefly for it."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._server.close()
        self._wake()
        for _ in self._handlers:
            self._ready.put(None)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)

    def replace_server(self, server: socket.socket) -> None:
        """Serve on a newly bound socket (the old path was deleted under us)."""
        server.setblocking(False)
        old, self._server = self._server, server
        self._wake()
        with contextlib.suppress(OSError):
            old.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- the reading thread ---------------------------------------------------

    def _serve(self) -> None:
        clients: dict[int, _Client] = {}
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        server: socket.socket | None = None
        paused_until = 0.0
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                wanted = self._server if now >= paused_until else None
                if wanted is not server:
                    if server is not None:
                        with contextlib.suppress(KeyError, ValueError, OSError):
                            selector.unregister(server)
                    server = None
                    if wanted is not None:
                        try:
                            selector.register(wanted, selectors.EVENT_READ)
                            server = wanted
                        except (ValueError, OSError):  # closed by stop() or replace_server()
                            paused_until = now + ACCEPT_PAUSE_S
                soonest = min((c.deadline for c in clients.values()), default=now + ACCEPT_POLL_S)
                if server is None:
                    soonest = min(soonest, paused_until)
                timeout = max(0.0, min(soonest - now, ACCEPT_POLL_S))
                for key, _ in selector.select(timeout):
                    if key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    elif key.fileobj is server:
                        if not self._accept(server, selector, clients):
                            paused_until = time.monotonic() + ACCEPT_PAUSE_S
                    else:
                        self._receive(key.fd, selector, clients)
                now = time.monotonic()
                for fd in [fd for fd, c in clients.items() if c.deadline <= now]:
                    self._drop(fd, selector, clients)  # no whole line in time
        except Exception as exc:  # say why: the heartbeat restarts a dead loop
            report(f"coms listener stopped: {exc!r}", "error")
        finally:
            for fd in list(clients):
                self._drop(fd, selector, clients)
            selector.close()
            for sock in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    sock.close()

    @property
    def serving(self) -> bool:
        return self._thread.is_alive()

    def _accept(
        self, server: socket.socket, selector: selectors.BaseSelector, clients: dict[int, _Client]
    ) -> bool:
        """Take every waiting connection; False when out of descriptors (pause, retry)."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = server.accept()
            except (BlockingIOError, TimeoutError):
                break
            except OSError as exc:
                if self._stopping.is_set() or server is not self._server:
                    return True
                if exc.errno in _SHORTAGE:
                    if self._short.happened():
                        report(f"cannot accept a coms connection: {exc.strerror or exc}; "
                               f"retrying every {ACCEPT_PAUSE_S:g}s", "warning")
                    return False
                report(f"cannot accept a coms connection: {exc}", "warning")
                return False
            if self._short.over():
                report("accepting coms connections again", "info")
            with self._lock:
                full = self._open >= self.max_connections
                if not full:
                    self._open += 1
            if full:
                self._refuse(conn)
                continue
            refused = self._refused.over()
            if refused:
                report(f"refused {refused} coms connection(s) while "
                       f"{self.max_connections} were open", "warning")
            conn.setblocking(False)
            clients[conn.fileno()] = _Client(conn, time.monotonic() + self.line_deadline_s)
            selector.register(conn, selectors.EVENT_READ)
        return True

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

    def _receive(
        self, fd: int, selector: selectors.BaseSelector, clients: dict[int, _Client]
    ) -> None:
        client = clients.get(fd)
        if client is None:
            return
        try:
            chunk = client.conn.recv(MAX_LINE)
        except BlockingIOError:
            return
        except OSError:
            self._drop(fd, selector, clients)
            return
        client.buffer += chunk
        found: _Line | None
        if chunk and b"\n" not in chunk and len(client.buffer) <= MAX_LINE:
            return  # still mid-line: no need to look at the whole buffer again
        try:
            found, done = _take_line(bytes(client.buffer), eof=not chunk)
        except _LineTooLarge:
            found, done = _LineTooLarge, True
        if not done:
            return
        del clients[fd]
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(client.conn)
        if found is None:
            self._close(client.conn)  # W12: nothing said, nothing answered
            return
        self._ready.put((client.conn, found, client.deadline))

    def _drop(self, fd: int, selector: selectors.BaseSelector, clients: dict[int, _Client]) -> None:
        client = clients.pop(fd)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(client.conn)
        self._close(client.conn)

    def _close(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.close()
        with self._lock:
            self._open -= 1

    # -- the answering threads --------------------------------------------------

    def _answer(self) -> None:
        while True:
            item = self._ready.get()
            if item is None:
                return
            conn, found, deadline = item
            try:
                self._handle(conn, found, deadline)
            finally:
                self._close(conn)

    def _handle(self, conn: socket.socket, found: _Line, deadline: float) -> None:
        """Exactly one reply line per connection; never raise."""
        then: Callable[[], None] | None = None
        try:
            conn.setblocking(True)
            conn.settimeout(max(deadline - time.monotonic(), 0) + REPLY_GRACE_S)
            if not isinstance(found, bytes):
                conn.sendall(Nack(msg_id="", error=LINE_TOO_LARGE).to_line())
                return
            reply, then = self.reply_to(found)
            conn.sendall(reply.to_line())
        except OSError:
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

    def reply_to(self, line: bytes) -> tuple[WireModel, Callable[[], None] | None]:
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
            try:
                self._admit(prompt)
            except AdmissionRefused as exc:  # full, its asker's share, not its qid (X2): as is
                return Nack(msg_id=prompt.msg_id, error=str(exc)), None
            except Exception as exc:  # unforeseen: our words to the peer, the cause to stderr
                report(f"could not take question {prompt.msg_id!r}: {exc!r}", "error")
                return Nack(msg_id=prompt.msg_id, error=NOT_ADMITTED), None
            return Ack(msg_id=prompt.msg_id), None
        if kind == "cancel":
            try:
                cancel = CancelEnvelope.model_validate(body)
            except ValidationError as exc:
                return Nack(msg_id=msg_id, error=_refusal(INVALID_CANCEL, exc)), None
            return Ack(msg_id=cancel.msg_id), lambda: self._questions.tell(CancelQuestion(cancel))
        if kind == "ping":
            return Pong(msg_id=msg_id, agent_card=self._pong_card()), None
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
        server.settimeout(ACCEPT_POLL_S)  # a safety net should shutdown() not wake accept()
    except BaseException:
        server.close()
        raise
    return server


_RESPONSES = ResponsePool()


class PeerActor(PooledService):
    """Owns the coms identity: socket, registry entry, heartbeat, outgoing responses."""

    def __init__(
        self,
        *,
        supervisor: Address,
        identity: PeerIdentity,
        questions: Address,
        queue_depth: Callable[[], int],
        admit: Callable[[PromptEnvelope], None] | None = None,
        settle: Callable[[str, str | None], None] | None = None,
        logger: Address | None = None,
        name: str = "peer",
        purpose: str = "Remote human via Hermes/Telegram",
        heartbeat_s: float = 30.0,
        response_timeout_s: float = 10.0,
        retry_pauses_s: tuple[float, ...] = (2.0, 10.0),
        responses: ResponsePool | None = None,
    ) -> None:
        super().__init__(name, supervisor)
        self.identity = identity
        self.questions = questions
        self.queue_depth = queue_depth
        self.admit = admit
        self.settle = settle
        self.logger = logger
        self.purpose = purpose
        self.heartbeat_s = heartbeat_s
        self.response_timeout_s = response_timeout_s
        self.retry_pauses_s = retry_pauses_s
        self.responses = responses or _RESPONSES
        self._last_depth = 0
        self._listener: Listener | None = None
        self._bound = False
        self._published = False
        self._beating = threading.Event()
        self._heart: threading.Thread | None = None
        self._released = False
        self._failing = Episode()  # the registry entry cannot be written

    # -- life ---------------------------------------------------------------

    def begin(self) -> None:
        """Listen first and publish last: the entry's appearance means "ready" (W7)."""
        self._heal()  # a restart after the directories were deleted finds them again
        server = bind_endpoint(self.identity.endpoint)
        self._bound = True
        self._listener = Listener(server, self.questions, self._card, self.admit)
        self._listener.start()
        self._publish(self._last_depth)
        self._heart = threading.Thread(target=self._beat, name="peer-heartbeat", daemon=True)
        self._heart.start()

    def release(self) -> None:
        """Undo on_start in reverse: unpublish before the socket stops answering (W8)."""
        if self._released:
            return
        self._released = True
        try:
            # Not joined: it may sit in a queue-depth ask for a while, and it
            # checks this flag before it does anything else.
            self._beating.set()
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
            case Heartbeat(queue_depth=depth):
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

    def _current_depth(self) -> int:
        """The router's count, or the last one we saw when it does not answer in time."""
        try:
            depth = int(self.queue_depth())
        except Exception:
            return self._last_depth
        self._last_depth = depth
        return depth

    def _card(self) -> AgentCard:
        """W17: our agent card for a pong; runs in a connection thread."""
        return AgentCard(
            name=self.identity.name,
            purpose=self.purpose,
            model=MODEL,
            color=COLOR,
            context_used_pct=0,
            queue_depth=self._current_depth(),
        )

    def _beat(self) -> None:
        """W6: ask for the depth here, off the actor thread, and hand it to the actor."""
        while not self._beating.wait(self.heartbeat_s):
            depth = self._current_depth()
            if self._beating.is_set():
                return
            try:
                self.actor_ref.tell(Heartbeat(depth))
            except Exception:  # the actor is gone; so is our reason to beat
                return

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

        try:
            queued = self.responses.submit(
                qid, endpoint, line, timeout, self.retry_pauses_s, settled
            )
        except (RuntimeError, OSError) as exc:  # the sender thread could not start
            queued = False
            report(f"cannot send the response for {qid} now: {exc}", "error")
        if not queued:
            # Refused, never dropped: it stays in the outbox (not settled) and
            # is sent again at the next start.
            report(
                f"response for {qid} not sent now: {self.responses.pending} responses are "
                f"already being sent (limit {self.responses.capacity}); it stays owed in "
                "the state database and is sent at the next start",
                "error",
            )
