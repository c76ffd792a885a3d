"""`liaison install | uninstall | status` in-process (X14): a fake hermes on PATH whose `#!`
names doctor's stand-in Python, and whose `plugins enable | disable` flips what the stand-in's
probe reports. Hermes' own reading of its config is checked in tests/test_liaison_setup.py."""

from __future__ import annotations

import json
import locale
import os
import sys
from pathlib import Path

import pytest

from coms_hermes_bridge import liaison_setup
from coms_hermes_bridge.actors.config import BridgeConfig, parse_config
from coms_hermes_bridge.cli import main
from coms_hermes_bridge.liaison_setup import (
    RESTART,
    _command,
    find_hermes,
    install,
    interpreter,
    probe,
    status,
    uninstall,
)
from coms_hermes_bridge.ops import OpsError
from tests.test_doctor import ENABLED, PROBE_PYTHON, World, program

SOURCE = Path(liaison_setup.__file__).parent / "liaison"
FILES = ("plugin.yaml", "__init__.py", "answers.py", "markers.py")
# hermes as the stand-in Python runs it: records its words, enables or disables the liaison
# in its profile's config.yaml; $FAIL fails it, $NOOP makes `enable` change nothing
HERMES = """#!{python}
echo "$*" >> "${{0%/*}}/hermes.argv"
home=${{HERMES_HOME:-$HOME/.hermes}}
[ "$1" = --profile ] && home=$home/profiles/$2 && shift 2
[ -n "$FAIL" ] && echo "$FAIL" >&2 && exit 3
case "$1 $2" in
  "plugins enable") [ -n "$NOOP" ] || printf '{enabled}' > "$home/config.yaml" ;;
  "plugins disable") : > "$home/config.yaml" ;;
esac
"""
ENABLE = "plugins enable hub-liaison --no-allow-tool-override"
INSTALL = "run `coms-hermes-bridge liaison install`"
HOOKS = "pre_gateway_dispatch, pre_llm_call"


