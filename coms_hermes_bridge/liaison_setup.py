"""`coms-hermes-bridge liaison install | uninstall | status`: the liaison plugin (X14) where
the Hermes gateway loads it (`<hermes home>/plugins/<name>/`, enabled in its config), with
the file that tells it where answers go. A gateway loads plugins only when it starts."""

from __future__ import annotations

import filecmp
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import liaison
from .actors.config import BridgeConfig
from .doctor import Check, hermes_argv, hermes_home, run_program, said
from .ops import OpsError

NAME = liaison.NAME
PLUGIN_FILES = ("plugin.yaml", "__init__.py", "answers.py", "markers.py")
RUN_TIMEOUT_S = 60.0  # hermes starts in about 2 s, far slower on a loaded machine
RESTART = ("a running Hermes gateway loads plugins only when it starts: restart it "
           "(`hermes gateway restart`, or its service) for the liaison to take effect")
HOOKS = (liaison.HOOK, liaison.TURN_HOOK)  # an idle chat's answers, and a busy chat's
# run by Hermes' own Python
_PROBE = """
import json
from hermes_cli import plugins
name = {name!r}
enabled = plugins._get_enabled_plugins() or set()
print(json.dumps({{"hook": all(hook in plugins.VALID_HOOKS for hook in {hooks!r}),
                  "enabled": name in enabled and name not in plugins._get_disabled_plugins()}}))
"""


@dataclass(frozen=True)
class Hermes:
    """The hermes on PATH, the Python that runs it, and the profile's home."""

    program: str
    python: str
    home: Path

    @property
    def plugin_dir(self) -> Path:
        return self.home / "plugins" / NAME


def interpreter(program: Path, env: Mapping[str, str]) -> str | None:
    """The Python that a script's `#!` line names, directly or through `env`, or that
    pip's launcher for a long or spaced path names on its second line."""
    try:
        with open(program, "rb") as f:
            first, second = f.readline(512), f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":  # `#!/usr/bin/env [-S] python3`
        words = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(words[0], path=env.get("PATH")) if words else None
    if words == ["/bin/sh"] and second.startswith(b"'''exec' "):  # pip's: PY "$0" "$@"
        try:
            words = shlex.split(second.decode("utf-8", "replace"))
        except ValueError:  # an unclosed quote: not pip's
            return None
        return words[1] if len(words) >= 4 and words[-2:] == ["$0", "$@"] else None
    if not words or os.path.basename(words[0]) in ("sh", "bash"):
        return None  # a shell script: the Python is not named
    return words[0]


def find_hermes(config: BridgeConfig, env: Mapping[str, str]) -> Hermes:
    program = shutil.which(config.hermes, path=env.get("PATH"))
    if program is None:
        raise OpsError(f"{config.hermes!r} is not on PATH; the liaison is a plugin of the "
                       "Hermes gateway: install hermes-agent first")
    python = interpreter(Path(program), env)
    if python is None:
        raise OpsError(f"cannot tell which Python runs {program}")
    home = hermes_home(env, config.hermes_profile)
    if config.hermes_profile and not home.is_dir():
        raise OpsError(f"no Hermes profile {config.hermes_profile!r} at {home}")
    return Hermes(program, python, home)


