"""The daemon's settings and the command line that makes them. The flags are the TypeScript
daemon's (its service files keep working) plus our own; a bad value is one line and exit 1.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from .. import __version__
from ..messages.contract import parse_positive_ms, resolve_timeout_ms

DEFAULT_NAME = "user-remote"
DEFAULT_PROJECT = "default"
DEFAULT_TARGET = "telegram"
DEFAULT_POLL_MS = 1000
MIN_POLL_MS = 10
DEFAULT_SEND_TIMEOUT_MS = 60_000
DEFAULT_MAX_OPEN = 10_000
SAFE_PROFILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_HEARTBEAT_MS = 30_000
HEARTBEAT_ENV = "COMS_HERMES_BRIDGE_HEARTBEAT_MS"
# a file handed on and not disposed of is offered again this long after (a crash lost it)
DEFAULT_REOFFER_MS = 30_000
REOFFER_ENV = "COMS_HERMES_BRIDGE_REOFFER_MS"


class UsageError(Exception):
    """A bad command line or environment: the message is the whole story."""


@dataclass(frozen=True)
class BridgeConfig:
    name: str
    project: str
    target: str
    hermes_profile: str | None
    timeout_ms: float
    poll_ms: float
    send_timeout_ms: float
    questions_dir: Path
    log_path: Path
    state_path: Path
    coms_dir: Path
    hermes: str = "hermes"
    max_open: int = DEFAULT_MAX_OPEN
    max_open_per_asker: int | None = None  # X10: off by default, for parity
    remind_before_ms: float | None = None  # X9: off by default, for parity
    heartbeat_ms: float = DEFAULT_HEARTBEAT_MS
    reoffer_ms: float = DEFAULT_REOFFER_MS
    notices: tuple[str, ...] = ()  # warnings said once on stderr at start


class Parser(argparse.ArgumentParser):
    """A bad command line is a UsageError (one line, exit 1), not argparse's usage and exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


class HelpFormatter(argparse.HelpFormatter):
    """Wrapped help in which a line break stays one: each default on a line of its own."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        wrap = super()._split_lines  # (zero-argument super() fails in the comprehension)
        return [line for part in text.splitlines() for line in wrap(part, width)]


class _DaemonHelp(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """... and the epilog as written."""


HELP_EPILOG = f"""\
operator's commands (the same program, first word):
  status [--project P] [--json]       open questions, failed deliveries, recent closes
  answer QID TEXT... [--project P] [--by NAME]
                                      answer an open question by hand
  cancel QID [--project P]            close an open question; its asker gets an error
  doctor [--project P] [--to T] [--hermes-profile X] [--send-test]
                                      check the chain from agent to human, link by link
  liaison install|uninstall|status [--hermes-profile P]
                                      the Hermes gateway plugin that writes the answers
  (coms-hermes-bridge status --help, and so on, for each)

environment:
  HOME                     the bridge's files: ~/.pi/coms/hermes-bridge/ (questions/, log, state)
  PI_COMS_DIR              the coms root: registry and sockets (default: ~/.pi/coms)
  PI_COMS_TIMEOUT_MS       per-question timeout when --timeout is not given (default: 1800000)
  PATH                     where `hermes` is found
  NOTIFY_SOCKET            systemd's notify socket (Type=notify): READY=1, WATCHDOG=1, STOPPING=1
  WATCHDOG_USEC, WATCHDOG_PID
                           systemd's watchdog (WatchdogSec=): pinged at half the interval
  JOURNAL_STREAM           set by systemd: stderr lines then carry journald priorities
  {HEARTBEAT_ENV}
                           registry heartbeat interval in ms (default: 30000; tests and drills)
  {REOFFER_ENV}
                           re-offer of an answer file handed on and not disposed of, in ms
                           (default: 30000; a safety net, lengthened by tests)
  COMS_HERMES_BRIDGE_DEBUG any value: actor tracebacks on stderr

signals: SIGTERM/SIGINT stop cleanly (exit 0).
exit status: 0 after SIGTERM/SIGINT, 1 on a bad command line or when the daemon gives up,
  3 when this project and name already have a bridge running (it names its pid).
