"""The bridge contract's rules as pure functions (C3-C20): values in, values out, no I/O."""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import ValidationError

from ..liaison.markers import answer_prefix, hub_tag
from .wire import (
    ELLIPSIS,
    TERMINAL_STATES,
    AnswerFile,
    CancelEnvelope,
    Event,
    FreeformAnswer,
    LogRecord,
    MappedAnswer,
    ParsedPrompt,
    PromptEnvelope,
    QuestionOption,
    RejectReason,
    SelectionAnswer,
    State,
    invalid_text,
    is_valid_qid,
    loads,
)

TELEGRAM_TEXT_LIMIT = 4096
# A larger answer file is refused from its size alone, never read.
ANSWER_FILE_LIMIT = 64 * 1024
DEFAULT_TIMEOUT_MS = 1_800_000
ANSWER_SUFFIX = ".answer.json"
INVALID_QID_ERROR = "prompt msg_id must be a 26-character Crockford ULID qid"
NOT_ADMITTED = "bridge could not take the question (internal error)"

# JavaScript's trim() set: "trimmed" as the daemon we replace meant it.
_JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_DIGITS = re.compile(r"[0-9]+")


def js_trim(text: str) -> str:
    """Trim as JavaScript does (C11's "trimmed answer")."""
    return text.strip(_JS_WHITESPACE)


# -- time ---------------------------------------------------------------------


def iso(moment: datetime) -> str:
    """An instant as JavaScript's toISOString() writes it: UTC, milliseconds, Z."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def js_number(value: float) -> float:
    """A number as JavaScript holds it, so it serialises the same: 250, not 250.0."""
    return int(value) if float(value).is_integer() else float(value)


def js_string(value: float) -> str:
    """X17: a number as JavaScript's String(number) writes it (1e-7, 1e+21, 1000)."""
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if number == 0:
        return "0"  # -0 too
    if number < 0:
        return "-" + js_string(-number)
    if math.isinf(number):
        return "Infinity"
    _, places, exponent = Decimal(repr(number)).as_tuple()
    assert isinstance(exponent, int)  # (finite)
    digits = "".join(map(str, places)).rstrip("0")
    k, n = len(digits), exponent + len(places)  # value = 0.<digits> x 10^n
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return f"{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    mantissa = digits[0] + (f".{digits[1:]}" if k > 1 else "")
    return f"{mantissa}e{'+' if n > 0 else '-'}{abs(n - 1)}"


# JavaScript's StringNumericLiteral: what Number(string) reads once trimmed.
_JS_NUMERIC = re.compile(
    r"[+-]?(?:Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
    r"|0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+"
)
_RADIX = {"x": 16, "X": 16, "b": 2, "B": 2, "o": 8, "O": 8}


def js_to_number(text: str) -> float:
    """X17: `Number(text)`; the grammar decides, as float() reads `1_000` and `inf`."""
    body = js_trim(text)
    if not body:
        return 0.0  # as Number("  ") is
    if not _JS_NUMERIC.fullmatch(body):
        return math.nan
    radix = _RADIX.get(body[1:2]) if body[0] == "0" else None
    if radix is None:
        return float(body)
    try:
        return float(int(body[2:], radix))
    except OverflowError:
        return math.inf


# -- timeouts (C16) -------------------------------------------------------------


def parse_positive_ms(raw: str | None) -> float | None:
    """C16, X17: milliseconds as Number() reads them, or None unless finite and > 0."""
    if raw is None:
        return None
    value = js_to_number(raw)
    if not math.isfinite(value) or value <= 0:
        return None
    return js_number(value)


def resolve_timeout_ms(flag: float | None, env: Mapping[str, str] = os.environ) -> float:
    """C16: the --timeout flag, else PI_COMS_TIMEOUT_MS when positive, else 30 min."""
    if flag is not None:
        return flag
    from_env = parse_positive_ms(env.get("PI_COMS_TIMEOUT_MS"))
    return from_env if from_env is not None else DEFAULT_TIMEOUT_MS


MAX_REPLY_TIMEOUT_MS = 86_400_000


def effective_timeout_ms(prompt: PromptEnvelope, default_ms: float) -> float:
    """X5: the asker's own positive `reply_timeout_ms` (a JSON number, at most 24 h),
    else C16's."""
    raw = prompt.reply_timeout_ms
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return default_ms
    if not math.isfinite(raw) or raw <= 0:
        return default_ms
    return js_number(min(raw, MAX_REPLY_TIMEOUT_MS))


