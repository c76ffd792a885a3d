"""The `coms-hermes-bridge` command: the daemon, or the operator's verb its first word names
(no daemon flag is a bare word)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import getpass
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from . import liaison_setup
from .actors.config import (
    DEFAULT_PROJECT,
    BridgeConfig,
    HelpFormatter,
    Parser,
    UsageError,
    parse_config,
)
from .actors.loop import report
from .actors.registry import IdentityError, validate_project
from .doctor import run_checks
from .messages.contract import span
from .messages.contract import truncate_utf16 as _clip
from .messages.wire import SelectionAnswer, dumps, is_valid_qid
from .ops import OpsError, answer, cancel, project_of, projects, status

VERBS = {  # each verb's --help
    "status": "List open questions (qid, asker, state, age, time left, the question's first "
    "line), recently closed ones and the deliveries that failed within the hour. Reads the "
    "state file read-only; safe while the daemon runs.",
    "answer": "Write the answer file for an open question, as the Hermes gateway would; the "
    "running bridge (or the next one to start) picks it up. With options, a number or a title "
    "selects that option.",
    "cancel": "Send the running bridge the operator's cancel for an open question: the asker "
    "gets the error response `cancelled by the operator`, the human a ✖ note saying so.",
    "doctor": "Check each link from agent to human, one line each, ✔ or ✖ with the fix: "
    "hermes, the --to target (sending nothing), the liaison, the questions directory and "
    "state file, the running bridge and its service. Exit 0 only when none is ✖.",
    "liaison": "Install, remove or check the liaison, the Hermes gateway plugin that writes "
    "the answer file when the human replies (`status`: exit 0 only when it is current and "
    "enabled). Restart a running gateway after a change.",
}


def _parser() -> Parser:
    p = Parser(prog="coms-hermes-bridge")
    verbs = p.add_subparsers(dest="verb")
    parsers = [verbs.add_parser(verb, description=text, allow_abbrev=False,
                                formatter_class=HelpFormatter)
               for verb, text in VERBS.items()]
    for v in parsers:
        v.add_argument("--project", help="coms project\n(default: every project for status, "
                       "the one that has the qid open for answer and cancel, `default` for "
                       "doctor and liaison)")
        v.add_argument("--questions-dir", metavar="DIR",
                       help="the daemon's --questions-dir, if it was given\n"
                       "(default: ~/.pi/coms/hermes-bridge/questions)")
    s, a, c, d, li = parsers
    s.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    s.add_argument("--closed", type=int, default=10, metavar="N",
                   help="closed questions to show\n(default: 10)")
    a.add_argument("--by", metavar="NAME",
                   help="who answered, as the asker is told\n(default: cli:<your login>)")
    a.add_argument("qid")
    a.add_argument("text", nargs="+", help="the answer; several words are joined by spaces")
    c.add_argument("qid")
    d.add_argument("--to", metavar="TARGET", help="the daemon's --to\n(default: telegram)")
    d.add_argument("--hermes-profile", metavar="PROFILE",
                   help="the daemon's --hermes-profile\n(default: hermes' own)")
    d.add_argument("--send-test", action="store_true", help="also send one test message")
    li.add_argument("action", choices=("install", "uninstall", "status"))
    li.add_argument("--hermes-profile", metavar="PROFILE",
                    help="the Hermes profile whose gateway gets the plugin\n"
                    "(default: hermes' own)")
    return p


def _config(args: argparse.Namespace, project: str | None = None) -> BridgeConfig:
    project = project or args.project or DEFAULT_PROJECT
    validate_project(project)
    flags = [f"--{flag.replace('_', '-')}={value}"  # (--to: doctor judges it, in a line)
             for flag in ("questions_dir", "hermes_profile")
             if (value := getattr(args, flag, None)) is not None]
    return parse_config(["--project", project, *flags], os.environ)


def _ago(at: str | None, now: datetime) -> str:
    try:  # none, or without a zone: unknown, not guessed
        return f"{span((now - datetime.fromisoformat(at or '')).total_seconds())} ago"
    except (TypeError, ValueError):
        return "-"


def render(st: dict[str, Any], now: datetime | None = None) -> str:
    """The table `status` prints, from its --json object."""
    moment = now or datetime.now(UTC)
    bridge = st["bridge"]
    lines = [f"bridge for project {st['project']}: not running" if bridge is None else
             f"bridge {bridge['name']}@{st['project']}: running (pid {bridge['pid']}, "
             f"up since {bridge['started_at']})",
             f"open questions: {len(st['open'])}"]
    if st["open"]:
        lines.append(f"  {'QID':<26}  {'ASKER':<16}  {'STATE':<9}  {'AGE':>7}  {'LEFT':>7}  "
                     "QUESTION")
        lines += [f"  {row['qid']:<26}  {_clip(row['asker'] or '-', 16):<16}  {row['state']:<9}  "
                  f"{span(row['age_s']):>7}  {span(row['time_left_s']):>7}  "
                  f"{_clip(row['question'], 72)}" for row in st["open"]]
    if st["closed"]:
        lines.append(f"recently closed: {len(st['closed'])}")
        lines += [f"  {row['qid']:<26}  {row['state']:<9}  {_ago(row['closed_at'], moment)}"
                  for row in st["closed"]]
    if st["failed"]:
        lines.append(f"failed deliveries (last hour): {len(st['failed'])}")
        lines.append(f"  {'QID':<26}  {'ASKER':<16}  {'EXIT':>4}  {'WHEN':>10}  ERROR")
        lines += [f"  {row['qid']:<26}  {_clip(row['asker'] or '-', 16):<16}  "
                  f"{'-' if row['exit_status'] is None else row['exit_status']:>4}  "
                  f"{_ago(row['at'], moment):>10}  {_clip(row['error'] or '-', 72)}"
                  for row in st["failed"]]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.verb == "doctor":
        broken = False
        config = dataclasses.replace(config, target=config.target if args.to is None else args.to)
        for check in run_checks(config, os.environ, send_test=args.send_test):
            print(check.line(), flush=True)
            broken |= check.ok is False
        return 1 if broken else 0
    if args.verb == "liaison":
        return _liaison(args.action, config)
    if args.verb == "status":
        limit = max(0, args.closed)
        if args.project is not None:
            known = projects(config)
            if args.project not in known:
                raise OpsError(f"no bridge and no state for project {args.project} (projects "
                               f"here: {', '.join(known) or 'none'})")
            st = status(config, closed_limit=limit)
            print(dumps(st, indent=2) if args.json else render(st))
            return 0
        # one block per project; one that cannot be read is said, the others shown
        every: list[dict[str, Any]] = []
        failed: list[tuple[str, str]] = []
        for project in projects(config):
            try:
                every.append(status(_config(args, project), closed_limit=limit))
            except OpsError as exc:
                failed.append((project, str(exc)))
        if args.json:
            errors = [{"project": p, "error": e} for p, e in failed]
            print(dumps({"projects": every + errors}, indent=2))
        else:  # no bridge anywhere yet: say so for the default project
            blocks = [render(st) for st in every or ([] if failed else [status(config, limit)])]
            blocks += [f"bridge for project {p}: cannot read its state: {e}" for p, e in failed]
            print("\n\n".join(blocks))
        return 1 if failed else 0
    if not is_valid_qid(args.qid):
        raise OpsError(f"{args.qid!r} is not a qid (26 characters, Crockford base32)")
    if args.project is None:  # a qid is unique: its own project's bridge has it
        config = _config(args, project_of(config, args.qid))
    if args.verb == "answer":
        by = args.by if args.by is not None else f"cli:{_login()}"
        written = answer(config, args.qid, " ".join(args.text), by)
        mapped = written.mapped
        meaning = (
            f"selects {mapped.selections[0]!r}"
            if isinstance(mapped, SelectionAnswer)
            else f"freeform {json.dumps(mapped.text, ensure_ascii=False)}"
        )
        later = "" if written.bridge else " (no bridge is running; the next one to start reads it)"
        print(f"answered {args.qid}: {meaning}; wrote {written.path}{later}")
    else:
        bridge = cancel(config, args.qid)
        print(f"cancelled {args.qid} through {bridge.name} (pid {bridge.pid})")
    return 0


def _liaison(action: str, config: BridgeConfig) -> int:
    if action == "status":
        lines, ok = liaison_setup.status(config, os.environ)
    else:
        lines = (liaison_setup.install if action == "install" else liaison_setup.uninstall)(
            config, os.environ)
        ok = True
    for line in lines:
        print(line, flush=True)
    return 0 if ok else 1


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def main(argv: Sequence[str] | None = None) -> int:
    """Run a verb if the first word names one, else the daemon."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in VERBS and not args[0].startswith("-"):  # a mistyped verb
        near = difflib.get_close_matches(args[0], VERBS, n=1)
        report(f"unknown command {args[0]!r}; " + (f"did you mean {near[0]}?" if near else
                                                   f"the commands are {', '.join(VERBS)}"))
        return 1
    if not args or args[0] not in VERBS:
        from .actors.daemon import main as daemon

        return daemon(args)
    try:
        return _run(_parser().parse_args(args))
    except (UsageError, IdentityError, OpsError) as exc:
        report(str(exc))
        return 1
    except BrokenPipeError:  # `status | head`
        return 0
