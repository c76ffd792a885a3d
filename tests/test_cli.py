"""The operator's command line itself, in this process: each verb's help and its refusals.
(What the verbs do, beside a running daemon: test_ops.py and test_doctor.py.)"""

from __future__ import annotations

import contextlib
import getpass
import io
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from coms_hermes_bridge import cli
from coms_hermes_bridge.actors.config import parse_config
from coms_hermes_bridge.cli import VERBS, main, render
from tests.fakes import state_file

PROJECT = (
    "--project PROJECT coms project (default: every project for status, the one that has "
    "the qid open for answer and cancel, `default` for doctor and liaison)"
)
QUESTIONS_DIR = ("--questions-dir DIR the daemon's --questions-dir, if it was given (default: "
                 "~/.pi/coms/hermes-bridge/questions)")
ARGUMENTS = {
    "status": ["--json one JSON object instead of a table",
               "--closed N closed questions to show (default: 10)"],
    "answer": ["--by NAME who answered, as the asker is told (default: cli:<your login>)",
               "qid text the answer; several words are joined by spaces"],
    "cancel": ["positional arguments: qid options:"],
    "doctor": ["--to TARGET the daemon's --to (default: telegram)",
               "--hermes-profile PROFILE the daemon's --hermes-profile (default: hermes' own)",
               "--send-test also send one test message"],
    "liaison": ["positional arguments: {install,uninstall,status}",  # X14
                "--hermes-profile PROFILE the Hermes profile whose gateway gets the plugin "
                "(default: hermes' own)"],
}


