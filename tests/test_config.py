"""The command line and environment (C16, W1, W4; the TypeScript daemon's flags)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from coms_hermes_bridge import __version__
from coms_hermes_bridge.actors.config import HELP_EPILOG, UsageError, home_dir, parse_config
from coms_hermes_bridge.cli import VERBS

ENV = {"HOME": "/home/op"}


def test_defaults() -> None:
    config = parse_config([], ENV)
    assert (config.name, config.project, config.target) == ("user-remote", "default", "telegram")
    assert config.hermes_profile is None
    assert (config.timeout_ms, config.poll_ms, config.send_timeout_ms) == (1_800_000, 1000, 60_000)
    assert config.notices == ()
    assert (config.max_open_per_asker, config.remind_before_ms) == (None, None)  # X9, X10: off
    assert config.max_open == 10_000
    assert config.coms_dir == Path("/home/op/.pi/coms")  # W1
    bridge = Path("/home/op/.pi/coms/hermes-bridge")  # W4: from HOME, not PI_COMS_DIR
    assert config.questions_dir == bridge / "questions"
    assert config.log_path == bridge / "log.ndjson"
    assert config.state_path == bridge / "state-default.sqlite3"


def test_state_is_kept_per_project() -> None:
    # two projects on one HOME never share a state file
    a = parse_config(["--project", "a"], ENV)
    b = parse_config(["--project", "b"], ENV)
    assert a.state_path.name == "state-a.sqlite3" and b.state_path.name == "state-b.sqlite3"
    assert a.state_path.parent == b.state_path.parent == a.log_path.parent


def test_environment() -> None:
    config = parse_config([], {**ENV, "PI_COMS_DIR": "/srv/coms", "PI_COMS_TIMEOUT_MS": "250"})
    assert config.coms_dir == Path("/srv/coms")  # W1
    assert config.questions_dir == Path("/home/op/.pi/coms/hermes-bridge/questions")  # W4
    assert config.timeout_ms == 250  # C16


def test_every_flag(tmp_path: Path) -> None:
    (tmp_path / "q").mkdir()
    config = parse_config(
        [
            "--name", "remote-b", "--project", "p.1", "--to", "telegram:-100:7",
            "--hermes-profile", "ops", "--timeout", "5000", "--poll-ms", "250",
            "--questions-dir", f"{tmp_path}/q/answers", "--send-timeout", "9000", "--claim-ms", "500",
            "--max-open", "3",
        ],
        {**ENV, "PI_COMS_TIMEOUT_MS": "250"},
    )  # fmt: skip
    assert (config.name, config.project, config.target) == ("remote-b", "p.1", "telegram:-100:7")
    assert (config.hermes_profile, config.timeout_ms) == ("ops", 5000)  # C16: flag wins
    assert (config.poll_ms, config.send_timeout_ms) == (250, 9000)
    assert config.notices == ()  # --claim-ms: accepted for old units, and ignored
    assert config.max_open == 3
    assert config.log_path == tmp_path / "q" / "log.ndjson"  # C20: beside the questions dir


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--to", "a", "--to", "b"], "--to may only be specified once"),
        (["--to", " "], "--to must not be empty"),
        (["--timeout", "-5"], "--timeout must be a positive number"),
        (["--timeout", "nan"], "--timeout must be a positive number"),
        (["--poll-ms", "0"], "--poll-ms must be a positive number"),
        (["--poll-ms", "1e-9"], "--poll-ms must be at least 10 (ms between rescans)"),
        (["--poll-ms", "9.99"], "--poll-ms must be at least 10 (ms between rescans)"),
        (["--send-timeout", "0"], "--send-timeout must be a positive number"),
        (["--claim-ms"], "argument --claim-ms: expected one argument"),
        (["--max-open", "0"], "--max-open must be a positive whole number"),
        (["--max-open", "2.5"], "--max-open must be a positive whole number"),
        (["--max-open", "-1"], "--max-open must be a positive whole number"),
        (["--max-open", "１"], "--max-open must be a positive whole number"),
        (["--hermes-profile", "a b"], "--hermes-profile must be a safe profile name: 'a b'"),
        (["extra"], "unrecognized arguments: extra"),
    ],
)
def test_bad_values(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_config(argv, ENV)
    assert str(caught.value) == message


def test_ten_ms_is_the_shortest_rescan_interval() -> None:
    # a shorter one spun a core rescanning; 10 ms is still far below the 1 s default
    assert parse_config(["--poll-ms", "10"], ENV).poll_ms == 10


def test_one_is_the_smallest_count() -> None:  # X10
    config = parse_config(["--max-open", "1", "--max-open-per-asker", "1"], ENV)
    assert (config.max_open, config.max_open_per_asker) == (1, 1)


def test_the_operators_limits() -> None:  # X9, X10
    config = parse_config(["--max-open-per-asker", "2", "--remind-before", "3000"], ENV)
    assert (config.max_open_per_asker, config.remind_before_ms) == (2, 3000)
    for argv, error in (
        (["--max-open-per-asker", "0"], "--max-open-per-asker must be a positive whole number"),
        (["--max-open-per-asker", "2.5"], "--max-open-per-asker must be a positive whole number"),
        (["--remind-before", "soon"], "--remind-before must be a positive number"),
        (["--remind-before", "-1"], "--remind-before must be a positive number"),
    ):
        with pytest.raises(UsageError) as caught:
            parse_config(argv, ENV)
        assert str(caught.value) == error


def _exits_with(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What a flag that answers and exits (--help, --version) prints; it exits 0."""
    with pytest.raises(SystemExit) as caught:
        parse_config(argv, ENV)
    assert caught.value.code == 0
    return capsys.readouterr().out


