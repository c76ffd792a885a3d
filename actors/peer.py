"""The bridge's coms identity (W3, W5-W8, W15): its registry entry and heartbeat; the
listener and the response sender are its tools, on the loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..messages.commands import (
    Address,
    Heartbeat,
    LogEvent,
    ResponseDone,
    SendResponse,
    UnknownMessage,
)
from ..messages.contract import iso, log_record
from ..messages.wire import AgentCard, PromptEnvelope, RegistryEntry, ResponseEnvelope, is_valid_qid
from .files import private_dir
from .listener import Listener, bind_endpoint
from .loop import Episode, Spawned, report, tell_quietly, utc_now
from .registry import PeerIdentity, remove_entry_if_ours, write_entry
from .responses import RESPONSE_TIMEOUT_S, RETRY_PAUSES_S, ResponsePool, shared_responses
from .supervision import PooledChild

if TYPE_CHECKING:
    from .store import Store

MODEL = "hermes-bridge"
COLOR = "#38BDF8"
PURPOSE = "Remote human via Hermes/Telegram"


def agent_card(name: str, depth: int) -> AgentCard:
    """W17's card: who we are, and how many questions are open."""
    return AgentCard(name=name, purpose=PURPOSE, model=MODEL, color=COLOR,
                     context_used_pct=0, queue_depth=depth)


async def _beats(peer: Address, listener: Listener, every_s: float) -> None:
    """W6's clock, on the loop: each beat tells the Peer the Router's open count."""
    while True:
        await asyncio.sleep(every_s)
        tell_quietly(peer, Heartbeat(await listener.open_count()))


class PeerActor(PooledChild):
    """Owns the coms identity: socket, registry entry, heartbeat, outgoing responses."""

    def __init__(self, *, identity: PeerIdentity, store: Store, router: Address,
                 logger: Address, heartbeat_s: float, supervisor: Address,
                 now: Callable[[], datetime] = utc_now, name: str = "peer",
                 responses: ResponsePool | None = None) -> None:
        super().__init__(name, supervisor)
        self.identity, self.store, self.router, self.logger = identity, store, router, logger
        self.heartbeat_s, self.now = heartbeat_s, now
        self.responses = responses or shared_responses()
        self._listener: Listener | None = None
        self._bound = self._published = False
        self._beats: Spawned[None] | None = None
        self._failing = Episode()  # the registry entry cannot be written

    def begin(self) -> None:
        """Listen first and publish last: the entry's appearance means "ready" (W7)."""
        self._heal()
        server = bind_endpoint(self.identity.endpoint)
        self._bound = True
        self._listener = Listener(server, self.router,
                                  functools.partial(agent_card, self.identity.name))
        self._listener.start()
        self._publish(0)
        self._beats = self._listener.edge.spawn(
            _beats(self.actor_ref, self._listener, self.heartbeat_s))
        # every response owed (the pool does not send one in flight twice)
        for owed in self.store.outbox():
            self._send_response(owed.prompt, owed.response, owed.error, owed.owner)

    def release(self) -> None:
        """Undo begin in reverse: unpublish before the socket stops answering (W8); each
        step once."""
        try:
            if self._beats is not None and self._listener is not None:
                self._listener.edge.call(self._beats.cancel)
                self._beats = None
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
        except OSError as exc:  # release must never raise: it runs inside failure handling
            report(f"peer release: {exc!r}")

    def on_receive(self, message: Any) -> Any:
        match message:
            case Heartbeat(queue_depth=depth):
                self._heartbeat(depth)
            case SendResponse(prompt=prompt, response=response, error=error, owner=owner):
                self._send_response(prompt, response, error, owner)
            case ResponseDone(qid=qid, owner=owner, error=error):
                if error is not None:
                    self._undelivered(qid, error)
                self._settle(qid, owner)  # answered, or the asker is gone for good
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
            queue_depth=depth, heartbeat_at=iso(self.now())))
        self._published = True

    def _heartbeat(self, depth: int) -> None:
        """W6, remaking deleted directories; a deleted socket fails the Peer (its restart
        binds afresh); a failing write is said once and tried at every beat."""
        try:
            self._heal()
            if not self.identity.endpoint.is_socket():
                raise RuntimeError(f"{self.identity.endpoint} was gone")
            self._publish(depth)
        except OSError as exc:
            if self._failing.happened():
                report(f"cannot write the registry entry {self.identity.entry_path}: {exc}; "
                       "trying again at every heartbeat", "error")
            return
        if self._failing.over():
            report(f"registry entry {self.identity.entry_path} written again", "info")

    def _heal(self) -> None:
        for directory in (self.identity.agents_dir, self.identity.endpoint.parent):
            if not directory.is_dir():
                made = private_dir(directory, tighten=False)
                report(f"{directory} was gone; " + ("made it again (0700)" if made else
                       "another peer made it again meanwhile"), "warning")

    def _settle(self, qid: str, owner: str | None) -> None:
        """Out of the outbox (a crash before this sends it again at the next start)."""
        try:
            self.store.settle(qid, owner)
        except (sqlite3.Error, ValueError) as exc:  # the state file's edge; it stays owed
            report(f"could not record the response for {qid} as sent: {exc!r}")

    def _undelivered(self, qid: str, reason: str) -> None:
        """The asker is gone: said and logged; the question stays closed."""
        report(f"could not deliver response for {qid}: {reason}", "error")
        record = log_record(self.now(), qid if is_valid_qid(qid) else None, "response_failed",
                            {"error": reason})
        self.logger.tell(LogEvent(record))

    def _send_response(self, prompt: PromptEnvelope, response: Any, error: str | None,
                       owner: str | None) -> None:
        """W15, through the pool: an asker's socket must never stall our mailbox."""
        qid = prompt.msg_id
        if owner is not None and not self.store.response_owed(qid, owner):
            return  # settled already
        line = ResponseEnvelope(
            msg_id=qid, sender_session=self.identity.session_id,
            sender_endpoint=str(self.identity.endpoint), hops=0, timestamp=iso(self.now()),
            response=response, error=error).to_line()
        me = self.actor_ref
        if not self.responses.submit(
                prompt.sender_endpoint, line, RESPONSE_TIMEOUT_S, RETRY_PAUSES_S,
                lambda why: tell_quietly(me, ResponseDone(qid, owner, why)),
                None if owner is None else (qid, owner)):
            # refused, never dropped: it stays owed and is sent at the next start
            report(f"response for {qid} not sent now: {self.responses.capacity} responses are "
                   "already being sent (the limit); it stays owed in the state database and "
                   "is sent at the next start", "error")