def resumed_deadline(deadline: float, timeout_ms: float, now: float) -> float:
    """C16/X5 across a restart: a wall clock set back must not stretch the deadline."""
    return min(deadline, now + timeout_ms / 1000)


# -- ownership (X2) -----------------------------------------------------------


Admission = Literal["admit", "retry", "open", "closed"]
"""X2: open it; its asker retrying (ack, nothing more); or refused (open, closed lately)."""


def duplicate_error(qid: str) -> str:
    """X2: the nack for reusing a qid that is not the prompt's own."""
    return f"qid {qid} is already in use"


def admission(
    prompt: PromptEnvelope, open_prompt: PromptEnvelope | None, recently_closed: bool
) -> Admission:
    """X2: may this prompt open its question? A qid closed lately is refused: its human
    may still be answering, and a new question must not inherit that answer."""
    if open_prompt is not None:
        if (prompt.sender_endpoint, prompt.prompt) == (
            open_prompt.sender_endpoint, open_prompt.prompt):
            return "retry"
        return "open"
    return "closed" if recently_closed else "admit"


def may_cancel(cancel: CancelEnvelope, open_prompt: PromptEnvelope) -> bool:
    """X2: only the asker (its `sender_name`) cancels; a prompt naming none, nobody. It
    stops mistakes, not a peer of the same user claiming the name."""
    return open_prompt.sender_name != "" and cancel.from_ == open_prompt.sender_name


SENDER_LOG_LIMIT = 128


def duplicate_refused_record(
    at: datetime, qid: str, prompt: PromptEnvelope, reason: Literal["open", "closed"]
) -> LogRecord:
    """X1, X2: a refused reuse of `qid`; the claimed name bounded."""
    sender = truncate_utf16(prompt.sender_name, SENDER_LOG_LIMIT)
    return log_record(at, qid, "duplicate_refused", {"from": sender, "reason": reason})


def cancel_refused_record(at: datetime, cancel: CancelEnvelope) -> LogRecord:
    """X1, X2: a cancel from someone other than the asker."""
    sender = truncate_utf16(cancel.from_, SENDER_LOG_LIMIT)
    return log_record(at, cancel.ref_msg_id, "cancel_refused", {"from": sender})


# -- prompts (C3, C6) ---------------------------------------------------------


def _option(entry: Any) -> QuestionOption | None:
    if isinstance(entry, str):
        return QuestionOption(title=entry)
    if isinstance(entry, dict) and isinstance(entry.get("title"), str):
        description = entry.get("description")
        return QuestionOption(
            title=entry["title"],
            description=description if isinstance(description, str) else None,
        )
    return None


def parse_prompt(prompt: PromptEnvelope) -> ParsedPrompt:
    """C6: a JSON object with a string `question` is structured, anything else plain."""
    try:
        body = loads(prompt.prompt)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("question"), str):
        raw_options = body.get("options")
        entries = raw_options if isinstance(raw_options, list) else []
        options = tuple(o for o in map(_option, entries) if o is not None)
        context = body.get("context")
        has_context = isinstance(context, str) and js_trim(context) != ""
        return ParsedPrompt(
            question=body["question"],
            context=context if has_context else None,
            options=options,
        )
    return ParsedPrompt(
        question=prompt.prompt,
        context=f"From {prompt.sender_name} @ {prompt.sender_cwd}",
    )


# -- question text (C4, C5) ---------------------------------------------------


def scrub(text: str) -> str:
    """Lone surrogates to U+FFFD: they cannot reach Telegram or argv."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, as Telegram and JavaScript count (C5)."""
    return sum(2 if ord(ch) > 0xFFFF else 1 for ch in text)


def truncate_utf16(text: str, limit: int) -> str:
    """`text` in at most `limit` UTF-16 units, ending in an ellipsis when cut; a surrogate
    pair is never split."""
    if utf16_len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    budget = limit - utf16_len(ELLIPSIS)
    used = 0
    end = 0
    for end, ch in enumerate(text):  # noqa: B007
        width = 2 if ord(ch) > 0xFFFF else 1
        if used + width > budget:
            break
        used += width
    return text[:end] + ELLIPSIS


# -- markers only the bridge writes (X3) --------------------------------------