@pytest.mark.parametrize("verb", list(VERBS))
def test_each_verb_says_what_it_does_and_takes(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main([verb, "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: coms-hermes-bridge {verb} [-h] [--project PROJECT]")
    flat = " ".join(out.split())  # argparse wraps to the terminal: compare the words
    for words in (VERBS[verb], PROJECT, QUESTIONS_DIR, *ARGUMENTS[verb]):
        assert words in flat, words
    assert not re.search(r"\b[CWX]\d+\b", out)  # plain words: no requirement ids
    defaults = [line.strip() for line in out.splitlines() if "(default:" in line]
    assert defaults and all(line.startswith("(default: ") for line in defaults)  # own lines


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["status", "--pro", "x"], "unrecognized arguments: --pro x"),  # never abbreviated
        (["status", "--closed", "x"], "argument --closed: invalid int value: 'x'"),
        (["answer"], "the following arguments are required: qid, text"),
        (["answer", "01J8ZJ3V5R0000000000000000"], "the following arguments are required: text"),
        (["cancel"], "the following arguments are required: qid"),
        (["liaison"], "the following arguments are required: action"),
        (["liaison", "reinstall"], "argument action: invalid choice: 'reinstall' "
         "(choose from 'install', 'uninstall', 'status')"),
        (["doctor", "--project", "a/b"], 'invalid project name: "a/b"'),  # W1
        (["answer", "nope", "yes"], "'nope' is not a qid (26 characters, Crockford base32)"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_1(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(argv) == 1
    assert capsys.readouterr() == ("", f"coms-hermes-bridge: {error}\n")


@pytest.mark.parametrize(
    ("word", "hint"),
    [
        ("statu", "did you mean status?"),
        ("cancle", "did you mean cancel?"),
        ("Doctor", "did you mean doctor?"),
        ("zzz", "the commands are status, answer, cancel, doctor, liaison"),
        ("", "the commands are status, answer, cancel, doctor, liaison"),
    ],
)
def test_a_mistyped_verb_gets_the_nearest_one_and_exit_1(
    word: str, hint: str, capsys: pytest.CaptureFixture[str],
) -> None:  # a bare first word is never the daemon's: no daemon flag is one
    assert main([word, "--project", "x"]) == 1  # a bad command line, as a bad flag
    assert capsys.readouterr() == ("", f"coms-hermes-bridge: unknown command {word!r}; {hint}\n")


QIDS = ["01J8ZJ3V5R" + c * 16 for c in "ABCDE"]
STATUS = {
    "project": "demo",
    "bridge": {"name": "user-remote", "pid": 42, "started_at": "2020-01-02T11:00:00.000Z"},
    "open": [
        {"qid": QIDS[0], "asker": "", "state": "new", "age_s": 5.5, "time_left_s": 1795.2,
         "question": "Deploy?", "options": []},
        {"qid": QIDS[1], "asker": "an-asker-of-22-chars..", "state": "delivered",
         "age_s": 3725.0, "time_left_s": 90000.0, "question": "x" * 80, "options": []},
        {"qid": QIDS[2], "asker": "sixteen-chars-ok", "state": "pending", "age_s": 0.0,
         "time_left_s": 0.0, "question": "y" * 72, "options": []},
    ],
    "closed": [{"qid": QIDS[3], "state": "answered", "closed_at": "2020-01-02T11:58:30.000Z"},
               {"qid": QIDS[4], "state": "timeout", "closed_at": None}],
    "failed": [{"qid": QIDS[0], "at": "2020-01-02T11:55:00.000Z", "asker": "builder",
                "exit_status": 3, "error": "chat not found " + "z" * 80},
               {"qid": QIDS[1], "at": "2020-01-02T11:01:00.000Z", "asker": None,
                "exit_status": None, "error": "timed out after 60000ms"}],
}
NOW = datetime(2020, 1, 2, 12, 0, 0, tzinfo=UTC)


def test_the_status_table() -> None:
    # one column each, a text too wide for its column cut to it with "…" (one that fits
    # kept whole), an unknown asker or closing time as "-"
    assert render(STATUS, NOW).split("\n") == [
        "bridge user-remote@demo: running (pid 42, up since 2020-01-02T11:00:00.000Z)",
        "open questions: 3",
        "  QID                         ASKER             STATE          AGE     LEFT  QUESTION",
        "  01J8ZJ3V5RAAAAAAAAAAAAAAAA  -                 new             5s   29m55s  Deploy?",
        "  01J8ZJ3V5RBBBBBBBBBBBBBBBB  an-asker-of-22-…  delivered    1h02m    1d01h  "
        + "x" * 71 + "…",
        "  01J8ZJ3V5RCCCCCCCCCCCCCCCC  sixteen-chars-ok  pending         0s       0s  " + "y" * 72,
        "recently closed: 2",
        "  01J8ZJ3V5RDDDDDDDDDDDDDDDD  answered   1m30s ago",
        "  01J8ZJ3V5REEEEEEEEEEEEEEEE  timeout    -",
        "failed deliveries (last hour): 2",  # X11's memory, newest first
        "  QID                         ASKER             EXIT        WHEN  ERROR",
        "  01J8ZJ3V5RAAAAAAAAAAAAAAAA  builder              3   5m00s ago  chat not found "
        + "z" * 56 + "…",
        "  01J8ZJ3V5RBBBBBBBBBBBBBBBB  -                    -  59m00s ago  timed out after 60000ms",
    ]
    idle = {**STATUS, "bridge": None, "open": [], "closed": [], "failed": []}
    assert render(idle, NOW) == "bridge for project demo: not running\nopen questions: 0"


def test_the_status_table_counts_from_now_by_default() -> None:
    closed = render({**STATUS, "open": [], "failed": []}).split("\n")[-2]  # closed years ago
    assert re.fullmatch(r"  01J8ZJ3V5RD{16}  answered   \d+d\d\dh ago", closed), closed


def test_a_failed_rows_asker_is_cut_to_its_column_and_no_error_is_a_dash() -> None:
    row = {"qid": QIDS[2], "at": "2020-01-02T11:59:00.000Z", "asker": "seventeen-chars-x",
           "exit_status": 1, "error": None}  # X11: a failure whose error line is gone
    assert render({**STATUS, "open": [], "closed": [], "failed": [row]}, NOW).split("\n")[-1] == (
        "  01J8ZJ3V5RCCCCCCCCCCCCCCCC  seventeen-chars…     1   1m00s ago  -")


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME and a coms directory for the verbs; the state files' directory returned."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PI_COMS_DIR", str(tmp_path / "coms"))
    return parse_config(["--project", "demo"], os.environ).state_path.parent


def test_status_of_an_unknown_project_names_those_there_are(
    here: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["status", "--project", "nosuch"]) == 1
    assert capsys.readouterr() == ("", "coms-hermes-bridge: no bridge and no state for project "
                                   "nosuch (projects here: none)\n")
    for project in ("demo", "ops"):
        state_file(here / f"state-{project}.sqlite3", 0)
    assert main(["status", "--project", "nosuch"]) == 1
    assert capsys.readouterr() == ("", "coms-hermes-bridge: no bridge and no state for project "
                                   "nosuch (projects here: demo, ops)\n")


def test_status_of_every_project_shows_those_it_can_read_and_names_the_other(
    here: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    state_file(here / "state-demo.sqlite3", 0)
    bad = here / "state-bad.sqlite3"
    bad.write_bytes(b"garbage" * 100)
    assert main(["status"]) == 1
    demo, said = capsys.readouterr().out.split("\n\n")
    assert demo.startswith("bridge for project demo: not running\nopen questions: 1\n")
    assert said == (f"bridge for project bad: cannot read its state: cannot read state database "
                    f"{bad}: file is not a database\n")


def test_who_answers_by_default_is_the_login_else_the_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(getpass, "getuser", lambda: "alice")
    assert cli._login() == "alice"

    def no_login() -> str:
        raise KeyError("no passwd entry")  # getpass: no LOGNAME, USER nor passwd entry

    monkeypatch.setattr(getpass, "getuser", no_login)
    assert cli._login() == str(os.getuid())


def test_a_reader_that_goes_away_is_no_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `status | head`: the pipe closes under the table, and that is not an error
    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PI_COMS_DIR", str(tmp_path / "coms"))
    with contextlib.redirect_stdout(Gone()):
        assert main(["status"]) == 0


def test_the_daemon_gets_the_command_line_it_was_given(
    here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # main(argv) runs the daemon on argv, not on the process's own
    monkeypatch.setattr("sys.argv", ["coms-hermes-bridge", "--poll-ms", "5"])
    assert main(["--timeout", "0"]) == 1
    assert capsys.readouterr() == ("", "coms-hermes-bridge: --timeout must be a positive number\n")
