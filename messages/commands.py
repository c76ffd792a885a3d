"""What the actors tell each other.

Each command is a frozen dataclass: cheap to build on every hop, typed, and
matched by class in an actor's `on_receive`. Who sends what, hop by hop:
docs/architecture.md, "The path of one question".
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import JsonValue

from .contract import Rejected
from .wire import AnswerFile, CancelEnvelope, LogRecord, ParsedPrompt, PromptEnvelope, State


class Address(Protocol):
    """Anything a message can be told to: an actor ref, a supervised slot, a test fake."""

    def tell(self, message: Any) -> None: ...


class UnknownMessage(TypeError):
    """An actor was told something it does not take: a bug, so it fails loudly."""

    def __init__(self, actor: str, message: object) -> None:
        super().__init__(f"{actor} does not take {type(message).__name__}: {message!r}")


# -- from the coms socket ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewQuestion:
    """A well-formed prompt arrived (its qid may still be invalid, C3). `verdict` is set
    once it is handled: None once it is stored (the ack means "durable"), else the
    nack's error, word for word. The Router takes it (`set_running_or_notify_cancel`)
    before anything else: a listener that stopped waiting has cancelled it and nacked
    the asker, so the question must then be neither stored nor asked."""

    envelope: PromptEnvelope
    verdict: concurrent.futures.Future[str | None]


@dataclass(frozen=True, slots=True)
class CancelQuestion:
    """A well-formed cancel arrived (already acked, C12): Peer -> Router, and Router ->
    the question once the Router has found it may cancel (X2). `by_operator`: the
    envelope carried the operator's mark (X15)."""

    envelope: CancelEnvelope
    by_operator: bool = False


@dataclass(frozen=True, slots=True)
class QueueDepthQuery:
    """How many questions are open (C21, W6): `reply` is called with the count, on the
    Router's turn (it must not block)."""

    reply: Callable[[int], None]


# -- the question's life -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AnswerArrived:
    """A valid answer file for this question (C9 passed)."""

    answer: AnswerFile
    name: str
    signature: FileSignature


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The question's timer fired (C17)."""


@dataclass(frozen=True, slots=True)
class RemindDue:
    """The question's reminder is due (X9)."""


@dataclass(frozen=True, slots=True)
class QuestionClosed:
    """The question ended, its close stored (how it ended is the store's to say).
    `answer_file` is the version that answered it, if one did: the Router judges every
    other version it routed to the question as late, and needs no read of the store to
    tell this one apart."""

    qid: str
    child: str
    answer_file: tuple[str, FileSignature] | None


# -- delivery through hermes --------------------------------------------------

TextPurpose = Literal[
    "question", "cancel_note", "late_note", "timeout_note", "unreadable_note",
    "undelivered_note", "remind_note",
]


@dataclass(frozen=True, slots=True)
class SendText:
    """Run `hermes send` with this text. A question's result goes to the Router (as
    HermesRan); a note's failure is logged by the Delivery actor itself as
    `delivery_error` with the note's purpose as its phase."""

    qid: str
    text: str
    purpose: TextPurpose
    note_id: str | None = None  # a note owed in the store, cleared once hermes has run it


# -- coms responses -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendResponse:
    """Send the asker of `prompt` a response envelope (W15), in the background.

    `owner` names the question actor that owes it, which is how the durable
    outbox knows which row to clear once the asker has it.
    """

    prompt: PromptEnvelope
    response: JsonValue
    error: str | None = None
    owner: str | None = None


# -- answer files -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileSignature:
    """Which version of a file was read, so that only that version is removed."""

    inode: int
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class AnswerFileSeen:
    """An answer file whose name carries a valid qid, and what it held when read.

    `content` is None when the file was over ANSWER_FILE_LIMIT and so was not
    read at all (`signature.size` says how big it was).
    """

    name: str
    content: bytes | None
    signature: FileSignature


@dataclass(frozen=True, slots=True)
class DisposeAnswerFile:
    """This version of the file was judged (used, C2, or answered with a note): remove it."""

    name: str
    signature: FileSignature


@dataclass(frozen=True, slots=True)
class RejectAnswerFile:
    """This version of the file is refused (C9): the Watcher removes and logs it, after
    its grace if it may be half written (C10)."""

    name: str
    signature: FileSignature
    rejected: Rejected


@dataclass(frozen=True, slots=True)
class HermesRan:
    """Hermes ran `job`: None when it sent, else C18's error. The edge tells Delivery,
    which tells the Router a question's, which tells that question if it is still open."""

    job: SendText
    error: str | None


@dataclass(frozen=True, slots=True)
class EarlierSendsEnded:
    """The sends an earlier run (or a crashed Delivery) left under way have ended, or
    waiting for them was given up: their outcomes can be taken, and sending goes on."""


@dataclass(frozen=True, slots=True)
class FilesChanged:
    """inotify saw these names change in the questions directory."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Rescan:
    """Look at every file of the questions directory, and watch it anew if its watch is
    gone: the safety-net beat, and what inotify says when events were lost or the watch
    ended."""


# -- log ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogEvent:
    record: LogRecord


# -- peer ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Rewrite the registry entry with a fresh heartbeat and this open count (W6)."""

    queue_depth: int


@dataclass(frozen=True, slots=True)
class ResponseDone:
    """The response for `qid` owed by `owner` is no longer owed: the asker acked it
    (`error` None), or it is gone for good (`error` says why) (W15)."""

    qid: str
    owner: str | None
    error: str | None


# -- supervision --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildFailed:
    """A child died of an exception; what it had not read is lost (it is rebuilt from the
    store when the child starts again)."""

    child: str
    error: str


@dataclass(frozen=True, slots=True)
class QuestionSpec:
    """Everything needed to (re)start a QuestionActor."""

    qid: str
    prompt: PromptEnvelope
    parsed: ParsedPrompt
    timeout_ms: float
    deadline: float  # seconds since the epoch
    state: State | None = None
    reminded: bool = False  # X9: its one reminder was decided (sent, or owed)
