"""Every value that crosses a socket or a file. Field names and order are the pool's, so a
model serialises to the bytes a peer expects; inbound models ignore unknown fields (W18)
and are strict only where the pool is (W14, W16)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any, Literal

from dateutil import parser as dateutil_parser
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..liaison.markers import is_qid

NonEmpty = Annotated[StrictStr, Field(min_length=1)]
Number = StrictInt | StrictFloat

_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def dumps(value: Any, *, indent: int | None = None) -> str:
    """JSON text as JavaScript's JSON.stringify writes it; lone surrogates escaped, so
    every line is valid UTF-8."""
    if indent is None:
        text = _COMPACT.encode(value)
    else:
        text = json.dumps(
            value, ensure_ascii=False, indent=indent, separators=(",", ": "), allow_nan=False
        )
    if text.isascii():
        return text
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def has_lone_surrogate(value: Any) -> bool:
    """Whether any string in `value`, keys too, holds a lone surrogate (X12): JSON can
    spell one, but SQLite, the log, argv and Telegram would each fail on it later."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


INVALID_UNICODE = "invalid_unicode"


def _own_fields(model: type[BaseModel], data: Any) -> Iterator[tuple[str, Any]]:
    """The model's own fields in raw input, by wire name (extra fields are ignored, W18)."""
    if isinstance(data, dict):
        for name, field in model.model_fields.items():
            wire_name = field.alias or name
            yield wire_name, data.get(wire_name)


class ValidText(BaseModel):
    """X12: text that is not valid Unicode stops at the wire, the error naming the field."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        for wire_name, value in _own_fields(cls, data):
            if has_lone_surrogate(value):
                raise PydanticCustomError(
                    INVALID_UNICODE, "{field} is not valid Unicode", {"field": wire_name}
                )
        return data


NOT_FINITE = "not_finite"


def non_finite(value: Any) -> bool:
    """Whether `value` holds a number that is not finite, at any depth."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class FiniteNumbers(BaseModel):
    """X17: JSON.parse reads `1e400` as Infinity, which no line or row can hold: refused
    at the wire, naming the field."""

    @model_validator(mode="before")
    @classmethod
    def _finite_numbers(cls, data: Any) -> Any:
        for wire_name, value in _own_fields(cls, data):
            if isinstance(value, float) and not math.isfinite(value):
                why = "{field} is not a finite number"
            elif non_finite(value):
                why = "{field} holds a number that is not finite"
            else:
                continue
            raise PydanticCustomError(NOT_FINITE, why, {"field": wire_name})
        return data


def invalid_text(exc: ValidationError) -> str | None:
    """The reason naming the field, when the value is one no line can carry (X12, X17)."""
    named = (INVALID_UNICODE, NOT_FINITE)
    return next((str(e["msg"]) for e in exc.errors() if e["type"] in named), None)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


