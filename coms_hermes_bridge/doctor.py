"""`coms-hermes-bridge doctor`: the chain from agent to human, link by link, because a
broken link otherwise shows as a first question that times out 30 minutes later."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .actors.config import BridgeConfig, UsageError, home_dir, target_warning
from .actors.responses import exchange, failure
from .actors.state_view import read_snapshot
from .messages.wire import PingEnvelope
from .ops import OpsError, running_bridge

CHECK_TIMEOUT_S = 10.0
PING_TIMEOUT_S = 2.0
SKILL = "hub-liaison"
UNIT = "coms-hermes-bridge@.service"
TELEGRAM_CHAT = re.compile(r"-?\d+(?::\d+)?|@[A-Za-z0-9_]{4,32}")
TEST_TEXT = "coms-hermes-bridge doctor: a test message; nothing to answer."


@dataclass(frozen=True)
class Check:
    """One link: held (True), broken (False) or not there to check (None); a `warning`
    holds but has a cost worth saying."""

    name: str
    ok: bool | None
    detail: str
    warning: bool = False

    def line(self) -> str:
        mark = "⚠" if self.warning else {True: "✔", False: "✖", None: "–"}[self.ok]
        return f"{mark} {self.name}: {self.detail}"


def run_program(
    argv: list[str], env: Mapping[str, str], timeout_s: float | None = None
) -> subprocess.CompletedProcess[str]:
    """No shell, no stdin, bounded in time (past it, OSError)."""
    limit = CHECK_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        return subprocess.run(
            argv, env=dict(env), capture_output=True, text=True, errors="replace",
            timeout=limit, stdin=subprocess.DEVNULL, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise OSError(f"did not finish in {limit:g}s") from exc


def said(done: subprocess.CompletedProcess[str], line: int = -1) -> str:
    """The last (or another) line a program wrote, for a one-line error."""
    text = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return text[line][:300] if text else f"exit {done.returncode}"


def hermes_home(env: Mapping[str, str], profile: str | None) -> Path:
    """Where hermes keeps this profile's files, as hermes reads it: `<root>/profiles/<name>`,
    the root being `$HERMES_HOME` (or its root, if that is a profile's) or `~/.hermes`."""
    set_home = env.get("HERMES_HOME", "").strip()
    home = Path(set_home) if set_home else home_dir(env) / ".hermes"
    if profile and profile != "default":
        root = home.parent.parent if home.parent.name == "profiles" else home
        return root / "profiles" / profile
    return home


def hermes_argv(config: BridgeConfig, env: Mapping[str, str], *words: str) -> list[str]:
    """hermes as the daemon runs it, in its profile; its bare name when not on PATH, for
    the error to name."""
    found = shutil.which(config.hermes, path=env.get("PATH")) or config.hermes
    profile = ["--profile", config.hermes_profile] if config.hermes_profile else []
    return [found, *profile, *words]


def check_hermes(config: BridgeConfig, env: Mapping[str, str]) -> Iterator[Check]:
    found = shutil.which(config.hermes, path=env.get("PATH"))
    if found is None:
        yield Check("hermes", False, f"{config.hermes!r} is not on PATH; install hermes-agent "
                    "(pip install hermes-agent) or put hermes on the daemon's PATH")
        return
    try:
        done = run_program([found, "--version"], env)
    except OSError as exc:
        yield Check("hermes", False, f"{found} --version: {exc}")
        return
    if done.returncode != 0:
        yield Check("hermes", False, f"{found} --version failed: {said(done)}")
        return
    version = (done.stdout.strip().splitlines() or ["no version printed"])[0][:100]
    yield Check("hermes", True, f"{found} ({version})")
    profile = config.hermes_profile
    if profile:
        where = hermes_home(env, profile)
        yield (Check("hermes profile", True, f"{profile} at {where}") if where.is_dir() else
               Check("hermes profile", False, f"no profile {profile!r} at {where}; "
                     f"create it with `hermes profile create {profile}` or drop --hermes-profile"))


def check_target(config: BridgeConfig, env: Mapping[str, str]) -> Check:
    """--to as the daemon checks it, then as `hermes send` resolves it (`send --list`)."""
    target = config.target
    try:
        warning = target_warning(target)
    except UsageError as exc:
        return Check("--to", False, str(exc))
    platform, _, chat = (part.strip() for part in target.strip().partition(":"))
    try:
        done = run_program(hermes_argv(config, env, "send", "--list", platform, "--json"), env)
    except OSError as exc:
        return Check("--to", None, f"{target}: cannot ask hermes for its chats: {exc}")
    if done.returncode != 0:
        return Check("--to", False, f"{target}: {said(done, 0)}; set {platform} up in hermes "
                     "(`hermes gateway setup`) and start its gateway once")
    try:  # hermes' JSON, read loosely
        chats = [c for cs in json.loads(done.stdout)["platforms"].values() for c in cs]
        known = _resolve(chat, chats) if chat else None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return Check("--to", None, f"{target}: cannot read hermes' chats: {exc!r}")
    if not chat:
        held = f"hermes has {platform} and sends to its home channel"
    elif known is not None:
        held = f"hermes knows this chat: {known.get('name')} ({known.get('id')})"
    elif platform.lower() == "telegram" and not TELEGRAM_CHAT.fullmatch(chat):
        names = ", ".join(str(c.get("name")) for c in chats[:10]) or "none yet"
        return Check("--to", False, f"{target}: hermes has no telegram chat named {chat!r} "
                     f"(its chats: {names}); give the chat id, or write to the bot from that "
                     "chat while the gateway runs")
    else:
        held = "hermes sends to it as given, but has not seen this chat yet"
        warning = warning or "the human must have written to the bot there first"
    return Check("--to", True, f"{target}: {held}" + (f"; {warning}" if warning else ""),
                 warning=warning is not None)


def _resolve(chat: str, chats: list[dict[str, object]]) -> dict[str, object] | None:
    """The chat hermes picks: its id, its name (any case, `#` or not, ` (<type>)` or not),
    else the one name that starts so."""
    def norm(value: object) -> str:
        return str(value).lstrip("#").strip().lower()
    query = norm(chat)
    exact = [c for c in chats if c.get("id") == chat or query in (
        norm(c.get("name")), norm(f"{c.get('name')} ({c.get('type')})"))]
    prefix = [c for c in chats if norm(c.get("name")).startswith(query)]
    return exact[0] if exact else prefix[0] if len(prefix) == 1 else None


def check_liaison(config: BridgeConfig, env: Mapping[str, str]) -> Iterator[Check]:
    """The gateway's side of the answer file (W21): the liaison plugin as `liaison status`
    judges it (X14), or an operator's hub-liaison skill. Both at once answer one reply
    twice: the skill's file then reaches a closed question."""
    from .liaison_setup import checks  # here: liaison_setup imports this module

    home = hermes_home(env, config.hermes_profile)
    try:
        plugin = checks(config, env)
    except OpsError as exc:  # no hermes to ask: a plugin not there is still not there
        where = home / "plugins" / SKILL
        absent = "" if where.is_dir() else f"not installed at {where}; "
        plugin = [Check(SKILL, False if absent else None,
                        f"{absent}cannot check the plugin: {exc}")]
    skills = home / "skills"
    skill = next((path for path in (skills / SKILL / "SKILL.md",
                                    *skills.glob(f"*/{SKILL}/SKILL.md")) if path.is_file()), None)
    installed = len(plugin) > 1  # not installed (or not checkable) is one line
    if skill is None or installed:
        yield from plugin
    if skill is None:
        return
    yield Check(SKILL, True, f"skill at {skill}")
    if installed:
        yield Check(SKILL, True, "both the plugin and the skill are installed: in a busy chat "
                    "the skill may write a second answer file after the plugin's, and the human "
                    "then gets a needless ℹ note (the question is already closed); remove the "
                    f"skill ({skill.parent})", warning=True)
    else:
        yield Check(f"{SKILL} plugin", None, f"{plugin[0].detail}; the plugin answers without "
                    "an agent turn (no LLM call, no tokens), the skill needs one")


def check_files(config: BridgeConfig) -> Iterator[Check]:
    directory = config.questions_dir
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        yield Check("questions directory", None, f"{directory} is not there yet; the bridge "
                    "makes it (0700) when it starts")
    except OSError as exc:
        yield Check("questions directory", False, f"{directory}: {exc}")
    else:
        if not stat.S_ISDIR(st.st_mode):
            yield Check("questions directory", False, f"{directory} is not a directory")
        elif st.st_uid != os.getuid():
            yield Check("questions directory", False, f"{directory} belongs to uid {st.st_uid}, "
                        f"not to us ({os.getuid()}): another user could forge answers")
        elif st.st_mode & 0o077:
            yield Check("questions directory", False, f"{directory} is mode "
                        f"{stat.S_IMODE(st.st_mode):04o}; `chmod 700 {directory}` (the bridge "
                        "tightens it at start)")
        else:
            yield Check("questions directory", True, f"{directory} (ours, 0700)")
    try:
        snapshot = read_snapshot(config.state_path, 0)
    except FileNotFoundError:
        yield Check("state", None, f"no {config.state_path} yet (made at the first start)")
    except OSError as exc:
        yield Check("state", False, f"{exc}")
    else:
        yield Check("state", True, f"{config.state_path}, {len(snapshot.open)} open question(s)")


def check_bridge(config: BridgeConfig) -> Check:
    entry = running_bridge(config)
    name = f"bridge {config.project}"
    if entry is None:
        return Check(name, False, f"no live bridge registered for project {config.project}; "
                     f"start it (`coms-hermes-bridge --project {config.project} --to …`, or "
                     "its service)")
    try:
        reply = exchange(entry.endpoint, PingEnvelope(msg_id="doctor").to_line(), PING_TIMEOUT_S)
    except OSError as exc:
        return Check(name, False, f"{entry.name} (pid {entry.pid}) does not answer at "
                     f"{entry.endpoint}: {failure(exc)}")
    if b'"type":"pong"' not in reply.partition(b"\n")[0]:
        return Check(name, False, f"{entry.name} at {entry.endpoint} answered a ping with "
                     f"{reply[:200]!r}")
    return Check(name, True, f"{entry.name} (pid {entry.pid}) answers at {entry.endpoint}")


def check_service(config: BridgeConfig, env: Mapping[str, str]) -> Check:
    unit = f"coms-hermes-bridge@{config.project}.service"
    systemctl = shutil.which("systemctl", path=env.get("PATH"))
    if systemctl is None:
        return Check("service", None, "no systemd here (no systemctl)")
    try:
        done = run_program([systemctl, "--user", "is-active", unit], env)
    except OSError as exc:
        return Check("service", None, f"systemctl --user did not answer: {exc}")
    state = done.stdout.strip()
    if done.returncode == 0 and state == "active":
        return Check("service", True, f"{unit} is active")
    if state in ("", "unknown") and "bus" in done.stderr.lower():
        return Check("service", None, f"no systemd user manager to ask ({said(done)})")
    config_home = Path(env.get("XDG_CONFIG_HOME") or home_dir(env) / ".config")
    if not (config_home / "systemd" / "user" / UNIT).is_file():
        return Check("service", False, f"{UNIT} is not installed; `scripts/dev install-service "
                     f"{config.project} --to {config.target}` in the checkout")
    return Check("service", False, f"{unit} is {state or 'not active'}; "
                 f"`systemctl --user enable --now {unit}`, then `journalctl --user -u {unit}`")


def check_send(config: BridgeConfig, env: Mapping[str, str]) -> Check:
    try:
        done = run_program(hermes_argv(config, env, "send", "--to", config.target, TEST_TEXT),
                           env)
    except OSError as exc:
        return Check("test message", False, f"hermes send: {exc}")
    if done.returncode != 0:
        return Check("test message", False, f"hermes send failed ({done.returncode}): "
                     f"{said(done)}")
    return Check("test message", True, f"sent to {config.target}; look for it in Telegram")


def run_checks(
    config: BridgeConfig, env: Mapping[str, str], *, send_test: bool = False
) -> Iterator[Check]:
    """In chain order, each as it is made (a slow one shows where it is)."""
    yield from check_hermes(config, env)
    yield check_target(config, env)
    yield from check_liaison(config, env)
    yield from check_files(config)
    yield check_bridge(config)
    yield check_service(config, env)
    if send_test:
        yield check_send(config, env)