# Letters of other scripts read as H, U, B or Q (our Ɋ is none of them, nor decomposes).
_LOOKALIKES = {
    "Η": "h", "Н": "h", "н": "h", "Һ": "h", "һ": "h", "Ꮋ": "h",
    "Ս": "u", "ս": "u", "υ": "u", "ᑌ": "u",
    "Β": "b", "В": "b", "в": "b", "Ᏼ": "b", "ᗷ": "b",
    "Ԛ": "q", "ԛ": "q",
}
_INVISIBLE = frozenset({"Cf", "Mn", "Me"})
_COLONS = ":∶꞉˸ː׃፡᠄⁚"
# on folded text: HUB, Q, then a colon or a qid close after it
_MARKER = re.compile(
    r"h[\W_]{0,2}u[\W_]{0,2}b[\W_]{0,3}(q)"
    rf"(?=[\W_]{{0,3}}(?:[{_COLONS}]|[0-9a-z]{{26}}(?![0-9a-z])))"
)


def _fold(ch: str) -> str:
    """One character as a lenient matcher reads it: no invisible marks, NFKC, folded."""
    if unicodedata.category(ch) in _INVISIBLE:
        return ""
    lookalike = _LOOKALIKES.get(ch)
    if lookalike is not None:
        return lookalike
    return unicodedata.normalize("NFKC", ch).casefold()


def defuse_markers(text: str, keep: Sequence[tuple[int, int]] = ()) -> str:
    """X3: break every `HUB-Q:`-like marker outside the bridge's own `keep` ranges,
    matching generously; its Q becomes Ɋ/ɋ, one UTF-16 unit, so the text never grows (C5)."""
    folded: list[str] = []
    source: list[int] = []  # each folded character's index in `text`
    for index, ch in enumerate(text):
        for piece in _fold(ch):
            folded.append(piece)
            source.append(index)
    chars = list(text)
    for match in _MARKER.finditer("".join(folded)):
        index = source[match.start(1)]
        if any(start <= index < end for start, end in keep):
            continue
        chars[index] = "ɋ" if text[index].islower() else "Ɋ"
    return "".join(chars)


# -- directives only hermes reads (X8) ----------------------------------------

# `hermes send` uploads the file a `MEDIA:<path>` tag names and obeys `[[...]]`: each
# loses its ASCII colon or double bracket to a one-unit look-alike, so the text never grows.
_MEDIA_TAG = re.compile(r"(media):", re.IGNORECASE)


def defuse_directives(text: str) -> str:
    """X8: no `MEDIA:` tag and no `[[...]]` directive left for hermes to act on."""
    if ":" in text:
        text = _MEDIA_TAG.sub(lambda m: m.group(1) + "\ua789", text)
    return text.replace("[[", "\u27e6").replace("]]", "\u27e7")


def defuse(text: str, keep: Sequence[tuple[int, int]] = ()) -> str:
    """X3 and X8 on agent-supplied text: no marker but ours, no directive at all."""
    return defuse_directives(defuse_markers(text, keep))


# -- question text (C4, C5, X3, X4) -------------------------------------------

PROJECT_LIMIT = 128
_SPACES = re.compile(r"\s+")


def project_label(project: str) -> str:
    """X4: whitespace collapsed, at most 128 UTF-16 units, `default` when empty."""
    label = _SPACES.sub(" ", scrub(project)).strip()
    return truncate_utf16(label, PROJECT_LIMIT) if label else "default"


GROUP_MENTION = "@<bot name> "
"""X14: in a group, Telegram hands a bot only messages that mention it or reply to it."""


def is_group_target(target: str) -> bool:
    """`telegram:<chat_id>[:<thread_id>]` with a negative chat id: a group or its topic."""
    parts = target.split(":")
    return (len(parts) in (2, 3) and parts[0] == "telegram" and parts[1].startswith("-")
            and parts[1][1:].isdigit())


def format_question(
    qid: str,
    parsed: ParsedPrompt,
    limit: int = TELEGRAM_TEXT_LIMIT,
    *,
    project: str | None = None,
    group: bool = False,
) -> str:
    """C4, C5, X3, X4: the question's text in at most `limit` UTF-16 units, cut context
    first, then the question, then the rest; never the qid tag or the reply instruction,
    the only parts that keep a marker (X3, X8). In a `group` it names the bot (X14)."""
    tag = f"❓ {hub_tag(qid)} "
    question = scrub(parsed.question)
    project_line = f"\n\n📁 Project: {project_label(project)}" if project is not None else ""
    lines = [
        f"{i}. {scrub(o.title)}" + (f" — {scrub(o.description)}" if o.description else "")
        for i, o in enumerate(parsed.options, start=1)
    ]
    options = "\n\nOptions:\n" + "\n".join(lines) if lines else ""
    mention = GROUP_MENTION if group else ""
    instruction = f"\n\n↩ Reply to this message, or type: {mention}{answer_prefix(qid)} <answer>"
    rest = project_line + options + instruction
    fixed = utf16_len(tag) + utf16_len(question) + utf16_len(rest)
    context = scrub(parsed.context) if parsed.context else ""
    prefix = "\n\nContext: "
    room = limit - utf16_len(tag) - utf16_len(rest)
    if context and fixed + utf16_len(prefix) < limit:
        budget = limit - fixed - utf16_len(prefix)
        clipped = truncate_utf16(context, budget)
        body = tag + question + project_line + prefix + clipped + options
    elif fixed <= limit:
        body = tag + question + project_line + options
    elif room >= utf16_len(ELLIPSIS):
        body = tag + truncate_utf16(question, room) + project_line + options
    else:
        body = truncate_utf16(
            tag + question + project_line + options, limit - utf16_len(instruction)
        )
    text = body + instruction
    ours = ((0, min(len(tag), len(body))), (len(body), len(text)))
    return defuse(text, keep=ours)


