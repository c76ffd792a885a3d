"""The command line and environment (C16, W1, W4; the TypeScript daemon's flags)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coms_hermes_bridge.actors.config import UsageError, parse_config

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
    assert config.shared_state_path == bridge / "state.sqlite3"


def test_state_is_kept_per_project() -> None:
    # two projects on one HOME never share a state file
    a = parse_config(["--project", "a"], ENV)
    b = parse_config(["--project", "b"], ENV)
    assert a.state_path.name == "state-a.sqlite3" and b.state_path.name == "state-b.sqlite3"
    assert a.state_path.parent == b.state_path.parent == a.log_path.parent
    assert a.shared_state_path == b.shared_state_path


def test_environment() -> None:
    config = parse_config([], {**ENV, "PI_COMS_DIR": "/srv/coms", "PI_COMS_TIMEOUT_MS": "250"})
    assert config.coms_dir == Path("/srv/coms")  # W1
    assert config.questions_dir == Path("/home/op/.pi/coms/hermes-bridge/questions")  # W4
    assert config.timeout_ms == 250  # C16


def test_every_flag() -> None:
    config = parse_config(
        [
            "--name", "remote-b", "--project", "p.1", "--to", "telegram:-100:7",
            "--hermes-profile", "ops", "--timeout", "5000", "--poll-ms", "250",
            "--questions-dir", "/var/q/answers", "--send-timeout", "9000", "--claim-ms", "500",
            "--max-open", "3",
        ],
        {**ENV, "PI_COMS_TIMEOUT_MS": "250"},
    )  # fmt: skip
    assert (config.name, config.project, config.target) == ("remote-b", "p.1", "telegram:-100:7")
    assert (config.hermes_profile, config.timeout_ms) == ("ops", 5000)  # C16: flag wins
    assert (config.poll_ms, config.send_timeout_ms) == (250, 9000)
    assert config.notices == (  # X6 as revised: kept for old units, said once at start
        "--claim-ms is no longer used: an answer file is left for another bridge on this "
        "host exactly while that bridge's state knows its qid (X6)",
    )
    assert config.max_open == 3
    assert config.log_path == Path("/var/q/log.ndjson")  # C20: beside the questions directory


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--to", "a", "--to", "b"], "--to may only be specified once"),
        (["--to", " "], "--to must not be empty"),
        (["--timeout", "-5"], "--timeout must be a positive number"),
        (["--timeout", "nan"], "--timeout must be a positive number"),
        (["--poll-ms", "0"], "--poll-ms must be a positive number"),
        (["--claim-ms", "soon"], "--claim-ms must be a positive number"),
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
