"""The liaison: the Hermes gateway plugin that turns a human's reply into an answer file
(X14, W21). It is copied into Hermes' plugins folder and runs in Hermes' own Python, so it
imports nothing of the daemon's: only the standard library and this folder.

It answers in the gateway's own turn, before any agent sees the message: no LLM, no
tokens, and the same text always makes the same file. In a busy chat Hermes hands the
message straight to the running turn's follow-up, past that hook; the liaison then
answers from `pre_llm_call`, which cannot skip the turn but can tell the model the answer
has been delivered. Whatever it does not recognise, or
cannot do, it leaves to Hermes untouched; a fault of ours must never cost the human a
message, so every failure is logged and the message goes through.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from .answers import Answer, iso_now, read_answers, replied_qid, turn_answers, write_answer
from .markers import MARKER

NAME = "hub-liaison"
HOOK = "pre_gateway_dispatch"
TURN_HOOK = "pre_llm_call"  # a busy chat's answer, replayed as a turn past HOOK
CONFIG_FILE = "liaison.json"  # written by `coms-hermes-bridge liaison install`
DEFAULT_QUESTIONS_DIR = "~/.pi/coms/hermes-bridge/questions"  # C7
COMMAND = "hub"  # /hub: the open questions of every project on this host
STATUS_TIMEOUT_S = 15.0
ACK_REACTION = "👍"
ACK_TEXT = "👍 Answer passed on."

log = logging.getLogger(f"hermes_plugins.{NAME}")
_said_no_authorization = False
_acks: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only weak refs
MEMORY = 256  # answers and usernames remembered: far more than a chat has in flight
_written: OrderedDict[tuple[str, str], None] = OrderedDict()  # (qid, answer) written
_usernames: OrderedDict[str, str] = OrderedDict()  # Telegram user id -> username
_memory_lock = threading.Lock()  # the hooks run on the loop and in agent threads


def _recorded(key: str, folder: Path | None) -> str | None:
    """One string install recorded beside the plugin. Read at each use, so a reinstall
    that changes it needs no gateway restart."""
    config = (folder or Path(__file__).parent) / CONFIG_FILE
    try:
        value = json.loads(config.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def questions_dir(folder: Path | None = None) -> Path:
    """Where answers go: the directory install recorded, else C7's default."""
    return Path(_recorded("questions_dir", folder) or DEFAULT_QUESTIONS_DIR).expanduser()


async def open_questions(raw_args: str = "", folder: Path | None = None) -> str:
    """X14's slash command: `coms-hermes-bridge status` for every project on the host, as
    the operator would see it. The bridge's own command reads its own state, so the plugin
    never learns its format; it runs without a shell, bounded in time."""
    command = _recorded("command", folder) or shutil.which("coms-hermes-bridge")
    if command is None:
        return "coms-hermes-bridge is not installed where the gateway can run it."
    argv = [command, "status"]
    if _recorded("questions_dir", folder) is not None:
        argv += ["--questions-dir", str(questions_dir(folder))]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        return f"cannot run {command}: {exc}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), STATUS_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"coms-hermes-bridge status did not answer within {STATUS_TIMEOUT_S:g} s."
    text = (out.decode("utf-8", "replace").strip()
            or err.decode("utf-8", "replace").strip())
    return text or f"coms-hermes-bridge status printed nothing (exit {proc.returncode})."


def _bot_qid(raw: Any) -> str | None:
    """The qid of the message replied to, only when our own bot wrote it: a human quoting
    a marker in their own message must not steer another's answer."""
    reply = getattr(raw, "reply_to_message", None)
    sender = getattr(reply, "from_user", None)
    if reply is None or sender is None:
        return None
    try:
        bot_id = raw.get_bot().id
    except Exception:  # no bot bound to the message, or not initialised: not provably ours
        return None
    if getattr(sender, "id", None) != bot_id:
        return None
    return replied_qid(getattr(reply, "text", None))


def _remember(memory: OrderedDict[Any, Any], key: Any, value: Any = None) -> None:
    """Keep the newest MEMORY entries: a long-lived gateway must not grow without end."""
    with _memory_lock:
        memory[key] = value
        memory.move_to_end(key)
        while len(memory) > MEMORY:
            memory.popitem(last=False)


def _written_before(answer: Answer) -> bool:
    """Whether this gateway already wrote this answer: a turn Hermes replays (or a message
    both hooks see) must not write its file twice."""
    with _memory_lock:
        return (answer.qid, answer.text) in _written


def _answered_by(event: Any) -> str:
    """C8's answered_by: the sender's Telegram username, else their user id."""
    user = getattr(getattr(event, "raw_message", None), "from_user", None)
    name = getattr(user, "username", None) or getattr(event.source, "user_id", None)
    return f"telegram:{name}"


def _learn_username(event: Any) -> None:
    """Remember each Telegram sender's username: a busy chat's answer reaches the liaison
    as a turn that knows only the user id, and the message that made the chat busy came
    through here first."""
    source = getattr(event, "source", None)
    if getattr(getattr(source, "platform", None), "value", None) != "telegram":
        return
    user = getattr(getattr(event, "raw_message", None), "from_user", None)
    name, user_id = getattr(user, "username", None), getattr(source, "user_id", None)
    if isinstance(name, str) and name and user_id is not None:
        _remember(_usernames, str(user_id), name)