# -- notes and errors (C13, C15, C17, C18) ------------------------------------


def cancel_note(qid: str) -> str:
    """C13: told to the human when the console answered first."""
    return f"✖ {hub_tag(qid)} The question was cancelled — it was answered from the console."


OPERATOR = "operator"
"""X15: the `by` an operator's cancel envelope carries (W18: upstream ignores it)."""


def cancel_outcome(qid: str, by_operator: bool) -> tuple[str, str | None, dict[str, str]]:
    """C13, X15: the note, the asker's error (None: no response) and the log detail; the
    operator's cancel leaves the asker waiting, so it is told."""
    if not by_operator:
        return cancel_note(qid), None, {"reason": "cancel envelope"}
    return (f"✖ {hub_tag(qid)} The question was cancelled by the operator.",
            "cancelled by the operator", {"by": OPERATOR})


def late_note(qid: str) -> str:
    """C15: told to the human when an answer came for a closed question."""
    return f"ℹ {hub_tag(qid)} This question is already closed; the late answer was ignored."


def undelivered_note(qid: str) -> str:
    """X11: hermes can fail after Telegram took the message: the answer is not dropped
    in silence."""
    return (
        f"ℹ {hub_tag(qid)} This question could not be confirmed delivered; its asker was "
        "told it failed, so this answer was not passed on."
    )


def unreadable_note(qid: str, reason: RejectReason) -> str:
    """X7: told to the human when their answer to an open question was refused."""
    return f"⚠ {hub_tag(qid)} Your answer could not be read ({reason}); please reply again."


def span(seconds: float) -> str:
    """45s, 3m07s, 2h05m, 1d04h."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


REMIND_QUESTION_LIMIT = 200  # UTF-16 units


def remind_after_s(timeout_ms: float, remind_before_ms: float | None) -> float | None:
    """X9: seconds after the asking the reminder is due; None when off or not after it."""
    if remind_before_ms is None or remind_before_ms >= timeout_ms:
        return None
    return (timeout_ms - remind_before_ms) / 1000


def remind_note(qid: str, left_s: float, question: str) -> str:
    """X9: it carries the marker, so a reply to it answers; agent text defused (X3, X8)."""
    line = truncate_utf16(defuse(scrub(first_line(question))), REMIND_QUESTION_LIMIT)
    left = span(round(left_s))  # 2.98 s is read as 3s, not 2s
    return f"⏰ {hub_tag(qid)} Still waiting for your answer, {left} left: {line}"


def timeout_note(qid: str, timeout_ms: float) -> str:
    """C17: told to the human."""
    return f"⌛ {hub_tag(qid)} The question timed out after {js_string(timeout_ms)}ms."


def timeout_error(timeout_ms: float) -> str:
    """C17: told to the asker."""
    return f"no remote answer within {js_string(timeout_ms)}ms"


def delivery_error(exit_code: int | None, stderr: str, stdout: str = "") -> str:
    """C18, in the upstream daemon's words; stdout when stderr is empty, no code when
    killed."""
    detail = (stderr.strip() or stdout.strip())
    code = "" if exit_code is None else f" ({exit_code})"
    return f"hermes send failed{code}" + (f": {detail}" if detail else "")


_DELIVERY_ERROR = re.compile(r"hermes send failed(?: \((-?\d+)\))?(?:: (.*))?", re.DOTALL)


def delivery_failure(error: str) -> tuple[int | None, str]:
    """C18's error taken apart for `status`: the exit status and the first line."""
    found = _DELIVERY_ERROR.fullmatch(error)
    if found is None:
        return None, first_line(error)
    code, detail = found.groups()
    return None if code is None else int(code), first_line(detail or "")


