"""The bridge's face in the coms pool (W3, W5-W8, W11-W17). Whatever waits (a client
trickling its line, the Router's word on a prompt, an asker's ack) waits on the loop, so
a slow or hostile peer never reaches the actor's mailbox and costs no thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from ..messages.contract import iso, log_record
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
    is_valid_qid,
    loads,
    loads_envelope,
)
from .files import private_dir
from .loop import Edge, Episode, Spawned, awaited, report, shared_edge, tell_quietly
from .registry import (
    PROBE_TIMEOUT_S,
    PeerIdentity,
    endpoint_accepts,
    remove_entry_if_ours,
    write_entry,
)
from .supervision import PooledChild, Slot

if TYPE_CHECKING:
    from .supervisor import Wiring

MODEL = "hermes-bridge"
COLOR = "#38BDF8"
PURPOSE = "Remote human via Hermes/Telegram"
MAX_LINE = 65536
LINE_DEADLINE_S = 10.0  # for a whole request line, however it trickles in
REPLY_GRACE_S = 5.0  # for writing the reply once the line is in
MAX_CONNECTIONS = 64
ADMIT_TIMEOUT_S = 5.0  # for the Router to take a question before it is refused
DEPTH_TIMEOUT_S = 2.0  # for the Router's open count; the last one seen is used after
ACCEPT_PAUSE_S = 0.1  # after accept() ran out of descriptors
ACCEPT_BATCH = 64
RESPONSE_TIMEOUT_S = 10.0  # for an asker to ack one attempt
RETRY_PAUSES_S = (2.0, 10.0)

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


def _take_line(buffer: bytearray, eof: bool) -> tuple[bytes | None, bool]:
    """(the first non-blank line, done) from what a client sent so far: done with no
    line when it sent only blank lines; the tail at EOF counts as a line (W12). The
    blank lines are cut from `buffer` in one step, so a flood of them costs its length
    once, not a turn per line."""
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
    """One request line from every client, answered (W12-W17). The limits are fixed, so
    no client can cost more than a descriptor, its buffer and a task: the next past
    `max_connections` gets a `busy` nack, and a line trickled past `line_deadline_s` none."""

    def __init__(self, server: socket.socket, router: Address,
                 pong_card: Callable[[int | None], AgentCard], *,
                 edge: Edge | None = None,
                 max_connections: int = MAX_CONNECTIONS,
                 line_deadline_s: float = LINE_DEADLINE_S) -> None:
        server.setblocking(False)  # accept() in a batch must never wait
        self._server = server
        self._router = router
        self._pong_card = pong_card
        self.edge = edge or shared_edge()
        self.max_connections = max_connections
        self.line_deadline_s = line_deadline_s
        self._clients: set[asyncio.Task[None]] = set()
        self._broken = False  # the socket could not be watched: the Peer must restart
        self._stopped = False
        self._refused = Episode()  # connections refused while the cap was reached
        self._short = Episode()  # accept() out of descriptors

    @property
    def serving(self) -> bool:
        """False once the socket could not be watched (a pause for descriptors still serves)."""
        return not self._broken

    def start(self) -> None:
        self.edge.call(self._listen, self._server)

    def stop(self) -> None:
        """Stop listening and drop every client, soon, on the loop."""
        self.edge.call(self._shut)

    def replace_server(self, server: socket.socket) -> None:
        """Serve on a newly bound socket (the old path was deleted under us)."""
        server.setblocking(False)
        self.edge.call(self._swap, server)

    # -- on the loop --------------------------------------------------------

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

    def _shut(self) -> None:
        self._stopped = True
        self._unlisten(self._server)
        for task in list(self._clients):
            task.cancel()

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
                self.edge.loop.remove_reader(server.fileno())  # its backlog waits meanwhile
                self.edge.loop.call_later(ACCEPT_PAUSE_S, self._resume, server)
                return
            if self._short.over():
                report("accepting coms connections again", "info")
            if len(self._clients) >= self.max_connections:
                self._refuse(conn)
                continue
            if refused := self._refused.over():
                report(f"refused {refused} coms connection(s) while "
                       f"{self.max_connections} were open", "warning")
            conn.setblocking(False)
            task = self.edge.loop.create_task(self._client(conn))
            self._clients.add(task)
            task.add_done_callback(self._clients.discard)

    def _resume(self, server: socket.socket) -> None:
        if server is self._server and not self._stopped:
            self._listen(server)

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
                continue  # still mid-line: no need to look at the whole buffer again
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

    async def _admit(self, prompt: PromptEnvelope) -> str | None:
        """The Router's verdict on a prompt. One it has not taken within ADMIT_TIMEOUT_S
        is withdrawn and refused, so that an ack always means stored: the asker tries
        again, as after any nack, and an identical resend is acked once stored (X2)."""
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
        # taken meanwhile: the Router sets its verdict in the same turn; it is on its way
        return await asyncio.wait_for(waiting, REPLY_GRACE_S)

    async def reply_to(self, line: bytes) -> tuple[WireModel, Callable[[], None] | None]:
        """The reply for one line, and what to do once it is written: a prompt is acked
        once stored (an ack means it survives a crash); a cancel is acked first (C12)."""
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
            restarting = isinstance(self._router, Slot) and self._router.ref is None
            error = RESTARTING if restarting else await self._admit(prompt)
            if error is not None:
                return Nack(msg_id=prompt.msg_id, error=error), None
            return Ack(msg_id=prompt.msg_id), None
        if kind == "cancel":
            try:
                cancel = CancelEnvelope.model_validate(body)
            except ValidationError as exc:
                return Nack(msg_id=msg_id, error=_refusal(INVALID_CANCEL, exc)), None
            return Ack(msg_id=cancel.msg_id), lambda: self._router.tell(CancelQuestion(cancel))
        if kind == "ping":
            try:
                depth: int | None = await awaited(
                    lambda reply: self._router.tell(QueueDepthQuery(reply)), DEPTH_TIMEOUT_S)
            except TimeoutError:
                depth = None
            return Pong(msg_id=msg_id, agent_card=self._pong_card(depth)), None
        return Nack(msg_id=msg_id, error=NOT_TAKEN), None


# -- responses to askers (W15) ----------------------------------------------------

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
    on the loop once per response (None when acked); it must be quick and never raise."""

    def __init__(self, capacity: int = RESPONSE_QUEUE, flights: int = FLIGHTS,
                 edge: Edge | None = None) -> None:
        self.capacity = capacity
        self.edge = edge or shared_edge()
        self._flights = asyncio.Semaphore(flights)  # bound to the loop at its first use
        self._sends: set[Spawned[None]] = set()  # submitted, not done

    def submit(self, endpoint: str, line: bytes, timeout: float,
               pauses: tuple[float, ...], done: Callable[[str | None], None]) -> bool:
        """Queue a send; False (nothing queued) past `capacity`. From one thread at a time
        (the Peer's turns): a send's discard always follows its add."""
        if len(self._sends) >= self.capacity:
            return False
        send = self.edge.spawn(self._send(endpoint, line, timeout, pauses, done))
        self._sends.add(send)
        send.add_done_callback(self._sends.discard)
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
    except Exception as exc:  # a path no socket can have, say: final, it stays so
        return failure(exc), True