def _finite(text: str) -> float:
    """A number past a double is refused where it is read: no line may hold infinity."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number out of range: {text[:32]}")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite)
_ENVELOPE_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _decode(text: str, decoder: json.JSONDecoder) -> Any:
    try:
        return decoder.decode(text)
    except RecursionError as exc:  # one peer's deep JSON is its own failure, no one else's
        raise ValueError("JSON nested too deep") from exc


def loads(text: str) -> Any:
    """`json.loads` as JavaScript's JSON.parse reads: ValueError for text that is not
    JSON, for NaN and Infinity, for a number past a double (1e400) and for deep nesting."""
    return _decode(text, _DECODER)


def loads_envelope(text: str) -> Any:
    """`loads` reading `1e400` as Infinity, for the envelope's model to refuse naming its
    field (X17) rather than the whole line being `invalid json`."""
    return _decode(text, _ENVELOPE_DECODER)


LINE_LIMIT = 64 * 1024 - 1
"""Bytes in one line we write, newline included: peers refuse lines over 64 KiB (W13)."""

ELLIPSIS = "\u2026"
_MAX_CUTS = 64


def _strings(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str]]:
    """Every string leaf (not dict keys) with its path, depth-first."""
    if isinstance(value, str):
        return [(path, value)]
    found: list[tuple[tuple[Any, ...], str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _strings(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _strings(item, (*path, index))
    return found


def _replace(value: Any, path: tuple[Any, ...], text: str) -> Any:
    if not path:
        return text
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, text)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, text)
    return copy


def _cap(lengths: list[int], over: int) -> int:
    """The largest size C such that cutting every length above C to C saves `over`."""
    ordered = sorted(lengths, reverse=True)
    total = 0
    for count, length in enumerate(ordered, start=1):
        total += length
        cap = (total - over) // count
        if count == len(ordered) or cap >= ordered[count]:
            return max(cap, 0)
    return 0


def fit_line(value: Any, limit: int = LINE_LIMIT) -> str:
    """`dumps(value)` and a newline in at most `limit` UTF-8 bytes (W13): the longest texts
    are cut to a common length, ending in `…`, so the line stays valid JSON."""
    text = dumps(value)
    size = len(text.encode("utf-8")) + 1
    for _ in range(_MAX_CUTS):
        if size <= limit:
            break
        leaves = [leaf for leaf in _strings(value) if len(leaf[1]) > 1]
        if not leaves:
            break
        sizes = [len(dumps(leaf[1]).encode("utf-8")) for leaf in leaves]
        cap = _cap(sizes, size - limit + 16 * len(leaves))
        for (path, leaf), encoded in zip(leaves, sizes, strict=True):
            if encoded > cap:
                keep = min(len(leaf) * cap // encoded, len(leaf) - 2)
                cut = leaf[: max(keep, 0)] + ELLIPSIS
                if len(dumps(cut).encode("utf-8")) < encoded:  # "ab" -> "…" would grow
                    value = _replace(value, path, cut)
        text = dumps(value)
        size = len(text.encode("utf-8")) + 1
    return text + "\n"


class WireModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    def json_body(self) -> Any:
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        return dumps(self.json_body())

    def to_line(self) -> bytes:
        return fit_line(self.json_body()).encode("utf-8")


def _lenient_text(value: Any) -> str:
    """A descriptive field the pool does not check: take what comes, as text."""
    if value is None:
        return ""
    return value if isinstance(value, str) else dumps(value)


LenientText = Annotated[str, BeforeValidator(_lenient_text)]


class PromptEnvelope(ValidText, FiniteNumbers, WireModel):
    """A question from a peer (W14); its msg_id is the qid (C3). Only the fields the pool
    checks are strict: `"sender_cwd": null` is asked, not refused (W18)."""

    type: Literal["prompt"] = "prompt"
    msg_id: StrictStr
    sender_session: LenientText = ""
    sender_endpoint: StrictStr
    hops: Number
    timestamp: LenientText = ""
    prompt: StrictStr
    sender_name: LenientText = ""
    sender_cwd: LenientText = ""
    conversation_id: JsonValue = None
    response_schema: JsonValue = None
    reply_timeout_ms: JsonValue = None


class ResponseEnvelope(WireModel):
    """Our reply to an asker, sent to its sender_endpoint (W15)."""

    type: Literal["response"] = "response"
    msg_id: StrictStr
    sender_session: StrictStr
    sender_endpoint: StrictStr
    hops: Number = 0
    timestamp: StrictStr
    response: JsonValue
    error: StrictStr | None = None


class CancelEnvelope(ValidText, FiniteNumbers, WireModel):
    """The asker withdrawing a question it answered elsewhere (C12, W16)."""

    type: Literal["cancel"] = "cancel"
    msg_id: NonEmpty
    from_: NonEmpty = Field(alias="from")
    to: NonEmpty
    created_at: NonEmpty
    ref_msg_id: NonEmpty

    model_config = ConfigDict(
        frozen=True, extra="ignore", populate_by_name=True, serialize_by_alias=True)


class PingEnvelope(WireModel):
    """The liveness probe `doctor` sends (W17)."""

    type: Literal["ping"] = "ping"
    msg_id: StrictStr = ""


class Ack(WireModel):
    type: Literal["ack"] = "ack"
    msg_id: str


class Nack(WireModel):
    type: Literal["nack"] = "nack"
    msg_id: str
    error: str


class AgentCard(WireModel):
    name: str
    purpose: str
    model: str
    color: str
    context_used_pct: Number
    queue_depth: int


class Pong(WireModel):
    type: Literal["pong"] = "pong"
    msg_id: str
    agent_card: AgentCard


class RegistryEntry(WireModel):
    """One live peer's registry file (W5); read back leniently, written exactly."""

    session_id: StrictStr
    name: StrictStr
    purpose: StrictStr = ""
    model: StrictStr = ""
    color: StrictStr = ""
    pid: StrictInt = 0
    endpoint: StrictStr
    cwd: StrictStr = ""
    started_at: StrictStr = ""
    explicit: bool = False
    version: StrictInt = 1
    context_used_pct: Number = 0
    queue_depth: StrictInt = 0
    heartbeat_at: StrictStr | None = None

    def to_file_text(self) -> str:
        return dumps(self.model_dump(mode="json"), indent=2)