def _run(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return run_program(argv, env, RUN_TIMEOUT_S)
    except OSError as exc:
        raise OpsError(f"{argv[0]}: {exc}") from exc


def probe(hermes: Hermes, env: Mapping[str, str]) -> dict[str, bool]:
    """The hooks known, our plugin enabled: asked of Hermes' own code (its config's format
    is Hermes' business)."""
    code = _PROBE.format(name=NAME, hooks=HOOKS)
    done = _run([hermes.python, "-c", code], {**env, "HERMES_HOME": str(hermes.home)})
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
        return {"hook": bool(found["hook"]), "enabled": bool(found["enabled"])}
    except (IndexError, ValueError, KeyError, TypeError):
        raise OpsError(f"cannot ask {hermes.python} about Hermes' plugins: {said(done)}") from None


def _source() -> Path:
    return Path(liaison.__file__).parent


def _current(target: Path) -> bool:
    """The installed copy is ours, file for file."""
    return all((target / name).is_file() and filecmp.cmp(_source() / name, target / name,
                                                         shallow=False)
               for name in PLUGIN_FILES)


def _command() -> str | None:
    """This coms-hermes-bridge's absolute path, for the plugin's slash command."""
    ran = Path(sys.argv[0])
    if ran.name == "coms-hermes-bridge" and ran.is_file():
        return str(ran.resolve())
    found = shutil.which("coms-hermes-bridge")
    return str(Path(found).resolve()) if found else None


def _settings(config: BridgeConfig) -> dict[str, str | None]:
    return {"questions_dir": str(config.questions_dir), "command": _command()}


def _copy(target: Path, settings: dict[str, str | None]) -> None:
    """Built beside the target, then swapped in: a gateway never loads half a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = target.with_name(f".{NAME}.{os.getpid()}.new")
    old = target.with_name(f".{NAME}.{os.getpid()}.old")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(mode=0o700)
    for name in PLUGIN_FILES:
        shutil.copyfile(_source() / name, fresh / name)
    (fresh / liaison.CONFIG_FILE).write_text(json.dumps(settings, indent=2) + "\n",
                                             encoding="utf-8")
    if target.exists():
        target.rename(old)
    fresh.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def install(config: BridgeConfig, env: Mapping[str, str]) -> list[str]:
    hermes = find_hermes(config, env)
    if not probe(hermes, env)["hook"]:
        raise OpsError(f"this Hermes ({hermes.program}) lacks the {' and '.join(HOOKS)} hooks"
                       " for plugins; the liaison needs a newer hermes-agent")
    target = hermes.plugin_dir
    settings = _settings(config)
    config_file = target / liaison.CONFIG_FILE
    try:
        recorded = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        recorded = None
    lines: list[str] = []
    if _current(target) and recorded == settings:
        lines.append(f"{NAME} is up to date at {target}")
    else:
        was = "upgraded" if target.exists() else "installed"
        _copy(target, settings)
        lines.append(f"{NAME} {was} at {target} (answers go to {settings['questions_dir']})")
    if not probe(hermes, env)["enabled"]:
        done = _run(hermes_argv(config, env, "plugins", "enable", NAME,
                                "--no-allow-tool-override"), env)
        if done.returncode != 0 or not probe(hermes, env)["enabled"]:
            raise OpsError(f"`hermes plugins enable {NAME}` failed: {said(done)}")
        lines.append(f"{NAME} enabled in Hermes")
    else:
        lines.append(f"{NAME} is enabled in Hermes")
    lines.append(RESTART)
    return lines


def uninstall(config: BridgeConfig, env: Mapping[str, str]) -> list[str]:
    hermes = find_hermes(config, env)
    target = hermes.plugin_dir
    if not target.exists():
        return [f"{NAME} is not installed at {target}"]
    if probe(hermes, env)["enabled"]:
        done = _run(hermes_argv(config, env, "plugins", "disable", NAME), env)
        if done.returncode != 0:
            raise OpsError(f"`hermes plugins disable {NAME}` failed: {said(done)}")
    shutil.rmtree(target)
    return [f"{NAME} removed from {target}", RESTART]


def checks(config: BridgeConfig, env: Mapping[str, str]) -> list[Check]:
    """Installed and current, enabled, the hooks known; the first alone when not installed."""
    hermes = find_hermes(config, env)
    target = hermes.plugin_dir
    profile = f" --hermes-profile {config.hermes_profile}" if config.hermes_profile else ""
    install = f"run `coms-hermes-bridge liaison install{profile}`"
    if not target.is_dir():
        return [Check(NAME, False, f"not installed at {target}; {install}")]
    found = probe(hermes, env)
    current = _current(target)
    has = "has them" if found["hook"] else "lacks one of them; upgrade hermes-agent"
    return [
        Check(NAME, current, f"installed at {target}" if current else
              f"an older copy at {target}; {install}"),
        Check(NAME, found["enabled"], "enabled in Hermes" if found["enabled"] else
              f"not enabled; {install}"),
        Check(", ".join(HOOKS), found["hook"], f"this Hermes {has}"),
    ]


def status(config: BridgeConfig, env: Mapping[str, str]) -> tuple[list[str], bool]:
    """`checks` and where answers go; True when the liaison answers once the gateway has
    (re)started."""
    found = checks(config, env)
    lines = [check.line() for check in found]
    if len(found) > 1:
        plugin = hermes_home(env, config.hermes_profile) / "plugins" / NAME
        lines.append(f"  answers go to {liaison.questions_dir(plugin)}")
    return lines, all(check.ok for check in found)