# -- answer files (C7-C10, C15) -----------------------------------------------


@dataclass(frozen=True, slots=True)
class Accepted:
    qid: str
    answer: AnswerFile


@dataclass(frozen=True, slots=True)
class Rejected:
    """The file fails C9; `qid` is the name's qid when it has a valid one."""

    reason: RejectReason
    qid: str | None = None
    error: str | None = None


def answer_name(qid: str) -> str:
    """C7: the one name an answer to `qid` can have."""
    return f"{qid}{ANSWER_SUFFIX}"


def qid_of_name(name: str) -> str | Rejected:
    """The qid an answer file's name carries, or why the name is refused (C9)."""
    base = os.path.basename(name)
    if not base.endswith(ANSWER_SUFFIX):
        return Rejected("invalid_path")
    qid = base[: -len(ANSWER_SUFFIX)]
    return qid if is_valid_qid(qid) else Rejected("invalid_qid")


def validate_answer(
    name: str, content: bytes | None, pending: Container[str]
) -> Accepted | Rejected:
    """C9: accepted, or the first rule broken; `content` None (over ANSWER_FILE_LIMIT,
    unread) is invalid_schema for an open qid."""
    qid = qid_of_name(name)
    if isinstance(qid, Rejected):
        return qid
    if qid not in pending:
        return Rejected("foreign_qid", qid)
    if content is None:
        return Rejected("invalid_schema", qid)
    try:
        body = loads(content.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one
        return Rejected("invalid_json", qid)
    try:
        answer = AnswerFile.model_validate(body)
    except ValidationError as exc:
        return Rejected("invalid_schema", qid, invalid_text(exc))  # X12 names the field
    if answer.qid != qid:
        return Rejected("qid_mismatch", qid)
    return Accepted(qid, answer)


# -- admission and cancel (X2, X10, C13, C14) ----------------------------------


def over_capacity(open_count: int, max_open: int) -> str | None:
    """The nack past `--max-open`, asked only once `admission` let the qid through (X2)."""
    if open_count >= max_open:
        return f"bridge has {open_count} open questions; try again later"
    return None


def over_asker_limit(asker: str, asker_open: int, limit: int | None) -> str | None:
    """X10: the nack for an asker with `limit` questions open, asked as `over_capacity`."""
    if limit is not None and asker_open >= limit:
        return f"{asker} has {asker_open} open questions; try again later"
    return None


def grace_ms(poll_ms: float) -> float:
    """C10: how long a file not yet JSON may wait, from its first sighting."""
    return max(2 * poll_ms, 1000)


# X7: reasons only an open question's file gets, so its human is told.
UNREADABLE_REASONS: frozenset[RejectReason] = frozenset(
    {"invalid_json", "invalid_schema", "qid_mismatch"}
)


# -- answers (C11) ------------------------------------------------------------


def map_answer(answer: str, options: tuple[QuestionOption, ...]) -> MappedAnswer:
    """C11: a number or a title picks an option; anything else is freeform."""
    text = js_trim(answer)
    if options:
        if _DIGITS.fullmatch(text):
            index = int(text) - 1
            if 0 <= index < len(options):
                return SelectionAnswer(selections=(options[index].title,))
        wanted = text.lower()
        for option in options:
            # the title as sent (defused, X3, X8) picks it too
            shown = defuse(scrub(option.title))
            if wanted in (option.title.lower(), shown.lower()):
                return SelectionAnswer(selections=(option.title,))
    return FreeformAnswer(text=text)


# -- states (C19) -------------------------------------------------------------

_OPEN: tuple[State | None, ...] = ("pending", "delivered")


def transition(state: State | None, event: Event) -> State | None:
    """C19: the next state (None: no question), or ValueError for a bug."""
    if state is None and event == "question_received":
        return "pending"
    if state == "pending" and event == "delivered":
        return "delivered"
    if state == "pending" and event == "delivery_error":
        return None
    if state in _OPEN and event in ("answered", "cancelled", "timeout"):
        return event
    if state in TERMINAL_STATES and event == "late_answer":
        return state
    raise ValueError(f"{event} is not allowed in state {state}")


# -- log (C20) ----------------------------------------------------------------

NO_QID = "0" * 26


def log_record(at: datetime, qid: str | None, event: Event, detail: Any = None) -> LogRecord:
    """C20: a file without a valid qid logs qid 000…0."""
    return LogRecord(at=iso(at), qid=qid if qid is not None else NO_QID, event=event, detail=detail)