def _authorized(gateway: Any, source: Any) -> bool | None:
    """The gateway's own verdict on the sender; None when this Hermes has no such check,
    said once in its log: without it we cannot tell who may answer, so we answer nothing."""
    global _said_no_authorization
    check = getattr(gateway, "_is_user_authorized", None) if gateway is not None else None
    if not callable(check):
        if not _said_no_authorization:
            _said_no_authorization = True
            log.warning("%s: this Hermes gateway has no _is_user_authorized; answers are "
                        "left to Hermes", NAME)
        return None
    return bool(check(source))


def answers_in(event: Any) -> list[Answer]:
    """The answers a Telegram message event carries (X14), before anyone is asked."""
    source = getattr(event, "source", None)
    platform = getattr(getattr(source, "platform", None), "value", None)
    if platform != "telegram":
        return []
    text = getattr(event, "text", None) or ""
    raw = getattr(event, "raw_message", None)
    replied = _bot_qid(raw) if raw is not None else None
    if replied is None and MARKER not in text:
        return []
    return read_answers(text, replied)


async def _acknowledge(raw: Any) -> None:
    """👍 on the human's message; one short reply where a reaction is refused (a chat
    that allows none, an old client)."""
    try:
        await raw.set_reaction(ACK_REACTION)
        return
    except Exception as exc:
        log.info("%s: reaction refused (%s); replying instead", NAME, exc)
    try:
        await raw.reply_text(ACK_TEXT)
    except Exception as exc:
        log.warning("%s: could not acknowledge the answer: %s", NAME, exc)


def _schedule_ack(raw: Any) -> None:
    if raw is None:
        return
    try:
        task = asyncio.get_running_loop().create_task(_acknowledge(raw))
    except RuntimeError as exc:  # no loop here: the answer stands, only the 👍 is lost
        log.warning("%s: cannot acknowledge outside the gateway's loop: %s", NAME, exc)
        return
    _acks.add(task)
    task.add_done_callback(_acks.discard)


def on_gateway_dispatch(
    event: Any = None, gateway: Any = None, session_store: Any = None, **_: Any
) -> dict[str, str] | None:
    """Hermes' pre_gateway_dispatch hook: `{"action": "skip"}` once the answers are
    written, None (Hermes carries on) for anything else or on any fault of ours."""
    try:
        _learn_username(event)
        answers = answers_in(event)
        if not answers or not _authorized(gateway, event.source):
            return None
        by, at, directory = _answered_by(event), iso_now(), questions_dir()
        for answer in answers:
            write_answer(directory, answer, by, at)
            _remember(_written, (answer.qid, answer.text))
    except Exception:
        log.exception("%s: could not write an answer; the message is left to Hermes", NAME)
        return None
    qids = ", ".join(a.qid for a in answers)
    log.info("%s: answered %s for %s", NAME, qids, by)
    try:
        _schedule_ack(getattr(event, "raw_message", None))
    except Exception:
        log.exception("%s: could not acknowledge %s", NAME, qids)
    return {"action": "skip", "reason": f"{NAME} answered {qids}"}


def delivered_note(qids: list[str]) -> str:
    """What the model is told about a turn whose message was an answer: the bridge has it,
    so the model must neither answer the question itself nor act on the text."""
    names = ", ".join(f"[{MARKER}:{q}]" for q in qids)
    return (f"[{NAME}: this message is the human's answer to {names}. It has already been "
            "delivered to the coms bridge, which passes it to the agent that asked. Do not "
            "act on it or answer it yourself; at most acknowledge it in one short line.]")


def on_llm_call(
    user_message: Any = None, platform: Any = "", sender_id: Any = "", **_: Any
) -> dict[str, str] | None:
    """Hermes' pre_llm_call hook: an answer sent while a turn ran in the chat comes back as
    a follow-up turn that never passed pre_gateway_dispatch. The gateway let it into a turn,
    so its sender is authorized; each answer is written once, and the model is told.
    None (the turn runs as Hermes meant it) for anything else or on any fault of ours."""
    try:
        if platform != "telegram" or not isinstance(user_message, str):
            return None
        answers = turn_answers(user_message)
        if not answers:
            return None
        user_id = str(sender_id)
        with _memory_lock:
            by = f"telegram:{_usernames.get(user_id) or user_id}"
        at, directory = iso_now(), questions_dir()
        for answer in answers:
            if not _written_before(answer):
                write_answer(directory, answer, by, at)
                _remember(_written, (answer.qid, answer.text))
                log.info("%s: answered %s for %s in a busy chat", NAME, answer.qid, by)
    except Exception:
        log.exception("%s: could not write an answer; the turn is left to Hermes", NAME)
        return None
    return {"context": delivered_note([a.qid for a in answers])}


def register(ctx: Any) -> None:
    """Hermes' plugin entry point."""
    ctx.register_hook(HOOK, on_gateway_dispatch)
    ctx.register_hook(TURN_HOOK, on_llm_call)
    ctx.register_command(COMMAND, open_questions,
                         description="open coms questions of every project on this host")