def test_the_help_gives_every_flag_its_words(capsys: pytest.CaptureFixture[str]) -> None:
    out = _exits_with(["--help"], capsys)
    assert out.startswith("usage: coms-hermes-bridge ")
    flat = " ".join(out.split())  # argparse wraps to the terminal: compare the words
    for words in (
        "Join the coms pool as the remote human: ask via `hermes send`, answer from the "
        "Hermes gateway's answer files.",
        "--name NAME the name agents address the human by (default: user-remote)",
        "--project PROJECT the coms project whose agents may ask (default: default)",
        "--to TARGET where `hermes send` sends questions: telegram, telegram:<chat_id>, "
        "telegram:<chat_id>:<thread_id> or telegram:<chat name> (default: telegram, hermes' "
        "home channel)",
        "--hermes-profile PROFILE the hermes profile to send with (default: hermes' own)",
        "--timeout MS how long a question waits for its answer, in ms (default: "
        "PI_COMS_TIMEOUT_MS, else 1800000)",
        "--poll-ms MS how often the answer files are looked over again, in ms, at least 10 "
        "(default: 1000)",
        "--questions-dir DIR where answer files arrive; its parent must exist and gets the "
        "log and state (default: ~/.pi/coms/hermes-bridge/questions)",
        "--send-timeout MS the longest one `hermes send` may take, in ms (default: 60000)",
        "--max-open N open questions past which new ones are refused (default: 10000)",
        "--max-open-per-asker N open questions one agent may have; its next one is refused "
        "(default: off)",
        "--remind-before MS remind the human once, this long before a question times out, "
        "in ms (default: off)",
        "--version show program's version number and exit",
    ):
        assert words in flat, words
    # each setting's default on a line of its own, after its words
    options = out.split("\noptions:\n")[1].split("\n\n")[0].splitlines()
    defaults = [line.strip() for line in options if "(default:" in line]
    assert len(defaults) == 11 and all(line.startswith("(default: ") for line in defaults)
    assert not re.search(r"\b[CWX]\d+\b", out)  # plain words: no requirement ids
    assert "--claim-ms" not in out  # kept for old units, never offered
    assert out.endswith(HELP_EPILOG)  # as written, line for line
    verbs = out.split("operator's commands (the same program, first word):\n")[1]
    listed = [line.split()[0].split("|")[0] for line in verbs.split("\n\n")[0].splitlines()
              if line.startswith("  ") and not line.startswith("   ") and "--help" not in line]
    assert listed == list(VERBS)  # every verb the command knows, in its order


def test_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exits_with(["--version"], capsys) == f"coms-hermes-bridge {__version__}\n"


def test_a_flag_is_never_taken_by_its_start() -> None:
    # "--time" is no "--timeout": a typo in a unit file is an error, not a guess
    with pytest.raises(UsageError) as caught:
        parse_config(["--time", "5"], ENV)
    assert str(caught.value) == "unrecognized arguments: --time 5"


@pytest.mark.parametrize(("raw", "ms"), [("", 30_000), (" ", 30_000), ("500", 500),
                                         ("60000", 60_000)])
def test_the_heartbeat_interval(raw: str, ms: float) -> None:  # W6
    env = {**ENV, "COMS_HERMES_BRIDGE_HEARTBEAT_MS": raw}
    assert parse_config([], env).heartbeat_ms == ms
    assert parse_config([], ENV).heartbeat_ms == 30_000


@pytest.mark.parametrize("raw", ["0", "60001", "soon", "-5"])
def test_a_heartbeat_interval_out_of_range(raw: str) -> None:  # W6: well under 90 s
    with pytest.raises(UsageError) as caught:
        parse_config([], {**ENV, "COMS_HERMES_BRIDGE_HEARTBEAT_MS": raw})
    assert str(caught.value) == (
        "COMS_HERMES_BRIDGE_HEARTBEAT_MS must be a positive number of ms up to 60000")


@pytest.mark.parametrize(("raw", "ms"), [("", 30_000), (" ", 30_000), ("250", 250),
                                         ("3600000", 3_600_000)])
def test_the_reoffer_interval(raw: str, ms: float) -> None:  # the Watcher's safety net
    env = {**ENV, "COMS_HERMES_BRIDGE_REOFFER_MS": raw}
    assert parse_config([], env).reoffer_ms == ms
    assert parse_config([], ENV).reoffer_ms == 30_000


