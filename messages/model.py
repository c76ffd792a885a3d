"""The bridge's own typed values: questions, answer files, answers, log records.

These are the nouns of the contract (C4-C20). Wire envelopes live in
`messages.wire`; the rules that act on both live in `messages.contract`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from dateutil import parser as dateutil_parser
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StrictStr

from .wire import ValidText, WireModel, fit_line

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
    "duplicate_refused",
    "cancel_refused",
    "question_failed",
    "reminded",
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


# JavaScript's Date.parse knows these zone names and no others (X4).
_JS_ZONES = {
    "UT": 0, "UTC": 0, "GMT": 0, "Z": 0,
    "EST": -5, "EDT": -4, "CST": -6, "CDT": -5,
    "MST": -7, "MDT": -6, "PST": -8, "PDT": -7,
}
_MAX_TIMESTAMP = 100
_COMMENT = re.compile(r"\([^()]*\)")
# "GMT+0100" as JavaScript's Date.toString() writes it: the sign is the offset's
# (dateutil would read it the POSIX way round), so the label goes.
_LABELLED_OFFSET = re.compile(r"\b(?:GMT|UTC|UT)(?=[+-]\d)", re.IGNORECASE)
_YEAR_OR_MONTH = re.compile(r"\d{4}(?:-\d{2})?")
# The form nearly every answer carries (hermes writes `toISOString()`): a whole
# date and time, `Z` or an offset. `fromisoformat` reads it as dateutil does at a
# fraction of the cost; anything it refuses still goes through dateutil.
_PLAIN_ISO = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,6})?)?(?:Z|[+-]\d{2}:?\d{2})?"
)
# Two different defaults: a field the text does not carry shows up as a difference.
_PROBES = (datetime(2000, 1, 1), datetime(2001, 2, 2))


def _zone(name: str | None, offset: int | None) -> int | None:
    """dateutil's zone hook: the names JavaScript knows, else the written offset.

    An unknown name (CET, as `date` prints on a European host) leaves the time
    without a zone instead of failing: `at` is checked, never computed with,
    and refusing it would throw away a real answer.
    """
    if name is not None and name.upper() in _JS_ZONES:
        return _JS_ZONES[name.upper()] * 3600
    return offset


def parse_timestamp(value: str) -> datetime:
    """Parse `at` as JavaScript's Date.parse does in practice (C8, X4).

    ISO 8601 in its usual variants (`T` or a space, `Z` or an offset, a
    fraction with `.` or `,`), RFC 2822 (`date -R`), `date`'s default output
    (`Mon Nov 30 18:00:00 UTC 2026`), JavaScript's own `Date.toString()`, and
    the ISO year or year-month alone. The text must name a whole date (year,
    month and day) unless it is such an ISO year or year-month, so words like
    `Monday` or a bare time are refused; so is anything that is not a real
    date (`2026-13-45`). Raises ValueError when the value is refused.
    """
    if len(value) > _MAX_TIMESTAMP:  # bounded work, whatever the writer sent
        raise ValueError("timestamp too long")
    text = _LABELLED_OFFSET.sub("", _COMMENT.sub(" ", value)).strip()
    if not text:
        raise ValueError("not a timestamp")
    if _YEAR_OR_MONTH.fullmatch(text):
        return datetime.fromisoformat(text + "-01" * (3 - len(text.split("-"))))
    if _PLAIN_ISO.fullmatch(text):
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass  # no such day or hour: dateutil has the last word, as before
    try:
        first, second = (
            dateutil_parser.parse(text, default=probe, tzinfos=_zone) for probe in _PROBES
        )
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"not a timestamp: {exc}") from exc
    if first.date() != second.date():
        raise ValueError("not a whole date")
    return first


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


class AnswerFile(ValidText, WireModel):
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
        return fit_line(body)
