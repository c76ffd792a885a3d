"""What a human's Telegram message answers, and the answer file it becomes (X14, C7, C8).

Pure reading first (`replied_qid`, `read_answers`), so every rule is table-tested without
a gateway; then the one write, done as W21 and C9 expect: a temporary name in the
questions directory, then a rename, so the bridge never reads half a file it could take
for a bad one. Stdlib only: this runs in Hermes' Python.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .markers import ANSWER_HEAD_PATTERN, MARKER, REPLY_QUOTE_PATTERN, TAG_PATTERN, is_qid

ANSWER_SUFFIX = ".answer.json"
_LINE_HEAD = f"{MARKER}:"


@dataclass(frozen=True)
class Answer:
    """One question's answer as the human typed it, trimmed at its ends only."""

    qid: str
    text: str


def replied_qid(question_text: str | None) -> str | None:
    """The qid of a bot message that names exactly one question, else None.

    Every bracketed marker counts, valid or not: a message naming two questions (or one
    we cannot read) is ambiguous, and an answer must never land on a guess."""
    tags = TAG_PATTERN.findall(question_text or "")
    if len(tags) != 1 or not is_qid(tags[0]):
        return None
    return str(tags[0])


@dataclass(frozen=True)
class Reading:
    """What one message carries: its answers, and the rest of its text, which is no
    answer and so is Hermes' to read ("" when nothing is left)."""

    answers: list[Answer]
    rest: str


def read_answers(text: str, replied: str | None) -> Reading:
    """X14: the answers one message (or one merged event of several) carries.

    An answer runs from its `HUB-Q:<qid>:` to the next line starting with `HUB-Q:`; what
    comes before the first such line answers the replied-to question, if there is one.
    Lines are kept as typed; only the ends of each answer are trimmed. What answers
    nothing (text before the first `HUB-Q:` line with no reply, a `HUB-Q:` line with a bad
    qid and the lines after it, an answer empty once trimmed) is the rest, as typed: a
    slip in one line must neither swallow the answers around it nor vanish unseen."""
    found: list[Answer] = []
    rest: list[str] = []
    qid = replied  # the question of the segment being read
    body: list[str] = []  # its answer's lines
    typed: list[str] = []  # its lines as typed, head included

    def close() -> None:
        answer = "\n".join(body).strip()
        if qid is not None and answer:
            found.append(Answer(qid, answer))
        else:
            rest.extend(typed)

    for line in text.split("\n"):
        if line.startswith(_LINE_HEAD):
            close()
            head = ANSWER_HEAD_PATTERN.match(line)
            qid = head.group(1) if head else None
            body, typed = [line[head.end():] if head else ""], []
        else:
            body.append(line)
        typed.append(line)
    close()
    return Reading(found, "\n".join(rest).strip())


def turn_answers(user_message: str) -> list[Answer]:
    """X14 in a busy chat: the answers of an agent turn's user message, as Hermes words it.

    Hermes keeps only the replied-to message's text (its quote), not who wrote it, so a
    quote naming exactly one question stands for the reply; the quote is cut at the first
    `"]` and a blank line, and the rest is read as any message is (`read_answers`)."""
    quoted = REPLY_QUOTE_PATTERN.match(user_message)
    replied = replied_qid(quoted.group(1)) if quoted else None
    text = user_message[quoted.end():] if quoted else user_message
    if replied is None and MARKER not in text:
        return []
    return read_answers(text, replied).answers


def iso_now() -> str:
    """C8's `at`, as the daemon writes its own times (UTC, milliseconds, Z)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def answer_body(answer: Answer, answered_by: str, at: str) -> bytes:
    """C8: exactly the four fields, UTF-8 JSON."""
    record = {"qid": answer.qid, "answer": answer.text, "answered_by": answered_by, "at": at}
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


def write_answer(directory: Path, answer: Answer, answered_by: str, at: str) -> Path:
    """C7: `<dir>/<qid>.answer.json`, private (0600), whole or not at all: written under
    a temporary name the bridge refuses to read as an answer, then renamed over."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = directory / f"{answer.qid}{ANSWER_SUFFIX}"
    temporary = directory / f".{target.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    body = answer_body(answer, answered_by, at)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target