"""


def _parser() -> Parser:
    p = Parser(
        prog="coms-hermes-bridge",
        description="Join the coms pool as the remote human: ask via `hermes send`, "
        "answer from the Hermes gateway's answer files.",
        epilog=HELP_EPILOG,
        formatter_class=_DaemonHelp,
        allow_abbrev=False,
    )
    p.add_argument("--name", default=DEFAULT_NAME,
                   help="the name agents address the human by\n(default: user-remote)")
    p.add_argument("--project", default=DEFAULT_PROJECT,
                   help="the coms project whose agents may ask\n(default: default)")
    p.add_argument("--to", action="append", metavar="TARGET",
                   help="where `hermes send` sends questions: telegram, telegram:<chat_id>, "
                   "telegram:<chat_id>:<thread_id> or telegram:<chat name>\n"
                   "(default: telegram, hermes' home channel)")
    p.add_argument("--hermes-profile", metavar="PROFILE",
                   help="the hermes profile to send with\n(default: hermes' own)")
    p.add_argument("--timeout", metavar="MS", help="how long a question waits for its answer, "
                   "in ms\n(default: PI_COMS_TIMEOUT_MS, else 1800000)")
    p.add_argument("--poll-ms", metavar="MS", help="how often the answer files are looked over "
                   "again, in ms, at least 10\n(default: 1000)")
    p.add_argument("--questions-dir", metavar="DIR", help="where answer files arrive; its "
                   "parent must exist and gets the log and state\n"
                   "(default: ~/.pi/coms/hermes-bridge/questions)")
    p.add_argument("--send-timeout", metavar="MS",
                   help="the longest one `hermes send` may take, in ms\n(default: 60000)")
    p.add_argument("--max-open", metavar="N",
                   help="open questions past which new ones are refused\n(default: 10000)")
    p.add_argument("--max-open-per-asker", metavar="N", help="open questions one agent may "
                   "have; its next one is refused\n(default: off)")
    p.add_argument("--remind-before", metavar="MS", help="remind the human once, this long "
                   "before a question times out, in ms\n(default: off)")
    # accepted, unused: a unit that passes it still starts
    p.add_argument("--claim-ms", help=argparse.SUPPRESS)
    p.add_argument("--version", action="version", version=f"coms-hermes-bridge {__version__}")
    return p


def _positive(flag: str, raw: str | None) -> float | None:
    if raw is None:
        return None
    value = parse_positive_ms(raw)
    if value is None:
        raise UsageError(f"{flag} must be a positive number")
    return value


def _count(flag: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{flag} must be a positive whole number")
    return int(raw)


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> BridgeConfig:
    """Flags and environment to settings, or UsageError naming what is wrong."""
    args = _parser().parse_args(list(argv))
    if args.to is not None and len(args.to) > 1:
        raise UsageError("--to may only be specified once")
    target = args.to[0] if args.to else DEFAULT_TARGET
    notices = tuple(filter(None, [target_warning(target)]))
    profile = args.hermes_profile
    if profile is not None and not SAFE_PROFILE.fullmatch(profile):
        raise UsageError(f"--hermes-profile must be a safe profile name: {profile!r}")
    timeout = _positive("--timeout", args.timeout)
    poll = _positive("--poll-ms", args.poll_ms) or DEFAULT_POLL_MS  # (never 0: positive)
    if poll < MIN_POLL_MS:  # a rescan every 1e-9 ms keeps a core busy for nothing
        raise UsageError(f"--poll-ms must be at least {MIN_POLL_MS} (ms between rescans)")
    send_timeout = _positive("--send-timeout", args.send_timeout) or DEFAULT_SEND_TIMEOUT_MS
    max_open = _count("--max-open", args.max_open) or DEFAULT_MAX_OPEN
    per_asker = _count("--max-open-per-asker", args.max_open_per_asker)
    remind = _positive("--remind-before", args.remind_before)
    timeout_ms = resolve_timeout_ms(timeout, env)
    if remind is not None and remind >= timeout_ms:  # X5: a prompt's own may be longer
        notices += (f"--remind-before {remind:.15g} ms is not below the timeout, "
                    f"{timeout_ms:.15g} ms: only a question that asks for a longer "
                    "timeout of its own gets a reminder",)
    home = home_dir(env)
    bridge_dir = home / ".pi" / "coms" / "hermes-bridge"
    questions = (
        Path(args.questions_dir).expanduser() if args.questions_dir else bridge_dir / "questions"
    ).absolute()
    if args.questions_dir and not questions.parent.is_dir():  # a typo makes no directories
        raise UsageError(f"--questions-dir {questions}: its parent {questions.parent} is not "
                         "a directory")
    coms_dir = Path(env.get("PI_COMS_DIR") or home / ".pi" / "coms").absolute()
    return BridgeConfig(
        name=args.name,
        project=args.project,
        target=target,
        hermes_profile=profile,
        timeout_ms=timeout_ms,
        poll_ms=poll,
        send_timeout_ms=send_timeout,
        questions_dir=questions,
        log_path=questions.parent / "log.ndjson",
        # one file per project, so that bridges of two projects sharing the
        # questions directory never restore each other's questions
        state_path=questions.parent / state_file_name(args.project, args.name),
        coms_dir=coms_dir,
        max_open=max_open,
        max_open_per_asker=per_asker,
        remind_before_ms=remind,
        heartbeat_ms=_heartbeat_ms(env),
        reoffer_ms=_reoffer_ms(env),
        notices=notices,
    )


def target_warning(target: str) -> str | None:
    """The one check of --to (daemon, install-service, doctor): UsageError for a target
    `hermes send` cannot take, a warning for a platform the liaison does not answer on."""
    platform, colon, chat = target.strip().partition(":")
    if not target.strip():
        raise UsageError("--to must not be empty")
    if not platform.strip():
        raise UsageError(f"--to {target!r} names no platform: give telegram, "
                         "telegram:<chat_id> or telegram:<chat name>")
    if colon and not chat.strip():  # `telegram:$CHAT` with the variable unset, say
        raise UsageError(f"--to {target!r} has nothing after the colon: give the chat, or "
                         "telegram alone for hermes' home channel")
    if platform.strip().lower() == DEFAULT_TARGET:
        return None
    return (f"--to {target}: answers come back only from Telegram (the liaison listens "
            "there alone); answer other questions with `coms-hermes-bridge answer`")


def state_file_name(project: str, name: str) -> str:
    """The default name's file is the project's; another name is another peer, with state
    of its own (X13). `@` is in no project and no name."""
    peer = project if name == DEFAULT_NAME else f"{project}@{name}"
    return f"state-{peer}.sqlite3"


def home_dir(env: Mapping[str, str]) -> Path:
    """`$HOME`, else the password database's (as Node's os.homedir()); an empty HOME is a
    mistake: files must not land at `/`."""
    home = env.get("HOME")
    if home is None:
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = ""
        if not home:
            raise UsageError("HOME is not set and the password database has no home for "
                             f"uid {os.getuid()}")
    elif not home:
        raise UsageError("HOME is set but empty: set it to your home directory, or unset it")
    return Path(home)


def _heartbeat_ms(env: Mapping[str, str]) -> float:
    """W6's interval; shorter only for tests and drills (it must stay well under 90 s)."""
    raw = env.get(HEARTBEAT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_HEARTBEAT_MS
    value = parse_positive_ms(raw)
    if value is None or value > 60_000:
        raise UsageError(f"{HEARTBEAT_ENV} must be a positive number of ms up to 60000")
    return value


def _reoffer_ms(env: Mapping[str, str]) -> float:
    """No upper bound: a test sets an hour, so no answer is rescued by this net."""
    raw = env.get(REOFFER_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_REOFFER_MS
    value = parse_positive_ms(raw)
    if value is None:
        raise UsageError(f"{REOFFER_ENV} must be a positive number of ms")
    return value
