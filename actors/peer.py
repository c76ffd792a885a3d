"""The PeerActor: the bridge's face in the coms pool (W3, W5-W8, W11-W17).

It owns the listening socket, the registry entry and the heartbeat, and it
sends response envelopes to askers. Everything that blocks (accept, reading a
client, connecting to an asker, asking the supervisor for the queue depth)
runs in helper threads, so the actor's own mailbox only ever holds quick work:
rewriting the entry and starting a response sender.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from coms_hermes_bridge.actors.base import Child, report, utc_now
from coms_hermes_bridge.actors.registry import (
    PROBE_TIMEOUT_S,
    IdentityError,
    PeerIdentity,
    endpoint_accepts,
    remove_entry_if_ours,
    resolve_identity,
    write_entry,
)
from coms_hermes_bridge.messages.commands import (
    Address,
    AdmissionRefused,
    CancelQuestion,
    Heartbeat,
    LogEvent,
    NewQuestion,
    SendResponse,
    UnknownMessage,
)
from coms_hermes_bridge.messages.contract import iso, log_record
from coms_hermes_bridge.messages.model import is_valid_qid
from coms_hermes_bridge.messages.wire import (
    Ack,
    AgentCard,
    CancelEnvelope,
    Nack,
    Pong,
    PromptEnvelope,
    RegistryEntry,
    ResponseEnvelope,
    WireModel,
)

__all__ = [
    "EndpointInUse",
    "IdentityError",
    "Listener",
    "PeerActor",
    "PeerIdentity",
    "bind_endpoint",
    "deliver_response",
    "resolve_identity",
]

MODEL = "hermes-bridge"
COLOR = "#38BDF8"
MAX_LINE = 65536
CLIENT_TIMEOUT_S = 10.0
ACCEPT_POLL_S = 0.5
JOIN_TIMEOUT_S = 1.0

LINE_TOO_LARGE = "line too large"
INVALID_JSON = "invalid json"
NOT_TAKEN = "bridge accepts prompts, cancels, and pings"
INVALID_PROMPT = "invalid prompt envelope"
INVALID_CANCEL = "invalid cancel envelope"
NOT_ADMITTED = "bridge could not take the question"


class EndpointInUse(RuntimeError):
    """Another live process answers on our endpoint path (W11); we must not steal it."""


class _LineTooLarge(Exception):
    pass


def _read_line(conn: socket.socket) -> bytes | None:
    """The first non-blank line, the tail at EOF, or None when the client sent nothing."""
    buffer = b""
    while True:
        while b"\n" in buffer:
            line, _, buffer = buffer.partition(b"\n")
            if len(line) > MAX_LINE:
                raise _LineTooLarge
            if line.strip():
                return line
        if len(buffer) > MAX_LINE:
            raise _LineTooLarge
        chunk = conn.recv(MAX_LINE)
        if not chunk:
            return buffer if buffer.strip() else None
        buffer += chunk


def _reject_constant(name: str) -> Any:
    """JSON.parse refuses NaN and Infinity, so the pool would call such a line invalid."""
    raise ValueError(f"not JSON: {name}")


class Listener:
    """The accept loop and one thread per connection (W12-W17).

    Kept apart from the actor so that a slow or hostile client can only ever
    pin its own thread, and the actor's mailbox never waits on a socket.
    """

    def __init__(
        self,
        server: socket.socket,
        questions: Address,
        pong_card: Callable[[], AgentCard],
        admit: Callable[[PromptEnvelope], None] | None = None,
    ) -> None:
        self._server = server
        self._questions = questions
        self._pong_card = pong_card
        self._admit = admit or (lambda prompt: questions.tell(NewQuestion(prompt)))
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="peer-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Close the listening socket so accept() returns, then wait briefly for the loop."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._server.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stopping.is_set():
                    return
                report(f"accept failed: {exc}")
                self._stopping.wait(0.1)  # e.g. out of descriptors: do not spin
                continue
            try:
                threading.Thread(
                    target=self._handle, args=(conn,), name="peer-conn", daemon=True
                ).start()
            except RuntimeError as exc:  # cannot start a thread: refuse this client only
                report(f"could not serve a connection: {exc}")
                conn.close()

    def _handle(self, conn: socket.socket) -> None:
        """Exactly one reply line per connection, then close; never raise."""
        then: Callable[[], None] | None = None
        try:
            with conn:
                conn.settimeout(CLIENT_TIMEOUT_S)
                try:
                    line = _read_line(conn)
                except _LineTooLarge:
                    conn.sendall(Nack(msg_id="", error=LINE_TOO_LARGE).to_line())
                    return
                if line is None:
                    return
                reply, then = self.reply_to(line)
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
            body = json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError, RecursionError):
            return Nack(msg_id="", error=INVALID_JSON), None
        raw_id = body.get("msg_id") if isinstance(body, dict) else None
        msg_id = raw_id if isinstance(raw_id, str) else ""
        kind = body.get("type") if isinstance(body, dict) else None
        if kind == "prompt":
            try:
                prompt = PromptEnvelope.model_validate(body)
            except ValidationError:
                return Nack(msg_id=msg_id, error=INVALID_PROMPT), None
            try:
                self._admit(prompt)
            except AdmissionRefused as exc:  # full (9.10), someone else's qid (X2): as it is
                return Nack(msg_id=prompt.msg_id, error=str(exc)), None
            except Exception as exc:  # the bridge could not take it: say so, never ack
                return Nack(msg_id=prompt.msg_id, error=f"{NOT_ADMITTED}: {exc}"), None
            return Ack(msg_id=prompt.msg_id), None
        if kind == "cancel":
            try:
                cancel = CancelEnvelope.model_validate(body)
            except ValidationError:
                return Nack(msg_id=msg_id, error=INVALID_CANCEL), None
            return Ack(msg_id=cancel.msg_id), lambda: self._questions.tell(CancelQuestion(cancel))
        if kind == "ping":
            return Pong(msg_id=msg_id, agent_card=self._pong_card()), None
        return Nack(msg_id=msg_id, error=NOT_TAKEN), None


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


def deliver_response(endpoint: str, line: bytes, timeout: float) -> tuple[str | None, bool]:
    """Send one envelope line and read the reply (W15).

    Returns the failure reason (None on ack) and whether the outcome is final:
    an ack, a nack, or a refused or missing socket (W15: the asker is gone).
    A timeout, a full backlog or a dropped connection may pass, so they are
    worth another try.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(endpoint)
            conn.sendall(line)
            reply = b""
            while b"\n" not in reply and len(reply) <= MAX_LINE:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                reply += chunk
    except TimeoutError:
        return "timed out", False
    except (ConnectionRefusedError, FileNotFoundError, NotADirectoryError) as exc:
        return str(exc) or type(exc).__name__, True
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__, False
    text = reply.partition(b"\n")[0].decode("utf-8", "replace")
    if not text.strip():
        return "connection closed without a reply", False
    try:
        body = json.loads(text)
    except ValueError:
        return f"unexpected reply: {text[:200]}", True
    if isinstance(body, dict) and body.get("type") == "ack":
        return None, True
    if isinstance(body, dict) and body.get("type") == "nack":
        return f"nack: {body.get('error')}", True
    return f"unexpected reply: {text[:200]}", True


