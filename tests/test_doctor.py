"""`coms-hermes-bridge doctor` end to end: the real daemon, a fake hermes."""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from coms_hermes_bridge import doctor as doctor_module
from coms_hermes_bridge.actors.config import BridgeConfig, parse_config
from coms_hermes_bridge.doctor import (
    TEST_TEXT,
    UNIT,
    Check,
    check_bridge,
    check_files,
    check_hermes,
    check_liaison,
    check_send,
    check_service,
    check_target,
    hermes_home,
    run_checks,
)
from coms_hermes_bridge.liaison_setup import _copy, interpreter
from tests.bridge_process import Bridge
from tests.fakes import Asker, register_bridge, state_file
from tests.hermes_fake import FakeHermes


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def doctor(bridge: Bridge, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # No user manager to ask (an empty runtime dir): the service line is "–" on any host.
    runtime = bridge.base / "run"
    runtime.mkdir(exist_ok=True)
    return bridge.verb("doctor", *args, XDG_RUNTIME_DIR=str(runtime), **env)


def skill(bridge: Bridge, home: Path | None = None) -> Path:
    path = (home or bridge.home / ".hermes") / "skills" / "hub-liaison" / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text("---\nname: hub-liaison\n---\n")
    return path


def marks(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {line.split(":", 1)[0][2:]: line[0] for line in done.stdout.splitlines()}


def test_all_links_hold(bridge: Bridge) -> None:  # the skill in place, bridge up
    bridge.start("--project", "demo")
    where = skill(bridge)
    bridge.hermes.configure(chats={"telegram": [
        {"id": "-1001234567890:7", "name": "Ops / topic 7", "type": "group", "thread_id": "7"}]})
    done = doctor(bridge, "--project", "demo", "--to", "telegram:-1001234567890:7")
    assert done.returncode == 0, done.stdout + done.stderr
    assert marks(done) == {
        "hermes": "✔", "--to": "✔", "hub-liaison": "✔",
        "hub-liaison plugin": "–", "questions directory": "✔", "state": "✔",
        "bridge demo": "✔", "service": "–"}
    lines = done.stdout.splitlines()
    assert f"✔ hub-liaison: skill at {where}" in lines
    assert f"✔ questions directory: {bridge.questions} (ours, 0700)" in lines
    assert any(line.startswith(f"✔ bridge demo: user-remote (pid {bridge.entry['pid']}) answers")
               for line in lines)
    assert ("✔ --to: telegram:-1001234567890:7: hermes knows this chat: Ops / topic 7 "
            "(-1001234567890:7)") in lines
    assert bridge.hermes.argvs() == [  # nothing was sent
        ["--version"], ["send", "--list", "telegram", "--json"]]


def test_no_skill_names_it_and_where_it_belongs(bridge: Bridge) -> None:
    bridge.start()
    done = doctor(bridge)
    assert done.returncode == 1
    plugin = bridge.home / ".hermes" / "plugins" / "hub-liaison"
    assert (f"✖ hub-liaison: not installed at {plugin}; run `coms-hermes-bridge liaison "
            "install`") in done.stdout.splitlines()


def test_the_skill_is_looked_for_in_the_profile_or_hermes_home(bridge: Bridge) -> None:
    # `--hermes-profile X` -> ~/.hermes/profiles/X; else $HERMES_HOME
    bridge.start()
    profile = bridge.home / ".hermes" / "profiles" / "ops"
    skill(bridge, profile)
    assert marks(doctor(bridge, "--hermes-profile", "ops"))["hub-liaison"] == "✔"
    assert marks(doctor(bridge))["hub-liaison"] == "✖"
    assert marks(doctor(bridge, HERMES_HOME=str(profile)))["hub-liaison"] == "✔"
    done = doctor(bridge, "--hermes-profile", "nope")
    assert "✖ hermes profile: no profile 'nope' at" in done.stdout


def test_no_hermes_on_path(bridge: Bridge) -> None:
    bridge.start()
    skill(bridge)
    done = doctor(bridge, PATH=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not Path(p, "hermes").exists()))
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == (
        "✖ hermes: 'hermes' is not on PATH; install hermes-agent (pip install hermes-agent) "
        "or put hermes on the daemon's PATH")


def test_a_stopped_bridge_fails_the_check(bridge: Bridge) -> None:
    bridge.start()
    skill(bridge)
    assert doctor(bridge).returncode == 0
    assert bridge.signal() == 0
    done = doctor(bridge)
    assert done.returncode == 1
    assert ("✖ bridge default: no live bridge registered for project default; start it "
            "(`coms-hermes-bridge --project default --to …`, or its service)") in done.stdout.splitlines()


def test_bad_links_are_each_named(bridge: Bridge) -> None:
    bridge.start()
    skill(bridge)
    bridge.questions.chmod(0o755)
    done = doctor(bridge, "--to", "telegram:chat:x")
    assert done.returncode == 1
    got = marks(done)
    assert (got["--to"], got["questions directory"]) == ("✖", "✖")
    assert (f"✖ questions directory: {bridge.questions} is mode 0755; `chmod 700 "
            f"{bridge.questions}` (the bridge tightens it at start)") in done.stdout.splitlines()


def test_the_target_is_judged_in_its_line_as_the_daemon_judges_it(bridge: Bridge) -> None:
    bridge.start()
    skill(bridge)
    done = doctor(bridge, "--to", "telegram:")
    assert (done.returncode, done.stderr) == (1, "")  # a ✖ among the others, no usage error
    assert ("✖ --to: --to 'telegram:' has nothing after the colon: give the chat, or telegram "
            "alone for hermes' home channel") in done.stdout.splitlines()
    assert len(done.stdout.splitlines()) == 8
    bridge.hermes.configure(chats={"telegram": [], "whatsapp": []})
    done = doctor(bridge, "--to", "whatsapp:+15551234567")
    assert done.returncode == 0, done.stdout  # a warning fails nothing
    assert ("⚠ --to: whatsapp:+15551234567: hermes sends to it as given, but has not seen this "
            "chat yet; --to whatsapp:+15551234567: answers come back only from Telegram (the "
            "liaison listens there alone); answer other questions with `coms-hermes-bridge "
            "answer`") in done.stdout.splitlines()


def test_send_test_sends_one_message(bridge: Bridge) -> None:
    bridge.start()
    skill(bridge)
    done = doctor(bridge, "--send-test", "--to", "telegram:42")
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[-1] == "✔ test message: sent to telegram:42; look for it in Telegram"
    assert bridge.hermes.argvs()[-1] == [
        "send", "--to", "telegram:42", "coms-hermes-bridge doctor: a test message; nothing to answer."]
    bridge.hermes.configure(exit=2, stderr="chat not found\n")
    done = doctor(bridge, "--send-test")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == "✖ test message: hermes send failed (2): chat not found"


def test_hermes_home_is_read_as_hermes_reads_it(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    assert hermes_home(home, None) == tmp_path / ".hermes"
    assert hermes_home(home, "ops") == tmp_path / ".hermes" / "profiles" / "ops"
    assert hermes_home(home, "default") == tmp_path / ".hermes"  # hermes's name for no profile
    elsewhere = {**home, "HERMES_HOME": "/srv/hermes"}
    assert hermes_home(elsewhere, None) == Path("/srv/hermes")
    assert hermes_home(elsewhere, "ops") == Path("/srv/hermes/profiles/ops")
    a_profile = {**home, "HERMES_HOME": "/srv/hermes/profiles/dev"}
    assert hermes_home(a_profile, None) == Path("/srv/hermes/profiles/dev")
    assert hermes_home(a_profile, "ops") == Path("/srv/hermes/profiles/ops")


def test_with_home_unset_the_service_unit_is_looked_for_in_the_users_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # as the daemon finds its files then: the password database's home, not ./~
    home = tmp_path / "home"
    unit = home / ".config" / "systemd" / "user" / UNIT
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\n")
    real = pwd.getpwuid(os.getuid())
    entry = pwd.struct_passwd((*real[:5], str(home), real[6]))  # pw_dir is the sixth
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: entry)
    monkeypatch.delenv("HOME")
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"
    program(bin_dir / "systemctl", "#!/bin/sh\necho inactive\nexit 3\n")
    env = {"PATH": str(bin_dir)}
    config = parse_config(["--project", "demo"], env)
    assert config.questions_dir == home / ".pi" / "coms" / "hermes-bridge" / "questions"
    unit_name = "coms-hermes-bridge@demo.service"
    assert check_service(config, env).line() == (
        f"✖ service: {unit_name} is inactive; `systemctl --user enable --now {unit_name}`, "
        f"then `journalctl --user -u {unit_name}`")
    assert hermes_home(env, None) == home / ".hermes"


# -- each check on its own: every line it can print, word for word -----------------------


def program(path: Path, text: str) -> Path:
    """An executable file at `path` (its directory made), for a check to find and run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def lines(checks: Iterable[Check]) -> list[str]:
    return [check.line() for check in checks]


@dataclass
class World:
    """A HOME, a PATH of one directory and the settings a bare `doctor` parses there."""

    home: Path
    bin: Path
    env: dict[str, str]
    config: BridgeConfig

    def with_(self, *flags: str, **env: str) -> BridgeConfig:
        return parse_config(list(flags), {**self.env, **env})

    def hermes(self, text: str) -> Path:
        return program(self.bin / "hermes", text)


@pytest.fixture
def world(coms_dir: Path) -> World:  # short: a bridge's socket goes in it
    home, bin_dir = coms_dir / "h", coms_dir / "bin"
    home.mkdir()
    bin_dir.mkdir()
    env = {"HOME": str(home), "PATH": str(bin_dir), "PI_COMS_DIR": str(coms_dir / "c")}
    return World(home, bin_dir, env, parse_config(["--project", "demo"], env))


FAKE_HERMES = '#!/bin/sh\necho "hermes 0.9"\n'  # prints its version, whatever it is asked


def test_a_checks_line_is_its_mark_name_and_detail() -> None:
    assert Check("x", True, "held").line() == "✔ x: held"
    assert Check("x", False, "broken").line() == "✖ x: broken"
    assert Check("x", None, "not here").line() == "– x: not here"


def test_the_hermes_check_reads_its_first_version_line(world: World) -> None:
    hermes = world.hermes("#!/bin/sh\necho \"hermes $WHICH\"\necho second line\n")
    assert lines(check_hermes(world.config, {**world.env, "WHICH": "1.2"})) == [
        f"✔ hermes: {hermes} (hermes 1.2)"]  # the check's environment reaches the program
    world.hermes(f"#!/bin/sh\necho {'v' * 150}\n")
    assert next(check_hermes(world.config, world.env)).detail == f"{hermes} ({'v' * 100})"
    world.hermes("#!/bin/sh\nprintf '\\377ver'\n")  # not UTF-8: read, not a crash
    assert next(check_hermes(world.config, world.env)).detail == f"{hermes} (\ufffdver)"
    world.hermes("#!/bin/sh\nexit 0\n")
    assert next(check_hermes(world.config, world.env)).detail == f"{hermes} (no version printed)"


def test_a_checked_program_reads_nothing_from_the_terminal(world: World) -> None:
    hermes = world.hermes("#!/bin/sh\nread typed\necho \"hermes$typed\"\n")
    read_end, write_end = os.pipe()
    os.write(write_end, b" typed by the operator\n")
    os.close(write_end)
    saved = os.dup(0)
    os.dup2(read_end, 0)  # what a terminal would have for it
    try:
        assert next(check_hermes(world.config, world.env)).detail == f"{hermes} (hermes)"
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)


def test_a_hermes_that_fails_says_what_it_said_last(world: World) -> None:
    def said(text: str) -> list[str]:
        world.hermes(text)
        return lines(check_hermes(world.config, world.env))  # one line: nothing after it

    hermes = world.bin / "hermes"
    failed = f"✖ hermes: {hermes} --version failed:"
    assert said("#!/bin/sh\necho out\nprintf 'one\\ntwo\\n' >&2\nexit 3\n") == [f"{failed} two"]
    assert said("#!/bin/sh\nprintf 'a\\nb\\n'\necho '  ' >&2\nexit 4\n") == [f"{failed} b"]
    assert said("#!/bin/sh\nexit 5\n") == [f"{failed} exit 5"]
    assert said(f"#!/bin/sh\necho {'e' * 400} >&2\nexit 1\n") == [f"{failed} {'e' * 300}"]
    assert said("#!/nonexistent/interpreter\n") == [
        f"✖ hermes: {hermes} --version: [Errno 2] No such file or directory: '{hermes}'"]


def test_a_hermes_that_hangs_is_given_up_on(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor_module, "CHECK_TIMEOUT_S", 0.2)
    hermes = world.hermes("#!/bin/sh\nexec /bin/sleep 30\n")
    assert lines(check_hermes(world.config, world.env)) == [
        f"✖ hermes: {hermes} --version: did not finish in 0.2s"]


def test_no_hermes_stops_the_hermes_checks(world: World) -> None:
    assert lines(check_hermes(world.with_("--hermes-profile", "ops"), world.env)) == [
        "✖ hermes: 'hermes' is not on PATH; install hermes-agent (pip install hermes-agent) "
        "or put hermes on the daemon's PATH"]
    program(world.bin / "hermes-dev", "#!/bin/sh\necho 1\n")
    config = dataclasses.replace(world.config, hermes="hermes-dev")  # the program the daemon runs
    assert next(check_hermes(config, world.env)).ok is True


def test_the_hermes_profile_must_exist(world: World) -> None:
    world.hermes(FAKE_HERMES)
    profiles = world.home / ".hermes" / "profiles"
    (profiles / "ops").mkdir(parents=True)
    assert lines(check_hermes(world.with_("--hermes-profile", "ops"), world.env))[1] == (
        f"✔ hermes profile: ops at {profiles / 'ops'}")
    assert lines(check_hermes(world.with_("--hermes-profile", "nope"), world.env))[1] == (
        f"✖ hermes profile: no profile 'nope' at {profiles / 'nope'}; create it with "
        "`hermes profile create nope` or drop --hermes-profile")
    assert [check.name for check in check_hermes(world.config, world.env)] == [
        "hermes"]  # no profile named: nothing to check


@pytest.mark.parametrize("first_line", [
    "#!{python}", "#! {python} -u", "#!/usr/bin/env {name}", "#!/usr/bin/env -S {name} -u"])
def test_the_python_is_read_from_hermess_first_line(world: World, first_line: str) -> None:
    python = program(world.bin / "py", FAKE_HERMES)  # found on the daemon's PATH for `env`
    hermes = world.hermes(first_line.format(python=python, name="py") + "\n")
    assert interpreter(hermes, world.env) == str(python)


@pytest.mark.parametrize("first_line", [
    "#!/bin/sh", "#!/usr/bin/bash -e", "#!/usr/bin/env", "#!/usr/bin/env no-such-python",
    "echo no first line"])
def test_a_python_that_cannot_be_told_is_none(world: World, first_line: str) -> None:
    hermes = program(world.bin / "hermes", first_line + "\n")
    assert interpreter(hermes, world.env) is None
    assert interpreter(world.bin, world.env) is None  # not a file it can read


def test_the_first_line_is_read_bounded_and_as_utf8_or_not(world: World) -> None:
    missing = "/nonexistent/" + "p" * 600  # the first line is read up to 512 bytes
    hermes = program(world.bin / "hermes", f"#!{missing}\n")
    assert interpreter(hermes, world.env) == missing[:510]
    hermes.write_bytes(b"#!/opt/py\xff/python3\n")  # not UTF-8: read, not a crash
    assert interpreter(hermes, world.env) == "/opt/py\ufffd/python3"


CHATS = [{"id": "42", "name": "Alice", "type": "dm", "thread_id": None},
         {"id": "-100123:7", "name": "#Ops", "type": "group", "thread_id": "7"},
         {"id": "-100124", "name": "Ops later", "type": "group", "thread_id": None}]


@pytest.mark.parametrize(("target", "held"), [
    ("telegram", "hermes has telegram and sends to its home channel"),
    ("telegram:42", "hermes knows this chat: Alice (42)"),
    ("telegram:-100123:7", "hermes knows this chat: #Ops (-100123:7)"),
    ("telegram:alice", "hermes knows this chat: Alice (42)"),  # by name, as hermes resolves
    ("telegram:ops", "hermes knows this chat: #Ops (-100123:7)"),
    ("telegram:Ops (group)", "hermes knows this chat: #Ops (-100123:7)"),
    ("telegram:ops l", "hermes knows this chat: Ops later (-100124)"),  # the one it starts
])
def test_a_target_hermes_can_resolve_holds(world: World, target: str, held: str) -> None:
    hermes = FakeHermes(world.bin, chats={"telegram": CHATS, "slack": []})
    config = dataclasses.replace(world.config, target=target)
    assert check_target(config, world.env).line() == f"✔ --to: {target}: {held}"
    assert hermes.argvs() == [["send", "--list", "telegram", "--json"]]  # nothing sent


@pytest.mark.parametrize(("target", "why"), [
    ("Telegram: ", "--to 'Telegram: ' has nothing after the colon: give the chat, or telegram "
     "alone for hermes' home channel"),
    (":42", "--to ':42' names no platform: give telegram, telegram:<chat_id> or "
     "telegram:<chat name>"),
])
def test_a_target_the_daemon_refuses_is_broken(world: World, target: str, why: str) -> None:
    hermes = FakeHermes(world.bin)
    config = dataclasses.replace(world.config, target=target)
    assert check_target(config, world.env).line() == f"✖ --to: {why}"
    assert hermes.argvs() == []  # judged before hermes is asked


@pytest.mark.parametrize("target", ["telegram:@abcd", "telegram:-100999", "telegram:5:6"])
def test_a_chat_id_hermes_has_not_seen_is_warned_of(world: World, target: str) -> None:
    FakeHermes(world.bin, chats={"telegram": CHATS})
    config = dataclasses.replace(world.config, target=target, hermes_profile="ops")
    assert check_target(config, world.env).line() == (
        f"⚠ --to: {target}: hermes sends to it as given, but has not seen this chat yet; the "
        "human must have written to the bot there first")


def test_a_chat_name_hermes_cannot_resolve_is_broken(world: World) -> None:
    hermes = FakeHermes(world.bin, chats={"telegram": CHATS})
    config = dataclasses.replace(world.config, target="telegram:ops x", hermes_profile="ops")
    assert check_target(config, world.env).line() == (
        "✖ --to: telegram:ops x: hermes has no telegram chat named 'ops x' (its chats: Alice, "
        "#Ops, Ops later); give the chat id, or write to the bot from that chat while the "
        "gateway runs")
    assert hermes.argvs() == [["--profile", "ops", "send", "--list", "telegram", "--json"]]
    hermes.configure(chats={"telegram": []})
    assert check_target(dataclasses.replace(config, target="telegram:ops"), world.env).line() == (
        "✖ --to: telegram:ops: hermes has no telegram chat named 'ops' (its chats: none yet); "
        "give the chat id, or write to the bot from that chat while the gateway runs")


def test_a_chat_named_from_a_longer_list_names_its_first_ten(world: World) -> None:
    chats = [{"id": str(n), "name": f"c{n}", "type": "dm"} for n in range(11)]
    FakeHermes(world.bin, chats={"telegram": chats})
    config = dataclasses.replace(world.config, target="telegram:nobody")
    assert check_target(config, world.env).line() == (  # bounded: ten names at most
        "✖ --to: telegram:nobody: hermes has no telegram chat named 'nobody' (its chats: c0, c1, "
        "c2, c3, c4, c5, c6, c7, c8, c9); give the chat id, or write to the bot from that chat "
        "while the gateway runs")


def test_a_name_is_matched_whole_not_only_past_its_hash(world: World) -> None:
    # `#` is the one leading mark dropped: a name's own first letters stay
    FakeHermes(world.bin, chats={"telegram": [{"id": "-100125", "name": "Xmas crew"}]})
    config = dataclasses.replace(world.config, target="telegram:xmas crew")
    assert check_target(config, world.env).line() == (
        "✔ --to: telegram:xmas crew: hermes knows this chat: Xmas crew (-100125)")


def test_a_name_in_any_case_is_matched_as_unicode_lowers_it(world: World) -> None:
    # the Ohm sign's small letter is omega, though omega's capital is not the Ohm sign
    FakeHermes(world.bin, chats={"telegram": [{"id": "-100126", "name": "\u2126 lab"}]})
    config = dataclasses.replace(world.config, target="telegram:\u03c9 LAB")
    assert check_target(config, world.env).line() == (
        "✔ --to: telegram:\u03c9 LAB: hermes knows this chat: \u2126 lab (-100126)")


def test_a_bare_platform_reads_no_chat_from_the_list(world: World) -> None:
    # telegram alone goes to hermes' home channel: the chats listed are not looked into
    world.hermes("#!/bin/sh\necho '{\"platforms\": {\"telegram\": [\"home\"]}}'\n")
    assert check_target(world.config, world.env).line() == (
        "✔ --to: telegram: hermes has telegram and sends to its home channel")


def test_a_list_that_fails_is_said_by_its_first_line(world: World) -> None:
    # hermes names the trouble first; what follows is its detail
    world.hermes("#!/bin/sh\necho 'hermes send: telegram is not set up' >&2\n"
                 "echo '  (see hermes gateway setup)' >&2\nexit 1\n")
    assert check_target(world.config, world.env).line() == (
        "✖ --to: telegram: hermes send: telegram is not set up; set telegram up in hermes "
        "(`hermes gateway setup`) and start its gateway once")


def test_a_platform_hermes_does_not_have_is_broken_in_its_words(world: World) -> None:
    FakeHermes(world.bin, chats={})  # a hermes with no Telegram
    assert check_target(world.config, world.env).line() == (
        "✖ --to: telegram: hermes send: no targets found for platform 'telegram'. Configured: "
        "(none); set telegram up in hermes (`hermes gateway setup`) and start its gateway once")


def test_another_platform_is_a_warning_not_a_broken_link(world: World) -> None:
    FakeHermes(world.bin, chats={"whatsapp": [{"id": "+15551234567", "name": "Bob"}]})
    config = dataclasses.replace(world.config, target="whatsapp:+15551234567")
    check = check_target(config, world.env)
    assert (check.ok, check.line()) == (True, (
        "⚠ --to: whatsapp:+15551234567: hermes knows this chat: Bob (+15551234567); --to "
        "whatsapp:+15551234567: answers come back only from Telegram (the liaison listens "
        "there alone); answer other questions with `coms-hermes-bridge answer`"))


def test_a_hermes_that_cannot_list_leaves_the_target_unchecked(world: World) -> None:
    assert check_target(world.config, world.env).line() == (  # no hermes at all
        "– --to: telegram: cannot ask hermes for its chats: [Errno 2] No such file or "
        "directory: 'hermes'")
    world.hermes(FAKE_HERMES)
    assert check_target(world.config, world.env).line() == (
        "– --to: telegram: cannot read hermes' chats: JSONDecodeError('Expecting value: line "
        "1 column 1 (char 0)')")


# A stand-in for the Python that runs hermes, asked by `liaison_setup.probe`: the
# liaison is enabled when the profile's config.yaml lists it (the real reading of
# config.yaml is Hermes' own, checked in tests/test_liaison_setup.py); $HOOK=false is a
# Hermes without the hooks. Anything but the probe is hermes itself: a shell script whose
# `#!` names this Python (tests/test_liaison_commands.py).
PROBE_PYTHON = """#!/bin/sh
case "$1 $2" in
  "-c "*"name = 'hub-liaison'"*"in ('pre_gateway_dispatch', 'pre_llm_call')"*) ;;
  *) exec /bin/sh "$@" ;;
