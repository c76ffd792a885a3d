"""The bridge's own typed values: questions, answer files, answers, log records.

These are the nouns of the contract (C4-C20). Wire envelopes live in
`messages.wire`; the rules that act on both live in `messages.contract`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StrictStr

from coms_hermes_bridge.messages.wire import WireModel, dumps

QID_PATTERN = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")

State = Literal["pending", "delivered", "answered", "cancelled", "timeout"]
TERMINAL_STATES: tuple[State, ...] = ("answered", "cancelled", "timeout")

Event = Literal[
    "question_received",
    "delivered",
    "delivery_error",
    "answered",
    "cancelled",
    "timeout",
    "late_answer",
    "answer_rejected",
    "response_failed",
]

RejectReason = Literal[
    "invalid_path",
    "invalid_qid",
    "foreign_qid",
    "invalid_json",
    "invalid_schema",
    "qid_mismatch",
]


def is_valid_qid(value: object) -> bool:
    """A qid is a 26-character Crockford ULID, upper case (C3)."""
    return isinstance(value, str) and QID_PATTERN.fullmatch(value) is not None


def parse_timestamp(value: str) -> datetime:
    """Parse an ISO 8601 timestamp, as the gateway writes `at` (C8).

    A trailing `Z` and a date alone are accepted, as JavaScript's Date.parse
    accepts them; anything else that does not parse raises ValueError.
    """
    return datetime.fromisoformat(value)


def _qid(value: str) -> str:
    if not is_valid_qid(value):
        raise ValueError("not a 26-character Crockford ULID")
    return value


def _timestamp(value: str) -> str:
    parse_timestamp(value)
    return value


Qid = Annotated[StrictStr, AfterValidator(_qid)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QuestionOption(Frozen):
    """One choice offered to the human (C4, C6)."""

    title: str
    description: str | None = None


class ParsedPrompt(Frozen):
    """What a prompt asks, once its text has been read per C6."""

    question: str
    context: str | None = None
    options: tuple[QuestionOption, ...] = ()


class AnswerFile(WireModel):
    """The file the Hermes gateway writes for an answer (C8)."""

    qid: Qid
    answer: StrictStr
    answered_by: Annotated[StrictStr, Field(min_length=1)]
    at: Annotated[StrictStr, AfterValidator(_timestamp)]


class SelectionAnswer(WireModel):
    """The human picked one of the offered options (C11)."""

    kind: Literal["selection"] = "selection"
    selections: tuple[str, ...]


class FreeformAnswer(WireModel):
    """The human wrote something that is not one of the options (C11)."""

    kind: Literal["freeform"] = "freeform"
    text: str


MappedAnswer = SelectionAnswer | FreeformAnswer


class LogRecord(Frozen):
    """One line of log.ndjson (C20). `detail` is left out when None."""

    at: str
    qid: str
    event: Event
    detail: JsonValue = None

    def to_line(self) -> str:
        """The record as one ndjson line, newline included."""
        body: dict[str, JsonValue] = {"at": self.at, "qid": self.qid, "event": self.event}
        if self.detail is not None:
            body["detail"] = self.detail
        return dumps(body) + "\n"
