"""The liaison: the Hermes gateway plugin that turns a human's reply into an answer file
(X14, W21). It is copied into Hermes' plugins folder and runs in Hermes' own Python, so it
imports nothing of the daemon's: only the standard library and this folder.

It answers in the gateway's own turn, before any agent sees the message: no LLM, no
tokens, and the same text always makes the same file. In a busy chat Hermes hands the
message to its busy-session handler instead, past that hook; on the Hermes this was read
against the liaison wraps that handler (one guarded place, `_guard_busy_chats`), and
elsewhere answers from `pre_llm_call`, which cannot skip the replayed turn but tells the
model the answer has been delivered. Whatever it does not recognise, or cannot do, it
leaves to Hermes untouched; a fault of ours must never cost the human a message, so every
failure is logged and the message goes through.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import logging
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from .answers import (
    Answer,
    Reading,
    iso_now,
    read_answers,
    replied_qid,
    turn_answers,
    write_answer,
)
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
EDIT_TEXT = "✍ Edits are not passed on. If this message has no 👍, send the answer again."

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


def read_event(event: Any) -> Reading:
    """The answers a Telegram message event carries (X14), and the rest of its text."""
    source = getattr(event, "source", None)
    platform = getattr(getattr(source, "platform", None), "value", None)
    text = getattr(event, "text", None) or ""
    if platform != "telegram":
        return Reading([], text)
    raw = getattr(event, "raw_message", None)
    replied = _bot_qid(raw) if raw is not None else None
    if replied is None and MARKER not in text:
        return Reading([], text)
    return read_answers(text, replied)


async def _acknowledge(raw: Any, reaction: str | None, text: str) -> None:
    """`reaction` on the human's message; one short reply where a reaction is refused (a
    chat that allows none, an old client) or none is meant."""
    if reaction is not None:
        try:
            await raw.set_reaction(reaction)
            return
        except Exception as exc:
            log.info("%s: reaction refused (%s); replying instead", NAME, exc)
    try:
        await raw.reply_text(text)
    except Exception as exc:
        log.warning("%s: could not acknowledge the answer: %s", NAME, exc)


def _schedule_ack(raw: Any, reaction: str | None = ACK_REACTION, text: str = ACK_TEXT) -> None:
    if raw is None:
        return
    try:
        task = asyncio.get_running_loop().create_task(_acknowledge(raw, reaction, text))
    except RuntimeError as exc:  # no loop here: the answer stands, only the 👍 is lost
        log.warning("%s: cannot acknowledge outside the gateway's loop: %s", NAME, exc)
        return
    _acks.add(task)
    task.add_done_callback(_acks.discard)


def _take_answers(event: Any, gateway: Any, where: str = "") -> Reading | None:
    """Write the answers an event carries and acknowledge them; None when it carries none
    this sender may give (the event is Hermes' alone). The Reading says what was written
    and what is left for Hermes. An edited message writes nothing: the answer as first
    sent stands, so an edit must not make a second file (the human is told)."""
    _learn_username(event)
    reading = read_event(event)
    if not reading.answers or not _authorized(gateway, event.source):
        return None
    raw = getattr(event, "raw_message", None)
    if getattr(raw, "edit_date", None):
        log.info("%s: an edited answer is not passed on", NAME)
        _schedule_ack(raw, None, EDIT_TEXT)
        return Reading([], "")
    by, at, directory = _answered_by(event), iso_now(), questions_dir()
    for answer in reading.answers:
        write_answer(directory, answer, by, at)
        _remember(_written, (answer.qid, answer.text))
    log.info("%s: answered %s for %s%s", NAME, ", ".join(a.qid for a in reading.answers),
             by, where)
    try:
        _schedule_ack(raw)
    except Exception:
        log.exception("%s: could not acknowledge the answer", NAME)
    return reading


def on_gateway_dispatch(
    event: Any = None, gateway: Any = None, session_store: Any = None, **_: Any
) -> dict[str, str] | None:
    """Hermes' pre_gateway_dispatch hook: `{"action": "skip"}` once the answers are
    written, `{"action": "rewrite"}` to the rest when the message also carries text that
    answers nothing, None (Hermes carries on) for anything else or on any fault of ours."""
    _guard_busy_chats(gateway, event)
    try:
        taken = _take_answers(event, gateway)
    except Exception:
        log.exception("%s: could not write an answer; the message is left to Hermes", NAME)
        return None
    if taken is None:
        return None
    if taken.rest:
        return {"action": "rewrite", "text": taken.rest}
    qids = ", ".join(a.qid for a in taken.answers) or "nothing (an edit)"
    return {"action": "skip", "reason": f"{NAME} answered {qids}"}


# -- Hermes' private busy-session path: one place, one Hermes version ------------------

BUSY_PATH_HERMES = "0.19."  # the Hermes whose busy-session code this was read against
_busy_path_said = False


@functools.cache
def _hermes_version() -> str:
    try:
        return importlib.metadata.version("hermes-agent")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _guard_busy_chats(gateway: Any, event: Any) -> None:
    """In a chat where a turn runs, Hermes hands a message not to pre_gateway_dispatch but
    to its adapter's busy-session handler, which interrupts (or steers) the turn and
    replays the message as a new one. Wrap that handler, once per adapter, so an answer
    there is written and acknowledged as in an idle chat, and never becomes a turn.

    Private Hermes code, so only on the version it was read against and only where its
    names are there; anywhere else this says so once in Hermes' log, and pre_llm_call
    (on_llm_call) answers from the replayed turn instead."""
    global _busy_path_said
    try:
        platform = getattr(getattr(event, "source", None), "platform", None)
        if getattr(platform, "value", None) != "telegram":
            return  # answers come by Telegram alone: other adapters are left as they are
        adapters = getattr(gateway, "adapters", None)
        adapter = adapters.get(platform) if isinstance(adapters, dict) else None
        inner = getattr(adapter, "_busy_session_handler", None)
        if getattr(inner, "hub_liaison", False) or adapter is None:
            return
        version = _hermes_version()
        if not (version.startswith(BUSY_PATH_HERMES) and callable(inner)
                and callable(getattr(adapter, "set_busy_session_handler", None))):
            if not _busy_path_said:
                _busy_path_said = True
                log.warning("%s: Hermes %s has no busy-session handler this liaison knows; "
                            "answers in a busy chat are taken from the agent's turn", NAME,
                            version or "(unknown version)")
            return

        async def guard(event: Any, session_key: Any) -> Any:
            try:
                taken = _take_answers(event, gateway, " in a busy chat")
            except Exception:
                log.exception("%s: could not write an answer; the message is left to Hermes",
                              NAME)
                taken = None
            if taken is not None and not taken.rest:
                return True  # handled: no interrupt, no turn
            if taken is not None:
                event.text = taken.rest
            return await inner(event, session_key)

        guard.hub_liaison = True  # type: ignore[attr-defined]
        adapter.set_busy_session_handler(guard)
    except Exception:
        log.exception("%s: could not guard busy chats; the agent's turn answers there", NAME)


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