esac
enabled=false  # shell builtins only: PATH holds no grep
[ -f "$HERMES_HOME/config.yaml" ] && while IFS= read -r line; do
  [ "$line" = "    - hub-liaison" ] && enabled=true
done < "$HERMES_HOME/config.yaml"
echo '{"hook": '"${HOOK:-true}"', "enabled": '"$enabled"'}'
"""
ENABLED = "plugins:\n  enabled:\n    - hub-liaison\n"
HOOKS = "✔ pre_gateway_dispatch, pre_llm_call: this Hermes has them"


def probed_hermes(world: World) -> Path:
    """A hermes whose Python answers the probe; the plugin folder it would have."""
    world.hermes(f"#!{program(world.bin / 'python', PROBE_PYTHON)}\n")
    return world.home / ".hermes" / "plugins" / "hub-liaison"


def installed(world: World, *, enabled: bool = True) -> Path:
    """This package's plugin where `liaison install` puts it, and config.yaml listing it
    when `enabled`."""
    plugin = probed_hermes(world)
    _copy(plugin, {"questions_dir": str(world.config.questions_dir), "command": None})
    if enabled:
        (world.home / ".hermes" / "config.yaml").write_text(ENABLED, encoding="utf-8")
    return plugin


def test_the_skill_is_found_at_the_top_or_in_one_category(world: World) -> None:
    skills = world.home / ".hermes" / "skills"
    plugin = probed_hermes(world)
    missing = f"✖ hub-liaison: not installed at {plugin}; run `coms-hermes-bridge liaison install`"
    assert lines(check_liaison(world.config, world.env)) == [missing]
    (skills / "hub-liaison" / "SKILL.md").mkdir(parents=True)  # not a file
    (skills / "a" / "b" / "hub-liaison" / "SKILL.md").mkdir(parents=True)  # two levels down
    (skills / "a" / "b" / "hub-liaison" / "SKILL.md").rmdir()
    (skills / "a" / "b" / "hub-liaison" / "SKILL.md").write_text("x")
    (skills / "coms" / "other").mkdir(parents=True)
    (skills / "coms" / "other" / "SKILL.md").write_text("x")  # another skill
    assert lines(check_liaison(world.config, world.env)) == [missing]
    in_category = skills / "coms" / "hub-liaison" / "SKILL.md"
    in_category.parent.mkdir()
    in_category.write_text("x")
    assert lines(check_liaison(world.config, world.env))[0] == (
        f"✔ hub-liaison: skill at {in_category}")
    (skills / "hub-liaison" / "SKILL.md").rmdir()
    (skills / "hub-liaison" / "SKILL.md").write_text("x")  # the top one comes first
    assert lines(check_liaison(world.config, world.env))[0] == (
        f"✔ hub-liaison: skill at {skills / 'hub-liaison' / 'SKILL.md'}")
    ops = world.home / ".hermes" / "profiles" / "ops"
    ops.mkdir(parents=True)
    assert lines(check_liaison(world.with_("--hermes-profile", "ops"), world.env)) == [
        f"✖ hub-liaison: not installed at {ops / 'plugins' / 'hub-liaison'}; run "
        "`coms-hermes-bridge liaison install --hermes-profile ops`"]


def test_the_plugin_is_installed_enabled_and_this_version(world: World) -> None:
    # X14, W21: a plugin of this package, enabled, in a Hermes with the hooks: as
    # `liaison status` says it
    plugin = installed(world)
    assert lines(check_liaison(world.config, world.env)) == [
        f"✔ hub-liaison: installed at {plugin}", "✔ hub-liaison: enabled in Hermes", HOOKS]


def test_a_plugin_not_enabled_is_broken(world: World) -> None:
    # X14: Hermes loads only the plugins config.yaml enables
    plugin = installed(world, enabled=False)
    checks = list(check_liaison(world.config, world.env))
    assert lines(checks) == [
        f"✔ hub-liaison: installed at {plugin}",
        "✖ hub-liaison: not enabled; run `coms-hermes-bridge liaison install`", HOOKS]
    assert [c.ok for c in checks] == [True, False, True]


def test_a_plugin_of_another_version_is_broken(world: World) -> None:
    # X14: the installed copy is compared with this package's, file for file
    plugin = installed(world)
    (plugin / "answers.py").write_text("# an older liaison\n", encoding="utf-8")
    older = (f"✖ hub-liaison: an older copy at {plugin}; run `coms-hermes-bridge liaison "
             "install --hermes-profile default`")
    assert lines(check_liaison(world.with_("--hermes-profile", "default"), world.env)) == [
        older, "✔ hub-liaison: enabled in Hermes", HOOKS]
    (plugin / "markers.py").unlink()
    (plugin / "answers.py").unlink()  # gone files differ too
    assert lines(check_liaison(world.config, world.env))[0].startswith(
        f"✖ hub-liaison: an older copy at {plugin}")
    shutil.rmtree(plugin)
    plugin.mkdir()
    (plugin / "plugin.yaml").write_text("name: hub-liaison\n")  # without its code: no plugin
    assert [c.ok for c in check_liaison(world.config, world.env)] == [False, True, True]


def test_a_plugin_that_cannot_be_checked_is_said(world: World) -> None:
    # X14: no hermes to ask is not a broken plugin (the hermes line is), but it is said
    installed(world)
    (world.bin / "hermes").unlink()
    checks = list(check_liaison(world.config, world.env))
    assert lines(checks) == [
        "– hub-liaison: cannot check the plugin: 'hermes' is not on PATH; the liaison is a "
        "plugin of the Hermes gateway: install hermes-agent first"]
    shutil.rmtree(world.home / ".hermes" / "plugins" / "hub-liaison")
    world.hermes('#!/bin/sh\nexec /opt/hermes/run "$@"\n')  # a wrapper: no Python named
    where = world.home / ".hermes" / "plugins" / "hub-liaison"
    assert lines(check_liaison(world.config, world.env)) == [  # absent is absent: exit 1
        f"✖ hub-liaison: not installed at {where}; cannot check the plugin: cannot tell "
        f"which Python runs {world.bin / 'hermes'}"]
    ops = world.home / ".hermes" / "profiles" / "ops"
    (ops / "plugins" / "hub-liaison").mkdir(parents=True)  # the profile's own plugins
    assert lines(check_liaison(world.with_("--hermes-profile", "ops"), world.env)) == [
        f"– hub-liaison: cannot check the plugin: cannot tell which Python runs "
        f"{world.bin / 'hermes'}"]


def test_the_skill_alone_holds_and_the_plugin_is_recommended(world: World) -> None:
    # W21, X14: a skill answers too, through an agent turn; the plugin needs none
    plugin = probed_hermes(world)
    skill = world.home / ".hermes" / "skills" / "hub-liaison" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("x")
    checks = list(check_liaison(world.with_("--hermes-profile", "default"), world.env))
    assert lines(checks) == [
        f"✔ hub-liaison: skill at {skill}",
        f"– hub-liaison plugin: not installed at {plugin}; run `coms-hermes-bridge liaison "
        "install --hermes-profile default`; the plugin answers without an agent turn (no LLM "
        "call, no tokens), the skill needs one"]
    assert [c.ok for c in checks] == [True, None]


def test_the_plugin_and_the_skill_together_are_warned_of(world: World) -> None:
    # X14, C11: both answer one reply; the skill's second file reaches a closed question
    plugin = installed(world)
    skill = world.home / ".hermes" / "skills" / "coms" / "hub-liaison" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("x")
    checks = list(check_liaison(world.config, world.env))
    assert lines(checks) == [
        f"✔ hub-liaison: installed at {plugin}", "✔ hub-liaison: enabled in Hermes", HOOKS,
        f"✔ hub-liaison: skill at {skill}",
        "⚠ hub-liaison: both the plugin and the skill are installed: in a busy chat the skill "
        "may write a second answer file after the plugin's, and the human then gets a "
        "needless ℹ note (the question is already closed); remove the skill "
        f"({skill.parent})"]
    assert [(c.ok, c.warning) for c in checks][-2:] == [(True, False), (True, True)]


def test_the_questions_directory_must_be_ours_and_closed(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = world.config.questions_dir

    def line() -> str:
        return lines(check_files(world.config))[0]

    assert line() == (f"– questions directory: {directory} is not there yet; the bridge "
                      "makes it (0700) when it starts")
    directory.parent.mkdir(parents=True)
    directory.write_text("")
    assert line() == f"✖ questions directory: {directory} is not a directory"
    inside = dataclasses.replace(world.config, questions_dir=directory / "q")
    assert lines(check_files(inside))[0] == (
        f"✖ questions directory: {directory / 'q'}: [Errno 20] Not a directory: "
        f"'{directory / 'q'}'")
    directory.unlink()
    elsewhere = world.home / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    directory.symlink_to(elsewhere)  # lstat: the link itself is looked at
    assert line() == f"✖ questions directory: {directory} is not a directory"
    directory.unlink()
    directory.mkdir()
    for mode in (0o701, 0o710, 0o750, 0o707, 0o1750):
        directory.chmod(mode)
        assert line() == (f"✖ questions directory: {directory} is mode {mode:04o}; "
                          f"`chmod 700 {directory}` (the bridge tightens it at start)")
    directory.chmod(0o2700)  # what the mode bits outside the group's and others' do not matter
    assert line() == f"✔ questions directory: {directory} (ours, 0700)"
    directory.chmod(0o700)
    assert line() == f"✔ questions directory: {directory} (ours, 0700)"
    owner = directory.stat().st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)  # as another user sees it
    assert line() == (f"✖ questions directory: {directory} belongs to uid {owner}, not to us "
                      f"({owner + 1}): another user could forge answers")


def test_the_state_file_is_read_not_made(world: World) -> None:
    state = world.config.state_path

    def line() -> str:
        return lines(check_files(world.config))[1]

    assert line() == f"– state: no {state} yet (made at the first start)"
    assert not state.exists()
    state.parent.mkdir(parents=True)
    state.write_bytes(b"not a database" * 100)
    assert line() == (f"✖ state: cannot read state database {state}: "
                      "file is not a database")
    state.unlink()
    state_file(state, closed=3)
    assert line() == f"✔ state: {state}, 1 open question(s)"


def serve_ping(world: World, reply: bytes | None) -> tuple[Asker, BridgeConfig]:
    """A live peer registered as the project's bridge, answering a ping with `reply`."""
    peer = Asker.beside(world.bin, reply=lambda line: reply)
    register_bridge(world.config, peer.endpoint)
    return peer, world.config