@functools.cache
def shared_responses() -> ResponsePool:
    """The process's response sender, made on first use: it outlives every Peer."""
    return ResponsePool()



# -- the actor --------------------------------------------------------------------------


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


class PeerActor(PooledChild):
    """Owns the coms identity: socket, registry entry, heartbeat, outgoing responses."""

    def __init__(self, wiring: Wiring, *, supervisor: Address, identity: PeerIdentity,
                 name: str = "peer", responses: ResponsePool | None = None) -> None:
        super().__init__(name, supervisor)
        self.w = wiring
        self.identity = identity
        self.heartbeat_s = wiring.config.heartbeat_ms / 1000
        self.responses = responses or shared_responses()
        self._last_depth = 0
        self._listener: Listener | None = None
        self._bound = self._published = self._asked_depth = False
        self._beat: asyncio.TimerHandle | None = None
        self._failing = Episode()  # the registry entry cannot be written

    def begin(self) -> None:
        """Listen first and publish last: the entry's appearance means "ready" (W7)."""
        self._heal()  # a restart after the directories were deleted finds them again
        server = bind_endpoint(self.identity.endpoint)
        self._bound = True
        self._listener = Listener(server, self.w.router, self._card)
        self._listener.start()
        self._publish(self._last_depth)
        self._beat = self.tell_later(self.heartbeat_s, HeartbeatDue())

    def release(self) -> None:
        """Undo begin in reverse: unpublish before the socket stops answering (W8). Each
        step is done once, however often release is called."""
        try:
            if self._beat is not None:
                self._beat.cancel()
            if self._published:
                remove_entry_if_ours(self.identity.entry_path, self.identity.session_id)
                self._published = False
            if self._listener is not None:
                self._listener.stop()
                self._listener = None
            if self._bound:
                with contextlib.suppress(OSError):
                    self.identity.endpoint.unlink()
                self._bound = False
        except Exception as exc:  # release must never raise: it runs inside failure handling
            report(f"peer release: {exc!r}")

    def on_receive(self, message: Any) -> Any:
        match message:
            case HeartbeatDue():
                self._beat = self.tell_later(self.heartbeat_s, HeartbeatDue())
                if self._asked_depth:  # the Router is slow: beat with the last count
                    self._heartbeat(self._last_depth)
                else:
                    self._asked_depth = True
                    me = self.actor_ref
                    self.w.router.tell(QueueDepthQuery(lambda n: tell_quietly(me, Heartbeat(n))))
            case Heartbeat(queue_depth=depth):
                self._asked_depth = False
                self._last_depth = depth
                self._heartbeat(depth)
            case SendResponse(prompt=prompt, response=response, error=error, owner=owner):
                self._send_response(prompt, response, error, owner)
            case _:
                raise UnknownMessage(self.child_name, message)
        return None

    def _publish(self, depth: int) -> None:
        """W5, W6: (re)write our entry atomically with a fresh heartbeat."""
        ident = self.identity
        write_entry(ident.entry_path, RegistryEntry(
            session_id=ident.session_id, name=ident.name, purpose=PURPOSE, model=MODEL,
            color=COLOR, pid=ident.pid, endpoint=str(ident.endpoint), cwd=ident.cwd,
            started_at=ident.started_at, explicit=False, version=1, context_used_pct=0,
            queue_depth=depth, heartbeat_at=iso(self.w.now())))
        self._published = True

    def _heartbeat(self, depth: int) -> None:
        """W6, healing what was deleted under us (the directories, the socket path), so
        the pool finds us within a beat. A write that fails (no descriptors, disk full)
        is said once and tried at every beat: restarting would not help."""
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
        """W17, on the loop: the Router's count, or the last one seen when it is slow."""
        if depth is None:
            depth = self._last_depth
        else:
            self._last_depth = depth
        return AgentCard(name=self.identity.name, purpose=PURPOSE, model=MODEL, color=COLOR,
                         context_used_pct=0, queue_depth=depth)

    def _settle(self, qid: str, owner: str | None) -> None:
        """The response is no longer owed: out of the durable outbox (a crash before this
        sends the asker its response a second time at the next start)."""
        try:
            self.w.store.settle(qid, owner)
        except Exception as exc:
            report(f"could not record the response for {qid} as sent: {exc!r}")

    def _undelivered(self, qid: str, reason: str) -> None:
        """The asker is gone: said on stderr and in the log; the question stays closed."""
        report(f"could not deliver response for {qid}: {reason}", "error")
        record = log_record(self.w.now(), qid if is_valid_qid(qid) else None, "response_failed",
                            {"error": reason})
        self.w.logger.tell(LogEvent(record))

    def _send_response(self, prompt: PromptEnvelope, response: Any, error: str | None,
                       owner: str | None) -> None:
        """W15, through the pool: an asker's socket must never stall our mailbox."""
        qid = prompt.msg_id
        try:
            line = ResponseEnvelope(
                msg_id=qid, sender_session=self.identity.session_id,
                sender_endpoint=str(self.identity.endpoint), hops=0, timestamp=iso(self.w.now()),
                response=response, error=error).to_line()
        except Exception as exc:  # it will never serialise: do not owe it forever
            self._undelivered(qid, repr(exc))
            self._settle(qid, owner)
            return

        def settled(reason: str | None) -> None:
            if reason is not None:
                self._undelivered(qid, reason)
            self._settle(qid, owner)  # answered, or the asker is gone for good

        if not self.responses.submit(prompt.sender_endpoint, line, RESPONSE_TIMEOUT_S,
                                     RETRY_PAUSES_S, settled):
            # refused, never dropped: it stays owed and is sent at the next start
            report(f"response for {qid} not sent now: {self.responses.capacity} responses are "
                   "already being sent (the limit); it stays owed in the state database and "
                   "is sent at the next start", "error")