@pytest.mark.parametrize("raw", ["0", "-5", "soon", "inf"])
def test_a_reoffer_interval_that_is_no_positive_number(raw: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_config([], {**ENV, "COMS_HERMES_BRIDGE_REOFFER_MS": raw})
    assert str(caught.value) == "COMS_HERMES_BRIDGE_REOFFER_MS must be a positive number of ms"


def test_home_comes_from_the_environment_then_the_password_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # W4: unset HOME is the password database's home, as Node's os.homedir()
    assert home_dir({"HOME": "/home/op"}) == Path("/home/op")
    entry = SimpleNamespace(pw_dir="/from/passwd")
    monkeypatch.setattr("pwd.getpwuid", lambda uid: entry)
    monkeypatch.setenv("HOME", "/not/this/one")  # the mapping given is read, not os.environ
    assert home_dir({}) == Path("/from/passwd")
    entry.pw_dir = ""
    with pytest.raises(UsageError) as caught:
        home_dir({})
    assert str(caught.value) == (
        f"HOME is not set and the password database has no home for uid {os.getuid()}")

    def no_entry(uid: int) -> None:
        raise KeyError(uid)

    monkeypatch.setattr("pwd.getpwuid", no_entry)
    with pytest.raises(UsageError) as caught:
        home_dir({})
    assert str(caught.value).startswith("HOME is not set and the password database")


def test_a_home_set_but_empty_is_refused_not_read_as_the_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # W4: read as `~`, HOME="" was `/`, and the bridge wrote /.pi/... there
    monkeypatch.setattr("pwd.getpwuid", lambda uid: SimpleNamespace(pw_dir="/from/passwd"))
    with pytest.raises(UsageError) as caught:
        home_dir({"HOME": ""})
    assert str(caught.value) == (
        "HOME is set but empty: set it to your home directory, or unset it")
    with pytest.raises(UsageError) as caught:  # the daemon's settings and every verb's
        parse_config([], {"HOME": ""})
    assert str(caught.value).startswith("HOME is set but empty")


@pytest.mark.parametrize("target", [
    "telegram", "telegram:42", "telegram:-1001234567890:7", "telegram:@abcd", "telegram:Ops team",
    "Telegram:42", " telegram:42 "])
def test_a_telegram_target_hermes_can_send_to_starts_quietly(target: str) -> None:
    # hermes resolves a name from its channel directory: only doctor can look that up
    config = parse_config(["--to", target], ENV)
    assert (config.target, config.notices) == (target, ())


@pytest.mark.parametrize(("target", "message"), [
    (":42", "--to ':42' names no platform: give telegram, telegram:<chat_id> or "
     "telegram:<chat name>"),
    ("telegram:", "--to 'telegram:' has nothing after the colon: give the chat, or telegram "
     "alone for hermes' home channel"),
    ("telegram: ", "--to 'telegram: ' has nothing after the colon: give the chat, or telegram "
     "alone for hermes' home channel"),
])
def test_a_target_hermes_can_never_send_to_is_refused(target: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_config(["--to", target], ENV)
    assert str(caught.value) == message


@pytest.mark.parametrize("target", ["whatsapp:+15551234567", "slack", "telegramx:1"])
def test_another_platform_starts_with_a_warning(target: str) -> None:
    assert parse_config(["--to", target], ENV).notices == (
        f"--to {target}: answers come back only from Telegram (the liaison listens there "
        "alone); answer other questions with `coms-hermes-bridge answer`",)


def test_a_questions_dir_whose_parent_is_missing_is_refused(tmp_path: Path) -> None:
    wanted = tmp_path / "typo" / "questions"
    with pytest.raises(UsageError) as caught:
        parse_config(["--questions-dir", str(wanted)], ENV)
    assert str(caught.value) == (
        f"--questions-dir {wanted}: its parent {tmp_path / 'typo'} is not a directory")
    assert list(tmp_path.iterdir()) == []  # nothing made
    # its parent there, the directory itself is the daemon's to make
    assert parse_config(["--questions-dir", str(tmp_path / "q")], ENV).questions_dir == (
        tmp_path / "q")


@pytest.mark.parametrize(("argv", "env", "warned"), [
    (["--remind-before", "1800000"], {}, "1800000 ms is not below the timeout, 1800000 ms"),
    (["--remind-before", "6000", "--timeout", "5000"], {}, "6000 ms is not below the timeout, "
     "5000 ms"),
    (["--remind-before", "300.5"], {"PI_COMS_TIMEOUT_MS": "300"}, "300.5 ms is not below the "
     "timeout, 300 ms"),
])
def test_a_reminder_not_before_the_timeout_is_warned_of(
    argv: list[str], env: dict[str, str], warned: str,
) -> None:  # X9; it still starts: a prompt's own timeout may be longer (X5)
    config = parse_config(argv, {**ENV, **env})
    assert config.notices == (f"--remind-before {warned}: only a question that asks for a "
                              "longer timeout of its own gets a reminder",)
    assert parse_config(["--remind-before", "4999", "--timeout", "5000"], ENV).notices == ()