def test_the_bridge_check_pings_the_live_bridge(world: World) -> None:
    peer, config = serve_ping(world, b'{"type":"pong","msg_id":"doctor"}\n')
    try:
        assert check_bridge(config).line() == (
            f"✔ bridge demo: user-remote (pid {os.getpid()}) answers at {peer.endpoint}")
        assert peer.lines == [b'{"type":"ping","msg_id":"doctor"}\n']  # W17
    finally:
        peer.close()


@pytest.mark.parametrize("reply", [
    b'{"type":"ack","msg_id":"doctor"}\n', b'nope\n{"type":"pong"}\n', b"x" * 300 + b"\n"])
def test_a_bridge_that_answers_a_ping_with_no_pong_is_broken(world: World, reply: bytes) -> None:
    peer, config = serve_ping(world, reply)
    try:
        assert check_bridge(config).line() == (
            f"✖ bridge demo: user-remote at {peer.endpoint} answered a ping with {reply[:200]!r}")
    finally:
        peer.close()


def test_a_bridge_that_does_not_answer_is_broken(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(doctor_module, "PING_TIMEOUT_S", 0.2)
    peer, config = serve_ping(world, None)  # reads the ping, says nothing
    try:
        assert check_bridge(config).line() == (
            f"✖ bridge demo: user-remote (pid {os.getpid()}) does not answer at "
            f"{peer.endpoint}: TimeoutError")
    finally:
        peer.close()
    os.unlink(peer.endpoint)
    assert check_bridge(config).line() == (
        f"✖ bridge demo: user-remote (pid {os.getpid()}) does not answer at {peer.endpoint}: "
        "[Errno 2] No such file or directory")


SYSTEMCTL = """#!/bin/sh
echo "$@" > "${0%/*}/systemctl.argv"
printf '%s' "$STATE"
[ -z "$SAY" ] || echo "$SAY" >&2
exit "${CODE:-0}"
"""


def test_the_service_check_asks_the_user_manager(world: World) -> None:
    unit = "coms-hermes-bridge@demo.service"
    config = world.with_("--project", "demo", "--to", "telegram:42")
    assert check_service(config, world.env).line() == "– service: no systemd here (no systemctl)"
    program(world.bin / "systemctl", SYSTEMCTL)

    def line(state: str, code: int = 0, say: str = "", **env: str) -> str:
        run = {**world.env, "STATE": state, "CODE": str(code), "SAY": say, **env}
        return check_service(config, run).line()

    assert line("active\n") == f"✔ service: {unit} is active"
    assert (world.bin / "systemctl.argv").read_text() == f"--user is-active {unit}\n"
    assert line("", 1, "Failed to connect to Bus: No medium found") == (
        "– service: no systemd user manager to ask (Failed to connect to Bus: No medium found)")
    assert line("unknown", 1, "Failed to connect to bus") == (
        "– service: no systemd user manager to ask (Failed to connect to bus)")
    not_installed = ("✖ service: coms-hermes-bridge@.service is not installed; "
                     "`scripts/dev install-service demo --to telegram:42` in the checkout")
    assert line("active", 3) == not_installed  # said active, exit code not 0
    assert line("activating") == not_installed
    assert line("inactive", 3, "bus") == not_installed  # a state: the bus answered
    config_home = world.home / "config"
    program(config_home / "systemd" / "user" / UNIT, "[Service]\n")
    then = f"`systemctl --user enable --now {unit}`, then `journalctl --user -u {unit}`"
    assert line("failed", 3, XDG_CONFIG_HOME=str(config_home)) == (
        f"✖ service: {unit} is failed; {then}")
    assert line("", 3, XDG_CONFIG_HOME=str(config_home)) == (
        f"✖ service: {unit} is not active; {then}")


def test_a_systemctl_that_hangs_is_not_a_broken_link(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(doctor_module, "CHECK_TIMEOUT_S", 0.2)
    program(world.bin / "systemctl", "#!/bin/sh\nexec /bin/sleep 30\n")
    assert check_service(world.config, world.env).line() == (
        "– service: systemctl --user did not answer: did not finish in 0.2s")


def test_the_test_message_goes_through_the_profile(world: World) -> None:
    assert check_send(world.config, world.env).line() == (  # not on PATH: the name, as is
        "✖ test message: hermes send: [Errno 2] No such file or directory: 'hermes'")
    hermes = FakeHermes(world.bin)
    config = world.with_("--hermes-profile", "ops", "--to", "telegram:42")
    assert check_send(config, world.env).line() == (
        "✔ test message: sent to telegram:42; look for it in Telegram")
    assert hermes.argvs() == [["--profile", "ops", "send", "--to", "telegram:42", TEST_TEXT]]
    assert TEST_TEXT == "coms-hermes-bridge doctor: a test message; nothing to answer."
    hermes.configure(exit=2)
    assert check_send(config, world.env).line() == "✖ test message: hermes send failed (2): exit 2"
    broken = world.hermes("#!/nonexistent/python3\n")  # found, but cannot start: named in full
    assert check_send(config, world.env).line() == (
        f"✖ test message: hermes send: [Errno 2] No such file or directory: '{broken}'")


def test_the_checks_run_in_the_chains_order(world: World) -> None:
    world.hermes(FAKE_HERMES)
    config = world.with_("--project", "demo", "--hermes-profile", "ops")
    names = ["hermes", "hermes profile", "--to", "hub-liaison",
             "questions directory", "state", "bridge demo", "service"]
    assert [check.name for check in run_checks(config, world.env)] == names
    assert [check.name for check in run_checks(config, world.env, send_test=True)] == [
        *names, "test message"]


def test_an_empty_to_is_judged_as_the_daemon_judges_it(bridge: Bridge) -> None:
    # one check of --to: doctor refuses `--to ""` as the daemon does, not the default
    FakeHermes(bridge.hermes.directory)
    done = doctor(bridge, "--to", "")
    assert done.returncode == 1
    assert "✖ --to: --to must not be empty" in done.stdout.splitlines()