# -- the bridge's own values (C4-C20) ------------------------------------------------


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
    return is_qid(value)


# JavaScript's Date.parse knows these zone names and no others (X4).
_JS_ZONES = {
    "UT": 0, "UTC": 0, "GMT": 0, "Z": 0,
    "EST": -5, "EDT": -4, "CST": -6, "CDT": -5,
    "MST": -7, "MDT": -6, "PST": -8, "PDT": -7,
}
_MAX_TIMESTAMP = 100
_COMMENT = re.compile(r"\([^()]*\)")
# "GMT+0100" from Date.toString(): dateutil would read the sign the POSIX way round.
_LABELLED_OFFSET = re.compile(r"\b(?:GMT|UTC|UT)(?=[+-]\d)", re.IGNORECASE)
_YEAR_OR_MONTH = re.compile(r"\d{4}(?:-\d{2})?")
_PLAIN_ISO = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,6})?)?(?:Z|[+-]\d{2}:?\d{2})?"
)
_PROBES = (datetime(2000, 1, 1), datetime(2001, 2, 2))


def _zone(name: str | None, offset: int | None) -> int | None:
    """dateutil's zone hook: the names JavaScript knows, else the written offset. An
    unknown name (CET) leaves no zone: `at` is checked, never computed with."""
    if name is not None and name.upper() in _JS_ZONES:
        return _JS_ZONES[name.upper()] * 3600
    return offset


def parse_timestamp(value: str) -> datetime:
    """`at` as JavaScript's Date.parse reads it (C8, X4), or ValueError. Only a whole date
    counts: dateutil would fill a bare time from a default date, hence the two probes."""
    if len(value) > _MAX_TIMESTAMP:
        raise ValueError("timestamp too long")
    text = _LABELLED_OFFSET.sub("", _COMMENT.sub(" ", value)).strip()
    if not text:
        raise ValueError("not a timestamp")
    if _YEAR_OR_MONTH.fullmatch(text):
        return datetime.fromisoformat(text + "-01" * (3 - len(text.split("-"))))
    if _PLAIN_ISO.fullmatch(text):  # what the liaison writes
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass  # no such day or hour: dateutil says why
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
    """One line of log.ndjson (C20)."""

    at: str
    qid: str
    event: Event
    detail: JsonValue = None

    def to_line(self, project: str) -> str:
        """X16: the project last, after C20's fields; `detail` left out when None."""
        return fit_line({**self.model_dump(exclude_none=True), "project": project})
