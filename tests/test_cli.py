"""The operator's command line itself, in this process: each verb's help and its refusals.
(What the verbs do, beside a running daemon: test_ops.py and test_doctor.py.)"""

from __future__ import annotations

import pytest

from coms_hermes_bridge.cli import VERBS, main

PROJECT = (
    "--project PROJECT coms project (default: every project for status, the one that has "
    "the qid open for answer and cancel, `default` for doctor)"
)
QUESTIONS_DIR = "--questions-dir DIR the daemon's --questions-dir, if it was given"
ARGUMENTS = {
    "status": ["--json one JSON object instead of a table", "--closed N closed questions to show (10)"],
    "answer": ["--by NAME answered_by (default: cli:<your login>)",
               "qid text the answer; several words are joined by spaces"],
    "cancel": ["positional arguments: qid options:"],
    "doctor": ["--to TARGET the daemon's --to (default: telegram)",
               "--hermes-profile PROFILE the daemon's --hermes-profile",
               "--send-test also send one test message"],
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


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["status", "--pro", "x"], "unrecognized arguments: --pro x"),  # never abbreviated
        (["status", "--closed", "x"], "argument --closed: invalid int value: 'x'"),
        (["answer"], "the following arguments are required: qid, text"),
        (["answer", "01J8ZJ3V5R0000000000000000"], "the following arguments are required: text"),
        (["cancel"], "the following arguments are required: qid"),
        (["doctor", "--project", "a/b"], 'invalid project name: "a/b"'),  # W1
        (["answer", "nope", "yes"], "'nope' is not a qid (26 characters, Crockford base32)"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_1(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(argv) == 1
    assert capsys.readouterr() == ("", f"coms-hermes-bridge: {error}\n")