class PeerActor(Child):
    """Owns the coms identity: socket, registry entry, heartbeat, outgoing responses."""

    def __init__(
        self,
        *,
        supervisor: Address,
        identity: PeerIdentity,
        questions: Address,
        queue_depth: Callable[[], int],
        admit: Callable[[PromptEnvelope], None] | None = None,
        settled: Callable[[str, str | None], None] | None = None,
        logger: Address | None = None,
        name: str = "peer",
        purpose: str = "Remote human via Hermes/Telegram",
        heartbeat_s: float = 30.0,
        response_timeout_s: float = 10.0,
        retry_pauses_s: tuple[float, ...] = (2.0, 10.0),
    ) -> None:
        super().__init__(name, supervisor)
        self.identity = identity
        self.questions = questions
        self.queue_depth = queue_depth
        self.admit = admit
        self.settled = settled
        self.logger = logger
        self.purpose = purpose
        self.heartbeat_s = heartbeat_s
        self.response_timeout_s = response_timeout_s
        self.retry_pauses_s = retry_pauses_s
        self._last_depth = 0
        self._listener: Listener | None = None
        self._bound = False
        self._published = False
        self._beating = threading.Event()
        self._heart: threading.Thread | None = None
        self._released = False

    # -- life ---------------------------------------------------------------

    def begin(self) -> None:
        """Listen first and publish last: the entry's appearance means "ready" (W7)."""
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
                self._publish(depth)
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

    def _current_depth(self) -> int:
        """The supervisor's count, or the last one we saw when it does not answer in time."""
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
        if self.settled is None:
            return
        try:
            self.settled(qid, owner)
        except Exception as exc:
            report(f"could not record the response for {qid} as sent: {exc!r}")

    def _undelivered(self, qid: str, reason: str) -> None:
        """The asker is gone: say so on stderr and in the bridge log; the question stays closed."""
        report(f"could not deliver response for {qid}: {reason}")
        if self.logger is not None:
            record = log_record(
                utc_now(), qid if is_valid_qid(qid) else None, "response_failed", {"error": reason}
            )
            self.logger.tell(LogEvent(record))

    def _send_response(
        self, prompt: PromptEnvelope, response: Any, error: str | None, owner: str | None
    ) -> None:
        """W15, in a short-lived thread: an asker's socket must never stall our mailbox."""
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

        def send() -> None:
            reason: str | None = None
            # Not tied to this actor's life: a restarted Peer must not drop a
            # response mid-retry. A process exit ends it; the outbox keeps it.
            for pause in (0.0, *self.retry_pauses_s):
                time.sleep(pause)
                try:
                    reason, final = deliver_response(endpoint, line, timeout)
                except Exception as exc:
                    reason, final = repr(exc), True
                if final:
                    break
            if reason is not None:
                self._undelivered(qid, reason)
            self._settle(qid, owner)  # answered, or the asker is gone for good

        try:
            threading.Thread(target=send, name=f"peer-response-{qid}", daemon=True).start()
        except RuntimeError as exc:
            report(f"could not deliver response for {qid}: {exc}")
