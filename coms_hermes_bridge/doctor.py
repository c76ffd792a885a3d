"""`coms-hermes-bridge doctor`: the chain from agent to human, checked link by link from
the outside, because a broken link otherwise shows much later and elsewhere (a first real
question that times out after 30 minutes)."""

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
from .ops import running_bridge

CHECK_TIMEOUT_S = 10.0  # for each program run; the socket ping has 2 s
PING_TIMEOUT_S = 2.0
SKILL = "hub-liaison"
UNIT = "coms-hermes-bridge@.service"
# what hermes 0.19 sends to as given, without its channel directory
TELEGRAM_CHAT = re.compile(r"-?\d+(?::\d+)?|@[A-Za-z0-9_]{4,32}")
LAZY_ENV = "HERMES_DISABLE_LAZY_INSTALLS"
TEST_TEXT = "coms-hermes-bridge doctor: a test message; nothing to answer."


@dataclass(frozen=True)
class Check:
    """One link: held (True), broken (False) or not there to check (None), and why; a
    `warning` holds but has a cost worth saying (it fails nothing)."""

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
    """Run a program for a check or a setup step: no shell, no stdin, bounded in time
    (CHECK_TIMEOUT_S unless given; past it, OSError)."""
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
    """Where hermes keeps this profile's files: `<root>/profiles/<name>` for a named
    profile, else `$HERMES_HOME` or `~/.hermes`. The root is `$HERMES_HOME` (or its
    root, when it is itself a profile's directory), else `~/.hermes`, as hermes reads it."""
    set_home = env.get("HERMES_HOME", "").strip()
    home = Path(set_home) if set_home else home_dir(env) / ".hermes"
    if profile and profile != "default":
        root = home.parent.parent if home.parent.name == "profiles" else home
        return root / "profiles" / profile
    return home


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
    yield _telegram_library(Path(found), env)


