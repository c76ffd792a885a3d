"""`coms-hermes-bridge liaison install | uninstall | status`: puts the liaison plugin (X14)
where the Hermes gateway loads it, and says whether it is there.

Hermes loads user plugins from `<hermes home>/plugins/<name>/`, and only those its
config enables, so installing is a copy, a small config file the plugin reads at each
answer (where the answers go), and `hermes plugins enable`. The running gateway loads
plugins at its start only: every verb that changes something ends by saying so.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import liaison
from .actors.config import BridgeConfig
from .doctor import Check, hermes_home, interpreter, run_program, said
from .ops import OpsError

NAME = liaison.NAME
PLUGIN_FILES = ("plugin.yaml", "__init__.py", "answers.py", "markers.py")
RUN_TIMEOUT_S = 60.0  # hermes starts in about 2 s; a loaded machine may need far more
RESTART = ("a running Hermes gateway loads plugins only when it starts: restart it "
           "(`hermes gateway restart`, or its service) for the liaison to take effect")
HOOKS = (liaison.HOOK, liaison.TURN_HOOK)  # an idle chat's answers, and a busy chat's
# Run by Hermes' own Python: does this Hermes know the hooks, and is the plugin enabled?
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
    profile: str | None

    def argv(self, *words: str) -> list[str]:
        profile = ["--profile", self.profile] if self.profile else []
        return [self.program, *profile, *words]

    @property
    def plugin_dir(self) -> Path:
        return self.home / "plugins" / NAME


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
    return Hermes(program, python, home, config.hermes_profile)


def _run(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return run_program(argv, env, RUN_TIMEOUT_S)
    except OSError as exc:
        raise OpsError(f"{argv[0]}: {exc}") from exc


def probe(hermes: Hermes, env: Mapping[str, str]) -> dict[str, bool]:
    """What this Hermes says of the hook and of our plugin, read with Hermes' own code
    (its config's format is Hermes' business, not ours)."""
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
    """The absolute path of this coms-hermes-bridge, for the plugin to run (its slash
    command); None when it was not started as that command."""
    ran = Path(sys.argv[0])
    if ran.name == "coms-hermes-bridge" and ran.is_file():
        return str(ran.resolve())
    found = shutil.which("coms-hermes-bridge")
    return str(Path(found).resolve()) if found else None


def _settings(config: BridgeConfig) -> dict[str, str | None]:
    return {"questions_dir": str(config.questions_dir), "command": _command()}


def _copy(target: Path, settings: dict[str, str | None]) -> None:
    """The plugin folder whole or not at all: built beside the target, then swapped in,
    so a gateway starting meanwhile loads the old copy or the new, never half of one."""
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
        done = _run(hermes.argv("plugins", "enable", NAME, "--no-allow-tool-override"), env)
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
        done = _run(hermes.argv("plugins", "disable", NAME), env)
        if done.returncode != 0:
            raise OpsError(f"`hermes plugins disable {NAME}` failed: {said(done)}")
    shutil.rmtree(target)
    return [f"{NAME} removed from {target}", RESTART]


def status(config: BridgeConfig, env: Mapping[str, str]) -> tuple[list[str], bool]:
    """One line each: installed (and current), enabled, where answers go. True when the
    liaison will answer once the gateway has (re)started."""
    hermes = find_hermes(config, env)
    target = hermes.plugin_dir
    found = probe(hermes, env)
    if not target.is_dir():
        return [Check(NAME, False, f"not installed at {target}; run `coms-hermes-bridge "
                      "liaison install`").line()], False
    current = _current(target)
    install = "run `coms-hermes-bridge liaison install`"
    has = "has them" if found["hook"] else "lacks one of them; upgrade hermes-agent"
    lines = [check.line() for check in (
        Check(NAME, current, f"installed at {target}" if current else
              f"an older copy at {target}; {install}"),
        Check(NAME, found["enabled"], "enabled in Hermes" if found["enabled"] else
              f"not enabled; {install}"),
        Check(", ".join(HOOKS), found["hook"], f"this Hermes {has}"),
    )]
    lines.append(f"  answers go to {liaison.questions_dir(target)}")
    return lines, current and found["enabled"] and found["hook"]
