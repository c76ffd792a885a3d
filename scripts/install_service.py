#!/usr/bin/env python3
"""Install the systemd user service for one coms project, and enable it.

    scripts/install_service.py PROJECT [--bin PATH] [--no-enable] DAEMON-FLAGS...

(`just install-service PROJECT --to telegram:<chat_id>` runs this.) It

- copies contrib/systemd/coms-hermes-bridge@.service to the user unit
  directory, with ExecStart pointing at the command to run (`--bin`, else
  `coms-hermes-bridge` on PATH, else this checkout's .venv);
- writes the daemon's flags, and a PATH on which `hermes` is found, to
  ~/.config/coms-hermes-bridge/PROJECT.env, which the unit reads;
- makes ~/.pi (the unit's only writable place besides ~/.hermes);
- runs `systemctl --user daemon-reload` and
  `systemctl --user enable --now coms-hermes-bridge@PROJECT.service`.

The flags are checked as the daemon would check them, so a typo fails here
and not in the journal five seconds later.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEMPLATE = ROOT / "contrib" / "systemd" / "coms-hermes-bridge@.service"
UNIT = "coms-hermes-bridge@.service"
DEFAULT_EXEC = "%h/.local/bin/coms-hermes-bridge"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
PASSED_ON = ("PI_COMS_DIR", "PI_COMS_TIMEOUT_MS")  # read by the daemon when set
_UNSAFE = re.compile(r"[\s\"'\\]")


class InstallError(Exception):
    """One line for the operator."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise InstallError(message)


def _parser() -> _Parser:
    p = _Parser(
        prog="just install-service",
        description="Install and enable coms-hermes-bridge@PROJECT.service (systemd --user).",
        allow_abbrev=False,
    )
    p.add_argument("--bin", metavar="PATH", help="the coms-hermes-bridge command to run")
    p.add_argument("--unit-dir", metavar="DIR", help="default: ~/.config/systemd/user")
    p.add_argument("--config-dir", metavar="DIR", help="default: ~/.config/coms-hermes-bridge")
    p.add_argument(
        "--no-enable", action="store_true", help="install only; no systemctl calls"
    )
    return p


def _config_home(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_CONFIG_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg)
    return Path(env.get("HOME") or os.path.expanduser("~")) / ".config"


def _command(explicit: str | None) -> Path:
    """The daemon command the unit will run: given, installed (pipx), or this checkout's."""
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise InstallError(f"--bin {explicit}: not an executable")
        return Path(found).absolute()
    found = shutil.which("coms-hermes-bridge")
    if found is not None and not Path(found).absolute().is_relative_to(ROOT):
        return Path(found).absolute()
    venv = ROOT / ".venv" / "bin" / "coms-hermes-bridge"
    if os.access(venv, os.X_OK):
        return venv
    raise InstallError("no coms-hermes-bridge command: `pipx install .`, or run scripts/dev once")


def _check_flags(project: str, flags: Sequence[str], env: Mapping[str, str]) -> None:
    """The daemon's own validation, so the service does not fail on start."""
    from coms_hermes_bridge.actors.config import UsageError, parse_config
    from coms_hermes_bridge.actors.registry import IdentityError, validate_project

    try:
        validate_project(project)
    except IdentityError as exc:
        raise InstallError(str(exc)) from exc
    for flag in flags:
        if flag == "--project" or flag.startswith("--project="):
            raise InstallError("the project is the instance name; do not pass --project")
        if flag in ("-h", "--help", "--version"):
            raise InstallError(f"{flag} is not a daemon setting")
        if _UNSAFE.search(flag) or "%" in flag or "$" in flag:
            raise InstallError(
                f"flag {flag!r} has a space, quote, backslash, % or $; put such a value"
                " in a drop-in (systemctl --user edit) instead"
            )
    try:
        notices = parse_config(["--project", project, *flags], env).notices
    except UsageError as exc:
        raise InstallError(str(exc)) from exc
    for notice in notices:  # what the daemon will warn of at each start, said now
        print(f"install-service: warning: {notice}", file=sys.stderr)


def _exec_path(command: Path) -> str:
    text = str(command)
    if _UNSAFE.search(text):
        raise InstallError(f"the command's path {text!r} has a space or quote; use --bin")
    return text.replace("%", "%%")


def unit_text(command: Path) -> str:
    """The template with ExecStart pointing at `command`."""
    template = TEMPLATE.read_text(encoding="utf-8")
    if DEFAULT_EXEC not in template:
        raise InstallError(f"{TEMPLATE} has no ExecStart={DEFAULT_EXEC}")
    return template.replace(DEFAULT_EXEC, _exec_path(command), 1)


def env_text(flags: Sequence[str], env: Mapping[str, str]) -> str:
    """The instance's EnvironmentFile: the flags, a PATH with hermes on it, passed-on settings."""
    lines = [
        "# Read by coms-hermes-bridge@.service; edit, then: systemctl --user restart <unit>",
        f"COMS_HERMES_BRIDGE_FLAGS={' '.join(flags)}",
    ]
    hermes = shutil.which("hermes", path=env.get("PATH"))
    path = SYSTEM_PATH
    if hermes is not None:
        where = str(Path(hermes).parent)
        if where not in SYSTEM_PATH.split(":"):
            path = f"{where}:{SYSTEM_PATH}"
    lines.append(f"PATH={path}")
    for name in PASSED_ON:
        value = env.get(name)
        if value and not _UNSAFE.search(value):
            lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _systemctl(*args: str) -> None:
    done = subprocess.run(
        ["systemctl", "--user", *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise InstallError(f"systemctl --user {' '.join(args)} failed: {why[0] if why else ''}")


def install(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Do the work; return what was done, one line each."""
    if not argv or argv[0].startswith("-"):
        raise InstallError("usage: install-service PROJECT [--bin PATH] [--no-enable] FLAGS...")
    project = argv[0]
    args, flags = _parser().parse_known_args(list(argv[1:]))
    _check_flags(project, flags, env)
    config_home = _config_home(env)
    unit_dir = Path(args.unit_dir) if args.unit_dir else config_home / "systemd" / "user"
    config_dir = (
        Path(args.config_dir) if args.config_dir else config_home / "coms-hermes-bridge"
    )
    command = _command(args.bin)
    env_path = config_dir / f"{project}.env"
    unit_path = unit_dir / UNIT
    _write(unit_path, unit_text(command), 0o644)
    _write(env_path, env_text(flags, env), 0o600)
    pi = Path(env.get("HOME") or os.path.expanduser("~")) / ".pi"
    pi.mkdir(mode=0o700, exist_ok=True)  # ReadWritePaths= needs it to exist
    done = [f"installed {unit_path} (runs {command})", f"wrote {env_path}"]
    instance = f"coms-hermes-bridge@{project}.service"
    if args.no_enable:
        done.append(f"not enabled; to start it: systemctl --user enable --now {instance}")
        return done
    _systemctl("daemon-reload")
    _systemctl("enable", "--now", instance)
    done.append(f"enabled and started {instance}; see: journalctl --user -u {instance}")
    return done


def main(argv: Sequence[str] | None = None) -> int:
    try:
        for line in install(sys.argv[1:] if argv is None else argv, os.environ):
            print(line)
    except (InstallError, OSError) as exc:
        print(f"install-service: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