def interpreter(program: Path, env: Mapping[str, str]) -> str | None:
    try:
        with open(program, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":  # `#!/usr/bin/env [-S] python3`
        words = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(words[0], path=env.get("PATH")) if words else None
    if not words or os.path.basename(words[0]) in ("sh", "bash"):
        return None  # pip's shell launcher for long paths: the Python is not named here
    return words[0]


def _telegram_library(program: Path, env: Mapping[str, str]) -> Check:
    lazy = env.get(LAZY_ENV, "").strip() not in ("1", "true", "yes")
    python = interpreter(program, env)
    name = "python-telegram-bot"
    if python is None:
        return Check(name, None, f"cannot tell which Python runs {program}")
    try:
        done = run_program([python, "-c", "import telegram; print(telegram.__version__)"], env)
    except OSError as exc:
        return Check(name, None, f"cannot run {python}: {exc}")
    if done.returncode == 0:
        return Check(name, True, f"{done.stdout.strip()} for {python}")
    if lazy:
        return Check(name, True, f"not installed for {python}; hermes installs it at its first "
                     f"send (lazy installs allowed; that needs network, and {LAZY_ENV}=1 "
                     "forbids it)")
    return Check(name, False, f"not installed for {python}, and {LAZY_ENV}=1 forbids hermes "
                 f"to install it: `{python} -m pip install 'python-telegram-bot[webhooks]'`")


def check_target(config: BridgeConfig, env: Mapping[str, str]) -> Check:
    """--to as the daemon checks it, then looked up as `hermes send` would, in hermes'
    channel directory (`send --list`): a chat it cannot resolve fails only at the first
    question, 30 minutes later."""
    target = config.target
    try:
        warning = target_warning(target)
    except UsageError as exc:
        return Check("--to", False, str(exc))
    platform, _, chat = (part.strip() for part in target.strip().partition(":"))
    found = shutil.which(config.hermes, path=env.get("PATH")) or config.hermes
    profile = ["--profile", config.hermes_profile] if config.hermes_profile else []
    try:
        done = run_program([found, *profile, "send", "--list", platform, "--json"], env)
    except OSError as exc:
        return Check("--to", None, f"{target}: cannot ask hermes for its chats: {exc}")
    if done.returncode != 0:
        return Check("--to", False, f"{target}: {said(done, 0)}; set {platform} up in hermes "
                     "(`hermes gateway setup`) and start its gateway once")
    try:  # hermes' own JSON, read as loosely as it is written
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
    """The chat hermes picks for `<platform>:<chat>`: its id, its name (any case, `#`
    or not, with or without ` (<type>)`), else the one name that starts so."""
    def norm(value: object) -> str:
        return str(value).lstrip("#").strip().lower()
    query = norm(chat)
    exact = [c for c in chats if c.get("id") == chat or query in (
        norm(c.get("name")), norm(f"{c.get('name')} ({c.get('type')})"))]
    prefix = [c for c in chats if norm(c.get("name")).startswith(query)]
    return exact[0] if exact else prefix[0] if len(prefix) == 1 else None


def check_skill(config: BridgeConfig, env: Mapping[str, str]) -> Iterator[Check]:
    """The gateway's side of the answer file (W21): our liaison plugin (X14), or a
    hub-liaison skill of the operator's own. A plugin counts only when Hermes will load
    it and it is this package's copy: a disabled one never answers, an older one may
    write what this daemon no longer reads. Both at once are said too: each answers the
    same reply, so in a busy chat the skill's second file reaches a closed question."""
    home = hermes_home(env, config.hermes_profile)
    plugin = home / "plugins" / SKILL
    profile = f" --hermes-profile {config.hermes_profile}" if config.hermes_profile else ""
    install = f"`coms-hermes-bridge liaison install{profile}`"
    skill = _skill(home)
    has_plugin = (plugin / "plugin.yaml").is_file() and (plugin / "__init__.py").is_file()
    if has_plugin:
        yield _plugin(config, env, home, plugin, install)
    if skill is not None:
        yield Check(SKILL, True, f"skill at {skill}")
        if has_plugin:
            yield Check(SKILL, True, f"both the plugin and the skill are installed: in a busy "
                        "chat the skill may write a second answer file after the plugin's, "
                        "and the human then gets a needless ℹ note (the question is already "
                        f"closed); remove the skill ({skill.parent})", warning=True)
        else:
            yield Check(f"{SKILL} plugin", None, "not installed; it answers without an agent "
                        f"turn (no LLM call, no tokens) where the skill needs one: {install}")
    elif not has_plugin:
        yield Check(SKILL, False, f"the Hermes gateway has no {SKILL} plugin or skill, so no "
                    f"answer will ever come back; install the plugin with {install}")


def _skill(home: Path) -> Path | None:
    skills = home / "skills"
    for candidate in (skills / SKILL / "SKILL.md", *skills.glob(f"*/{SKILL}/SKILL.md")):
        if candidate.is_file():
            return candidate
    return None


def _plugin(config: BridgeConfig, env: Mapping[str, str], home: Path, plugin: Path,
            install: str) -> Check:
    """The installed plugin: this package's copy (file for file), and enabled in the
    profile's config.yaml, as Hermes' own code reads it (its format is Hermes' business)."""
    # here, not at the top: liaison_setup imports this module
    from .liaison_setup import _current, find_hermes, probe
    from .ops import OpsError

    where = home / "config.yaml"
    current = _current(plugin)
    try:
        enabled: bool | None = probe(find_hermes(config, env), env)["enabled"]
        unknown = ""
    except OpsError as exc:
        enabled, unknown = None, str(exc)
    version = ("this coms-hermes-bridge's version" if current else
               "not this coms-hermes-bridge's version (its files differ)")
    if enabled is None:
        said = f"cannot tell whether it is enabled in {where}: {unknown}"
    else:
        said = (f"enabled in {where}" if enabled else
                f"not enabled in {where} (plugins.enabled), so the gateway does not load it")
    fix = "" if current and enabled is not False else f"; run {install}"
    ok = None if current and enabled is None else current and bool(enabled)
    restart = " (a running gateway loads it when it starts)" if ok else ""
    return Check(SKILL, ok, f"plugin at {plugin}, {version}, {said}{fix}{restart}")


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
                     f"start it (`just run --project {config.project} --to …`, or its service)")
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
        return Check("service", False, f"{UNIT} is not installed; "
                     f"`just install-service {config.project} --to {config.target}`")
    return Check("service", False, f"{unit} is {state or 'not active'}; "
                 f"`systemctl --user enable --now {unit}`, then `journalctl --user -u {unit}`")


def check_send(config: BridgeConfig, env: Mapping[str, str]) -> Check:
    found = shutil.which(config.hermes, path=env.get("PATH")) or config.hermes  # for errors
    profile = ["--profile", config.hermes_profile] if config.hermes_profile else []
    try:
        done = run_program([found, *profile, "send", "--to", config.target, TEST_TEXT], env)
    except OSError as exc:
        return Check("test message", False, f"hermes send: {exc}")
    if done.returncode != 0:
        return Check("test message", False, f"hermes send failed ({done.returncode}): "
                     f"{said(done)}")
    return Check("test message", True, f"sent to {config.target}; look for it in Telegram")


def run_checks(
    config: BridgeConfig, env: Mapping[str, str], *, send_test: bool = False
) -> Iterator[Check]:
    """Every check in chain order, each as it is made (a slow one shows where it is)."""
    yield from check_hermes(config, env)
    yield check_target(config, env)
    yield from check_skill(config, env)
    yield from check_files(config)
    yield check_bridge(config)
    yield check_service(config, env)
    if send_test:
        yield check_send(config, env)
