"""What the actors tell each other, as frozen dataclasses matched by class (the path of one
question: docs/architecture.md)."""

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
    """Listener -> Router: a well-formed prompt. `verdict`: None once stored (the ack means
    durable), else the nack's error; a listener that stopped waiting cancelled it, and
    the Router, taking it first, then neither stores nor asks the question."""

    envelope: PromptEnvelope
    verdict: concurrent.futures.Future[str | None]


@dataclass(frozen=True, slots=True)
class CancelQuestion:
    """Listener -> Router -> the question, once it may cancel (C12, X2); `by_operator`: X15."""

    envelope: CancelEnvelope
    by_operator: bool = False


@dataclass(frozen=True, slots=True)
class QueueDepthQuery:
    """Supervisor -> Router: the open count (C21, W6); `reply` runs on the Router's turn."""

    reply: Callable[[int], None]


# -- the question's life -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AnswerArrived:
    """Router -> the question: a valid answer file (C9)."""

    answer: AnswerFile
    name: str
    signature: FileSignature


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The question's own timer (C17)."""


@dataclass(frozen=True, slots=True)
class RemindDue:
    """The question's own reminder timer (X9)."""


@dataclass(frozen=True, slots=True)
class QuestionClosed:
    """Question -> Router: closed and stored; `answer_file` is the version that answered,
    so the Router tells late ones apart without reading the store."""

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
    """-> Delivery: run `hermes send`; a question's result goes back as HermesRan, a note's
    failure Delivery logs itself."""

    qid: str
    text: str
    purpose: TextPurpose
    note_id: str | None = None  # its row in the store, cleared once hermes ran


# -- coms responses -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendResponse:
    """Question -> Peer: the response envelope (W15); `owner` names the outbox row to clear."""

    prompt: PromptEnvelope
    response: JsonValue
    error: str | None = None
    owner: str | None = None


# -- answer files -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileSignature:
    """The version of a file read, so only that version is removed."""

    inode: int
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class AnswerFileSeen:
    """Watcher -> Router: a file named with a valid qid; `content` None: over
    ANSWER_FILE_LIMIT, unread."""

    name: str
    content: bytes | None
    signature: FileSignature


@dataclass(frozen=True, slots=True)
class DisposeAnswerFile:
    """-> Watcher: this version was judged (C2): remove it."""

    name: str
    signature: FileSignature


@dataclass(frozen=True, slots=True)
class RejectAnswerFile:
    """-> Watcher: refused (C9): removed and logged, after its grace if half written (C10)."""

    name: str
    signature: FileSignature
    rejected: Rejected


@dataclass(frozen=True, slots=True)
class HermesRan:
    """Hermes ran `job`: None, or C18's error; Delivery -> Router -> the open question."""

    job: SendText
    error: str | None


@dataclass(frozen=True, slots=True)
class EarlierSendsEnded:
    """-> Delivery: the sends an earlier run left under way are over (or given up on)."""


@dataclass(frozen=True, slots=True)
class FilesChanged:
    """-> Watcher: inotify saw these names change."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Rescan:
    """-> Watcher: look at every file, and watch anew if the watch is gone (the safety net,
    and inotify's word when events were lost)."""


# -- log ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogEvent:
    record: LogRecord


# -- peer ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """-> Peer: rewrite the registry entry with this open count (W6)."""

    queue_depth: int


@dataclass(frozen=True, slots=True)
class ResponseDone:
    """-> Peer: no longer owed: acked (`error` None), or gone for good (W15)."""

    qid: str
    owner: str | None
    error: str | None


# -- supervision --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildFailed:
    """-> its supervisor: a child died; it is rebuilt from the store."""

    child: str
    error: str


@dataclass(frozen=True, slots=True)
class QuestionSpec:
    """Everything a QuestionActor (re)starts from."""

    qid: str
    prompt: PromptEnvelope
    parsed: ParsedPrompt
    timeout_ms: float
    deadline: float  # seconds since the epoch
    state: State | None = None
    reminded: bool = False  # X9: its one reminder was decided (sent, or owed)