@pytest.fixture
def world(coms_dir: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    """doctor's World with that hermes, run as <venv>/coms-hermes-bridge (the plugin's
    command)."""
    home, bin_dir = coms_dir / "h", coms_dir / "bin"
    home.mkdir()
    env = {"HOME": str(home), "PATH": str(bin_dir), "PI_COMS_DIR": str(coms_dir / "c")}
    world = World(home, bin_dir, env, parse_config([], env))
    python = program(bin_dir / "python", PROBE_PYTHON)
    world.hermes(HERMES.format(python=python, enabled=ENABLED.replace("\n", "\\n")))
    command = program(coms_dir / "venv" / "coms-hermes-bridge", "#!/bin/sh\n")
    monkeypatch.setattr(sys, "argv", [str(command)])
    return world


def plugin_of(world: World, profile: str = "") -> Path:
    root = world.home / ".hermes"
    return (root / "profiles" / profile if profile else root) / "plugins" / "hub-liaison"


def ran(world: World) -> list[str]:
    """What hermes was asked, in order, since the last call."""
    argv = world.bin / "hermes.argv"
    said = argv.read_text().splitlines() if argv.exists() else []
    argv.unlink(missing_ok=True)
    return said


def settings_text(questions: Path, command: str | None) -> str:
    return (f'{{\n  "questions_dir": "{questions}",\n  "command": '
            f'{json.dumps(command)}\n}}\n')


def test_install_then_again_then_upgrade(world: World) -> None:
    # X14: the plugin copied whole with its settings, enabled through hermes once, a second
    # install changes nothing, a changed file is upgraded; no leftovers beside it
    plugin = plugin_of(world)
    questions = world.config.questions_dir
    command = str(Path(sys.argv[0]))
    assert install(world.config, world.env) == [
        f"hub-liaison installed at {plugin} (answers go to {questions})",
        "hub-liaison enabled in Hermes", RESTART]
    assert ran(world) == [ENABLE]
    assert sorted(p.name for p in plugin.iterdir()) == sorted([*FILES, "liaison.json"])
    for name in FILES:
        assert (plugin / name).read_bytes() == (SOURCE / name).read_bytes(), name
    assert (plugin / "liaison.json").read_text() == settings_text(questions, command)
    assert plugin.stat().st_mode & 0o777 == 0o700
    assert (world.home / ".hermes" / "config.yaml").read_text() == ENABLED

    up_to_date = [f"hub-liaison is up to date at {plugin}", "hub-liaison is enabled in Hermes",
                  RESTART]
    assert install(world.config, world.env) == up_to_date
    assert ran(world) == []  # enabled already: hermes not asked to enable it

    source = (SOURCE / "answers.py").stat()
    same_size = b"#" * source.st_size  # and the same mtime: only its bytes tell it apart
    (plugin / "answers.py").write_bytes(same_size)
    os.utime(plugin / "answers.py", ns=(source.st_atime_ns, source.st_mtime_ns))
    upgraded = [f"hub-liaison upgraded at {plugin} (answers go to {questions})",
                "hub-liaison is enabled in Hermes", RESTART]
    assert install(world.config, world.env) == upgraded
    assert (plugin / "answers.py").read_bytes() == (SOURCE / "answers.py").read_bytes()
    assert sorted(p.name for p in plugin.parent.iterdir()) == ["hub-liaison"]
    (plugin / "markers.py").unlink()
    assert install(world.config, world.env) == upgraded
    (plugin / "plugin.yaml").unlink()
    (plugin / "plugin.yaml").mkdir()  # not a file: not ours
    assert install(world.config, world.env) == upgraded
    assert (plugin / "plugin.yaml").read_bytes() == (SOURCE / "plugin.yaml").read_bytes()
    assert install(world.config, world.env) == up_to_date
    assert ran(world) == []


def test_changed_settings_upgrade_the_copy(world: World, coms_dir: Path) -> None:
    # X14: where answers go and the bridge's command are part of the install
    plugin = plugin_of(world)
    install(world.config, world.env)
    elsewhere = coms_dir / "answers"
    config = world.with_("--questions-dir", str(elsewhere))
    assert install(config, world.env)[0] == (
        f"hub-liaison upgraded at {plugin} (answers go to {elsewhere})")
    command = str(Path(sys.argv[0]))
    assert (plugin / "liaison.json").read_text() == settings_text(elsewhere, command)
    assert install(config, world.env)[0] == f"hub-liaison is up to date at {plugin}"
    sys.argv[0] = str(coms_dir / "elsewhere")  # another command: none on PATH
    assert install(config, world.env)[0] == (
        f"hub-liaison upgraded at {plugin} (answers go to {elsewhere})")
    assert (plugin / "liaison.json").read_text() == settings_text(elsewhere, None)
    for broken in ("{not json", None):
        if broken is None:
            (plugin / "liaison.json").unlink()
        else:
            (plugin / "liaison.json").write_text(broken)
        assert install(config, world.env)[0].startswith("hub-liaison upgraded at")
        assert (plugin / "liaison.json").read_text() == settings_text(elsewhere, None)


def test_the_settings_are_read_as_utf8_whatever_the_locale(world: World, coms_dir: Path) -> None:
    # X14: liaison.json is JSON, so UTF-8; one written unescaped still reads in a C locale
    config = world.with_("--questions-dir", str(coms_dir / "réponses"))
    install(config, world.env)
    written = plugin_of(world) / "liaison.json"
    settings = json.loads(written.read_text(encoding="utf-8"))
    written.write_text(json.dumps(settings, indent=2, ensure_ascii=False), encoding="utf-8")
    was = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        said = install(config, world.env)[0]
    finally:
        locale.setlocale(locale.LC_CTYPE, was)
    assert said == f"hub-liaison is up to date at {plugin_of(world)}"


def test_install_clears_a_half_made_copy_and_goes_into_a_profile(world: World) -> None:
    # X14: a copy an interrupted install left is not kept; --hermes-profile's home is used
    ops = world.home / ".hermes" / "profiles" / "ops"
    ops.mkdir(parents=True)
    plugin = plugin_of(world, "ops")
    left = plugin.with_name(f".hub-liaison.{os.getpid()}.new")
    left.mkdir(parents=True)
    (left / "stale.py").write_text("x")
    config = world.with_("--hermes-profile", "ops")
    assert install(config, world.env)[:2] == [
        f"hub-liaison installed at {plugin} (answers go to {config.questions_dir})",
        "hub-liaison enabled in Hermes"]
    assert ran(world) == [f"--profile ops {ENABLE}"]
    assert sorted(p.name for p in plugin.parent.iterdir()) == ["hub-liaison"]
    assert not (plugin / "stale.py").exists()
    assert (ops / "config.yaml").read_text() == ENABLED
    assert not (world.home / ".hermes" / "plugins").exists()


def test_an_installed_copy_not_enabled_is_enabled(world: World) -> None:
    plugin = plugin_of(world)
    install(world.config, world.env)
    (world.home / ".hermes" / "config.yaml").write_text("plugins: {}\n")
    assert install(world.config, world.env) == [
        f"hub-liaison is up to date at {plugin}", "hub-liaison enabled in Hermes", RESTART]
    assert ran(world) == [ENABLE, ENABLE]


def test_an_enable_that_fails_or_changes_nothing_is_an_error(world: World) -> None:
    # X14: hermes' own word, or the probe still saying "not enabled"
    with pytest.raises(OpsError) as failed:
        install(world.config, {**world.env, "FAIL": "no plugin named hub-liaison"})
    assert str(failed.value) == (
        "`hermes plugins enable hub-liaison` failed: no plugin named hub-liaison")
    with pytest.raises(OpsError) as unchanged:
        install(world.config, {**world.env, "NOOP": "1"})
    assert str(unchanged.value) == "`hermes plugins enable hub-liaison` failed: exit 0"
    assert ran(world) == [ENABLE, ENABLE]


def test_a_hermes_without_the_hooks_gets_nothing(world: World) -> None:
    with pytest.raises(OpsError) as lacking:
        install(world.config, {**world.env, "HOOK": "false"})
    assert str(lacking.value) == (
        f"this Hermes ({world.bin / 'hermes'}) lacks the pre_gateway_dispatch and "
        "pre_llm_call hooks for plugins; the liaison needs a newer hermes-agent")
    assert not (world.home / ".hermes").exists()
    assert ran(world) == []


def test_uninstall_disables_then_removes(world: World) -> None:
    # X14: disabled through hermes only when enabled; removed either way
    plugin = plugin_of(world)
    assert uninstall(world.config, world.env) == [f"hub-liaison is not installed at {plugin}"]
    assert ran(world) == []
    install(world.config, world.env)
    ran(world)
    with pytest.raises(OpsError) as failed:
        uninstall(world.config, {**world.env, "FAIL": "config.yaml is read-only"})
    assert str(failed.value) == (
        "`hermes plugins disable hub-liaison` failed: config.yaml is read-only")
    assert plugin.is_dir()
    assert uninstall(world.config, world.env) == [f"hub-liaison removed from {plugin}", RESTART]
    assert ran(world) == ["plugins disable hub-liaison", "plugins disable hub-liaison"]
    assert not plugin.exists()
    assert (world.home / ".hermes" / "config.yaml").read_text() == ""
    plugin.mkdir()  # a copy Hermes does not enable: nothing to disable
    assert uninstall(world.config, world.env) == [f"hub-liaison removed from {plugin}", RESTART]
    assert ran(world) == []
    assert not plugin.exists()


def test_status_says_each_link_and_where_answers_go(world: World, coms_dir: Path) -> None:
    # X14: ok only when installed, current, enabled and the hooks known
    ops = world.home / ".hermes" / "profiles" / "ops"
    ops.mkdir(parents=True)
    plugin = plugin_of(world, "ops")
    config = world.with_("--hermes-profile", "ops")
    install_ops = "run `coms-hermes-bridge liaison install --hermes-profile ops`"
    assert status(config, world.env) == (
        [f"✖ hub-liaison: not installed at {plugin}; {install_ops}"], False)
    elsewhere = coms_dir / "answers"
    install(world.with_("--hermes-profile", "ops", "--questions-dir", str(elsewhere)), world.env)
    held = [f"✔ hub-liaison: installed at {plugin}", "✔ hub-liaison: enabled in Hermes",
            f"✔ {HOOKS}: this Hermes has them", f"  answers go to {elsewhere}"]
    assert status(config, world.env) == (held, True)  # where the install said, not config's
    (ops / "config.yaml").write_text("")
    assert status(config, {**world.env, "HOOK": "false"}) == ([
        held[0], f"✖ hub-liaison: not enabled; {install_ops}",
        f"✖ {HOOKS}: this Hermes lacks one of them; upgrade hermes-agent", held[3]], False)
    (ops / "config.yaml").write_text(ENABLED)
    (plugin / "markers.py").unlink()
    assert status(config, world.env) == (
        [f"✖ hub-liaison: an older copy at {plugin}; {install_ops}", *held[1:]], False)
    assert status(world.config, world.env) == (  # the default profile has none
        [f"✖ hub-liaison: not installed at {plugin_of(world)}; {INSTALL}"], False)


def test_the_liaison_verb_runs_each_action_in_the_profile_given(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # X14 from the command line: each action's lines; status exits 1 until it holds
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    (world.home / ".hermes" / "profiles" / "ops").mkdir(parents=True)
    plugin, profile = plugin_of(world, "ops"), ["--hermes-profile", "ops"]
    assert main(["liaison", "status", *profile]) == 1
    assert capsys.readouterr().out == (
        f"✖ hub-liaison: not installed at {plugin}; run `coms-hermes-bridge liaison install "
        "--hermes-profile ops`\n")
    assert main(["liaison", "install", *profile]) == 0
    assert capsys.readouterr().out == (
        f"hub-liaison installed at {plugin} (answers go to {world.config.questions_dir})\n"
        f"hub-liaison enabled in Hermes\n{RESTART}\n")
    assert main(["liaison", "status", *profile]) == 0
    assert capsys.readouterr().out == (
        f"✔ hub-liaison: installed at {plugin}\n✔ hub-liaison: enabled in Hermes\n"
        f"✔ {HOOKS}: this Hermes has them\n  answers go to {world.config.questions_dir}\n")
    assert main(["liaison", "uninstall", *profile]) == 0
    assert capsys.readouterr().out == f"hub-liaison removed from {plugin}\n{RESTART}\n"


def test_hermes_must_be_found_and_its_python_told(world: World) -> None:
    # X14: each verb refuses, in one line, a hermes it cannot work with
    def refused(config: BridgeConfig = world.config) -> str:
        with pytest.raises(OpsError) as refusal:
            find_hermes(config, world.env)
        for verb in (install, uninstall, status):
            with pytest.raises(OpsError) as again:
                verb(config, world.env)
            assert str(again.value) == str(refusal.value)
        return str(refusal.value)

    assert find_hermes(world.config, world.env) == liaison_setup.Hermes(
        str(world.bin / "hermes"), str(world.bin / "python"), world.home / ".hermes")
    assert refused(world.with_("--hermes-profile", "nope")) == (
        f"no Hermes profile 'nope' at {world.home / '.hermes' / 'profiles' / 'nope'}")
    python3 = program(world.bin / "python3", "#!/bin/sh\n")
    world.hermes("#!/usr/bin/env python3\n")  # found on the PATH the verb was given
    assert find_hermes(world.config, world.env).python == str(python3)
    hermes = world.hermes("#!/bin/sh\nexec '/opt/hermes/bin/python3' \"$0\" \"$@\"\n")
    assert refused() == f"cannot tell which Python runs {hermes}"  # a wrapper of one's own
    hermes.unlink()
    assert refused() == ("'hermes' is not on PATH; the liaison is a plugin of the Hermes "
                         "gateway: install hermes-agent first")


@pytest.mark.parametrize(("output", "said"), [
    ("", "exit 0"),  # IndexError
    ("Traceback (most recent call last):\\nModuleNotFoundError: hermes_cli",
     "ModuleNotFoundError: hermes_cli"),
    ('{"hook": true}', '{"hook": true}'),  # KeyError
    ("[1]", "[1]"),  # TypeError
])
def test_a_probe_answer_that_cannot_be_read_is_said(world: World, output: str, said: str) -> None:
    python = program(world.bin / "python", f"#!/bin/sh\nprintf '{output}'\n")
    with pytest.raises(OpsError) as unread:
        install(world.config, world.env)
    assert str(unread.value) == f"cannot ask {python} about Hermes' plugins: {said}"


def test_the_probes_last_line_is_its_answer(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    hermes = find_hermes(world.config, world.env)
    program(world.bin / "python",
            "#!/bin/sh\necho 'a warning'\necho '{\"hook\": 1, \"enabled\": 0}'\necho\n")
    assert probe(hermes, world.env) == {"hook": True, "enabled": False}
    program(world.bin / "python", "#!/bin/sh\nexec /bin/sleep 5\n")
    monkeypatch.setattr(liaison_setup, "RUN_TIMEOUT_S", 0.2)
    with pytest.raises(OpsError) as slow:
        probe(hermes, world.env)
    assert str(slow.value) == f"{world.bin / 'python'}: did not finish in 0.2s"
    gone = liaison_setup.Hermes(hermes.program, "/nonexistent/python3", hermes.home)
    with pytest.raises(OpsError) as missing:
        probe(gone, world.env)
    assert str(missing.value) == (
        "/nonexistent/python3: [Errno 2] No such file or directory: '/nonexistent/python3'")


def test_the_command_recorded_is_this_coms_hermes_bridge(
    world: World, coms_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # X14: the plugin's slash command runs the bridge that installed it, by its real path
    real = program(coms_dir / "real" / "coms-hermes-bridge", "#!/bin/sh\n")
    link = coms_dir / "link" / "coms-hermes-bridge"
    link.parent.mkdir()
    link.symlink_to(real)
    monkeypatch.setattr(sys, "argv", [str(link)])
    assert _command() == str(real)
    on_path = coms_dir / "path"
    on_path.mkdir()
    (on_path / "coms-hermes-bridge").symlink_to(real)
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setattr(sys, "argv", [str(coms_dir / "pytest")])  # not the bridge: PATH's
    assert _command() == str(real)
    monkeypatch.setattr(sys, "argv", [str(coms_dir / "coms-hermes-bridge")])  # not a file
    assert _command() == str(real)
    monkeypatch.setenv("PATH", str(coms_dir / "nowhere"))
    assert _command() is None


@pytest.mark.parametrize(("first_line", "python"), [
    ("#!/usr/bin/env -S python3", "{bin}/python3"),
    ("#!/usr/bin/env python3 -u", "{bin}/python3"),
    ("#!/usr/bin/env", None),
    ("#!/usr/bin/env -S", None),
    ("#! /opt/hermes/bin/python3.11 -I", "/opt/hermes/bin/python3.11"),
    ("#!/bin/bash", None),
    ("#!", None),
    ("import hermes_cli", None),
])
def test_the_python_named_by_the_first_line(
    world: World, first_line: str, python: str | None,
) -> None:
    program(world.bin / "python3", "#!/bin/sh\n")
    hermes = world.hermes(f"{first_line}\nrest\n")
    want = python.format(bin=world.bin) if python else None
    assert interpreter(hermes, world.env) == want
    hermes.chmod(0)  # unreadable: no Python to tell
    if os.geteuid() != 0:
        assert interpreter(hermes, world.env) is None
    assert interpreter(world.bin / "missing", world.env) is None


PIP = "'''exec' "  # how pip's launcher starts its second line


@pytest.mark.parametrize(("second_line", "python"), [
    (PIP + '/opt/a-long-path/bin/python "$0" "$@"', "/opt/a-long-path/bin/python"),
    (PIP + '"/opt/with space/python" -I "$0" "$@"', "/opt/with space/python"),
    (PIP + '/opt/py "$@"', None),  # not pip's: the script is not what it runs
    (PIP + '"$0" "$@"', None),
    (PIP + '"/opt/unclosed "$0" "$@"', None),
    ('exec /opt/py "$0" "$@"', None),
])
def test_the_python_named_by_pips_launcher_for_a_long_or_spaced_path(
    world: World, second_line: str, python: str | None,
) -> None:
    # X14: pip writes `#!/bin/sh` and names the Python on the next line when its path is
    # too long for `#!` (127 bytes) or has a space
    hermes = world.hermes(f"#!/bin/sh\n{second_line}\n' '''\nimport hermes_cli\n")
    assert interpreter(hermes, world.env) == python
    hermes.write_text(f"#!/bin/bash\n{second_line}\n")  # only /bin/sh is pip's
    assert interpreter(hermes, world.env) is None


def test_the_first_line_is_read_up_to_512_bytes_utf8_or_not(world: World) -> None:
    hermes = world.hermes("#!/opt/" + "p" * 600 + "\n")
    assert interpreter(hermes, world.env) == "/opt/" + "p" * 505
    hermes.write_bytes(b"#!/opt/py\xff/python3\n")
    assert interpreter(hermes, world.env) == "/opt/py\ufffd/python3"


def test_pips_second_line_is_read_bounded_and_as_utf8_or_not(world: World) -> None:
    # X14: read like the first line: a path not UTF-8 is replaced, not a crash, and a line
    # past PATH_MAX (4096 bytes) is no launcher's
    hermes = world.hermes("")
    hermes.write_bytes(b"#!/bin/sh\n" + PIP.encode() + b'/opt/py\xff/python "$0" "$@"\n')
    assert interpreter(hermes, world.env) == "/opt/py\ufffd/python"
    long = "/opt/" + "p" * 4096
    hermes.write_text(f'#!/bin/sh\n{PIP}{long} "$0" "$@"\n')
    assert interpreter(hermes, world.env) is None
    fits = "/opt/" + "p" * (4096 - len(PIP) - len(' "$0" "$@"\n') - 5)
    hermes.write_text(f'#!/bin/sh\n{PIP}{fits} "$0" "$@"\n')
    assert interpreter(hermes, world.env) == fits
