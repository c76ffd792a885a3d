"""The operator's verbs against a real daemon: status, answer, cancel."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ulid import ULID

from coms_hermes_bridge import ops
from coms_hermes_bridge.actors.config import BridgeConfig, parse_config
from coms_hermes_bridge.actors.peer import MODEL
from coms_hermes_bridge.actors.registry import agents_dir, write_entry
from coms_hermes_bridge.actors.store import SCHEMA_VERSION, Store
from coms_hermes_bridge.cli import main
from coms_hermes_bridge.messages.commands import QuestionSpec, SendResponse
from coms_hermes_bridge.messages.contract import iso, parse_prompt
from coms_hermes_bridge.messages.wire import RegistryEntry
from coms_hermes_bridge.ops import (
    LOG_TAIL_BYTES,
    OpsError,
    answer,
    cancel,
    project_of,
    projects,
    running_bridge,
    status,
)
from tests.bridge_process import Bridge, new_qid
from tests.fakes import Asker, prompt_envelope, register_bridge, state_file, wait_for

OPTIONS_PROMPT = json.dumps({
    "question": "Ship the release?\nIt has three fixes.",
    "context": "CI is green.",
    "options": [{"title": "Approve", "description": "Ship it"}, {"title": "Revise"}, "Stop"],
})


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def test_status_lists_open_and_closed_questions(bridge: Bridge) -> None:
    # status and status --json list both open questions, read-only while running
    bridge.start()
    plain = bridge.ask("Deploy now?")
    options = bridge.ask(OPTIONS_PROMPT)
    bridge.wait_log("delivered", plain)
    bridge.wait_log("delivered", options)

    table = bridge.verb("status")
    assert table.returncode == 0, table.stderr
    assert table.stderr == ""
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"bridge user-remote@default: running (pid {bridge.proc.pid if bridge.proc else 0},")
    assert lines[1] == "open questions: 2"
    rows = [line.split() for line in lines[3:5]]
    # qid, asker, state, age, time left, then the question's first line only
    assert rows[0][:3] == [plain, "builder", "delivered"] and rows[0][5:] == ["Deploy", "now?"]
    assert rows[1][:3] == [options, "builder", "delivered"]
    assert rows[1][5:] == ["Ship", "the", "release?"]
    assert re.fullmatch(r"\d+s", rows[0][3])  # age: seconds
    assert re.fullmatch(r"29m\d\ds", rows[0][4])  # time left of the default 30 minutes

    done = bridge.verb("status", "--json", "--project", "default")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["project"] == "default"
    assert report["bridge"]["pid"] == bridge.entry["pid"]
    assert report["bridge"]["endpoint"] == bridge.endpoint
    assert [(q["qid"], q["question"], q["asker"], q["state"]) for q in report["open"]] == [
        (plain, "Deploy now?", "builder", "delivered"),
        (options, "Ship the release?", "builder", "delivered"),
    ]
    assert report["open"][1]["options"] == ["Approve", "Revise", "Stop"]
    assert all(0 <= q["age_s"] < 60 and 1700 < q["time_left_s"] <= 1800 for q in report["open"])
    assert report["closed"] == []

    # once answered, a question moves to the closed list, newest first, with its closing time
    bridge.answer(plain, "yes")
    bridge.asker.response()
    bridge.wait_log("answered", plain)
    report = json.loads(bridge.verb("status", "--json", "--project", "default").stdout)
    assert [q["qid"] for q in report["open"]] == [options]
    assert report["closed"] == [
        {"qid": plain, "state": "answered", "closed_at": bridge.wait_log("answered", plain)["at"]}
    ]
    assert bridge.ping()["agent_card"]["queue_depth"] == 1  # the daemon did not notice us


def test_status_of_a_project_with_no_bridge_and_no_state_names_those_there_are(
    bridge: Bridge,
) -> None:
    bridge.start()
    state_file(bridge.state_path("demo"), 0)
    done = bridge.run("status", "--project", "nosuch")
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", "coms-hermes-bridge: no bridge and no state for project nosuch "
        "(projects here: default, demo)\n")
    # a state file but no bridge: "not running", as ever
    done = bridge.run("status", "--project", "demo")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("bridge for project demo: not running\nopen questions: 1\n")


def test_status_shows_the_deliveries_that_failed_with_the_daemon_up_or_down(
    bridge: Bridge,
) -> None:  # X11's memory: newest first, the asker, hermes' exit status, its stderr's first line
    bridge.hermes.configure(exit=3, stderr="chat not found\nTraceback (most recent call last)\n")
    bridge.start()
    first = bridge.ask("Anyone?")
    bridge.wait_log("delivery_error", first)
    bridge.hermes.configure(exit=7, stderr="\n  flood control exceeded\n  retry in 5s\n")
    second = bridge.ask("Still there?", sender_name="ops-bot")
    bridge.wait_log("delivery_error", second)
    up = json.loads(bridge.verb("status", "--json", "--project", "default").stdout)
    assert [{key: row[key] for key in ("qid", "asker", "exit_status", "error")}
            for row in up["failed"]] == [
        {"qid": second, "asker": "ops-bot", "exit_status": 7, "error": "flood control exceeded"},
        {"qid": first, "asker": "builder", "exit_status": 3, "error": "chat not found"},
    ]
    now = datetime.now(UTC)
    assert all(now - timedelta(seconds=60) < datetime.fromisoformat(row["at"]) <= now
               for row in up["failed"])
    assert [list(row) for row in up["failed"]] == [
        ["qid", "at", "asker", "exit_status", "error"]] * 2
    assert up["open"] == [] and up["closed"] == []  # a failed delivery closes with no state
    assert bridge.signal() == 0
    down = bridge.run("status", "--project", "default")
    assert (down.returncode, down.stderr) == (0, "")
    lines = down.stdout.splitlines()
    assert lines[:4] == ["bridge for project default: not running", "open questions: 0",
                         "failed deliveries (last hour): 2",
                         "  QID                         ASKER             EXIT        WHEN  ERROR"]
    assert re.fullmatch(rf"  {second}  ops-bot {{10}}  {{3}}7  {{5}}\d+s ago  flood control "
                        "exceeded", lines[4]), lines[4]
    assert re.fullmatch(rf"  {first}  builder {{10}}  {{3}}3  {{5}}\d+s ago  chat not found",
                        lines[5]), lines[5]
    assert len(lines) == 6
    assert json.loads(bridge.verb("status", "--json", "--project", "default").stdout) == {
        **up, "bridge": None}


def test_status_without_a_daemon_or_state(bridge: Bridge) -> None:
    done = bridge.verb("status")
    assert done.returncode == 0
    assert done.stdout == "bridge for project default: not running\nopen questions: 0\n"
    assert not bridge.bridge_dir.exists()  # read-only: nothing created


def test_a_verb_is_the_commands_first_word(bridge: Bridge) -> None:
    # the other tests run the verbs in this process; here the command itself runs them
    done = bridge.run("status")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "bridge for project default: not running\nopen questions: 0\n", "")
    done = bridge.run("status", "--project", "default")  # named: no bridge, no state
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", "coms-hermes-bridge: no bridge and no state for project default "
        "(projects here: none)\n")
    done = bridge.run("statu", "--project", "default")  # a mistype is no daemon flag
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", "coms-hermes-bridge: unknown command 'statu'; did you mean status?\n")
    done = bridge.run("answer", "nope", "yes")
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", "coms-hermes-bridge: 'nope' is not a qid (26 characters, Crockford base32)\n")
    assert not bridge.coms.exists()  # a verb never starts a daemon


def test_answer_by_number_reaches_the_asker_as_the_option(bridge: Bridge) -> None:
    # C11: `answer <qid> 2` on an options question is a selection of the second
    bridge.start()
    qid = bridge.ask(OPTIONS_PROMPT)
    bridge.wait_log("delivered", qid)
    done = bridge.verb("answer", qid, "2", "--by", "telegram:alice")
    assert done.returncode == 0, done.stderr
    path = bridge.questions / f"{qid}.answer.json"
    assert done.stdout == f"answered {qid}: selects 'Revise'; wrote {path}\n"
    response = bridge.asker.response()
    assert (response["msg_id"], response["response"], response["error"]) == (
        qid, {"kind": "selection", "selections": ["Revise"]}, None,
    )
    record = bridge.wait_log("answered", qid)
    assert record["detail"] == {"answered_by": "telegram:alice"}
    wait_for(lambda: not path.exists(), what="answer file removed")
    assert not list(bridge.questions.iterdir())  # no temporary file left behind


def test_answer_file_is_a_valid_gateway_file_written_while_no_daemon_runs(bridge: Bridge) -> None:
    # C8: {qid, answer, answered_by, at}; several words are one answer; the next start reads it
    bridge.start()
    qid = bridge.ask("Which branch?")
    bridge.wait_log("delivered", qid)
    assert bridge.signal() == 0
    done = bridge.verb("answer", qid, "the", "release", "branch")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("(no bridge is running; the next one to start reads it)\n")
    body = json.loads((bridge.questions / f"{qid}.answer.json").read_text())
    assert set(body) == {"qid", "answer", "answered_by", "at"}
    assert body["qid"] == qid and body["answer"] == "the release branch"
    assert body["answered_by"].startswith("cli:") and body["at"].endswith("Z")
    assert (bridge.questions / f"{qid}.answer.json").stat().st_mode & 0o077 == 0
    bridge.start()
    response = bridge.asker.response()
    assert response["response"] == {"kind": "freeform", "text": "the release branch"}


def test_answer_refuses_unknown_closed_and_invalid_qids(bridge: Bridge) -> None:
    # non-zero and one line; nothing written
    bridge.start()
    qid = bridge.ask("Go?")
    bridge.wait_log("delivered", qid)
    unknown = new_qid()
    done = bridge.verb("answer", unknown, "yes")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (  # no --project: looked for in every project
        f"coms-hermes-bridge: no open question {unknown} in any project"
        f" (state files in {bridge.bridge_dir})\n"
    )
    done = bridge.verb("answer", unknown, "yes", "--project", "default")
    assert (done.returncode, done.stderr) == (1, (
        f"coms-hermes-bridge: no open question {unknown} in project default"
        f" (state file {bridge.state_path()})\n"))
    bridge.answer(qid, "yes")
    bridge.asker.response()
    bridge.wait_log("answered", qid)
    done = bridge.verb("answer", qid, "again")
    assert (done.returncode, done.stderr) == (
        1, f"coms-hermes-bridge: question {qid} is already closed (answered) in project default\n"
    )
    done = bridge.verb("answer", "nope", "x")
    assert (done.returncode, done.stderr.count("\n")) == (1, 1)
    assert "'nope' is not a qid" in done.stderr
    done = bridge.verb("answer", qid)  # a usage error: one line, one prefix
    assert (done.returncode, done.stderr) == (
        1, "coms-hermes-bridge: the following arguments are required: text\n")
    wait_for(lambda: not list(bridge.questions.iterdir()), what="questions dir empty")


def test_answer_or_by_that_is_not_utf8_is_one_line(bridge: Bridge) -> None:
    # X12: argv bytes that are not UTF-8 arrive as lone surrogates; refused in one line,
    # naming the argument, and nothing written
    bridge.start()
    qid = bridge.ask("Go?")
    bridge.wait_log("delivered", qid)
    bad = os.fsdecode(b"ok \xff")  # subprocess passes it back as the bytes b"ok \xff"
    done = bridge.verb("answer", qid, bad)
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", "coms-hermes-bridge: the answer is not valid Unicode (not UTF-8?)\n")
    done = bridge.verb("answer", qid, "yes", "--by", bad)
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", "coms-hermes-bridge: --by is not valid Unicode (not UTF-8?)\n")
    assert not list(bridge.questions.iterdir())


def test_cancel_tells_the_asker_and_the_human_it_was_the_operator(bridge: Bridge) -> None:
    # X15: the asker gets the error response, the human the operator's note, the log
    # the mark; an asker's own cancel after it is still C13's (a note, no response)
    bridge.start()
    qid = bridge.ask(OPTIONS_PROMPT)
    other = bridge.ask("Keep me open")
    bridge.wait_log("delivered", qid)
    bridge.wait_log("delivered", other)
    done = bridge.verb("cancel", qid)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"cancelled {qid} through user-remote (pid {bridge.entry['pid']})\n"
    record = bridge.wait_log("cancelled", qid)
    assert record["detail"] == {"by": "operator"}
    response = bridge.asker.response()
    assert response.pop("timestamp").endswith("Z")
    assert response == {
        "type": "response", "msg_id": qid, "sender_session": bridge.entry["session_id"],
        "sender_endpoint": bridge.entry["endpoint"], "hops": 0, "response": None,
        "error": "cancelled by the operator"}
    wait_for(lambda: len(bridge.hermes.calls()) == 3, what="cancel note")
    assert bridge.sent_texts()[2] == f"✖ [HUB-Q:{qid}] The question was cancelled by the operator."
    (report,) = json.loads(bridge.verb("status", "--json").stdout)["projects"]
    assert [q["qid"] for q in report["open"]] == [other]
    assert report["closed"][0]["qid"] == qid and report["closed"][0]["state"] == "cancelled"
    bridge.cancel(other)  # C13: the asker's own
    assert bridge.wait_log("cancelled", other)["detail"] == {"reason": "cancel envelope"}
    wait_for(lambda: len(bridge.hermes.calls()) == 4, what="the asker's cancel note")
    assert bridge.sent_texts()[3] == (
        f"✖ [HUB-Q:{other}] The question was cancelled — it was answered from the console.")
    bridge.no_response()
    assert [r["event"] for r in bridge.log_records()].count("cancelled") == 2
    # a second cancel: the question is closed now, one line, non-zero
    again = bridge.verb("cancel", qid)
    assert (again.returncode, again.stderr) == (
        1, f"coms-hermes-bridge: question {qid} is already closed (cancelled) in project default\n"
    )


def test_cancel_needs_a_running_bridge(bridge: Bridge) -> None:
    bridge.start()
    qid = bridge.ask("Anyone?")
    bridge.wait_log("delivered", qid)
    assert bridge.signal() == 0
    done = bridge.verb("cancel", qid)
    assert (done.returncode, done.stderr) == (
        1, "coms-hermes-bridge: no running bridge is registered for project default\n"
    )


def test_bad_project_is_one_line(bridge: Bridge) -> None:
    done = bridge.verb("status", "--project", "../x")
    assert (done.returncode, done.stderr) == (1, 'coms-hermes-bridge: invalid project name: "../x"\n')


def test_status_json_on_empty_state_file(bridge: Bridge, tmp_path: Path) -> None:
    # a state file that exists but holds no tables yet (created, never written)
    bridge.bridge_dir.mkdir(parents=True)
    bridge.state_path().write_bytes(b"")
    done = bridge.verb("status", "--json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["projects"]
    assert (report["project"], report["open"]) == ("default", [])


def test_the_verbs_find_the_project_without_being_told(bridge: Bridge) -> None:
    # `answer`, `cancel` and `status` with no --project, bridges on demo and ops
    second = Bridge(bridge.base)
    try:
        bridge.start("--project", "demo")
        second.start("--project", "ops")
        mine, theirs, third = bridge.ask(OPTIONS_PROMPT), second.ask("Ops?"), bridge.ask("Later?")
        for b, qid in ((bridge, mine), (second, theirs), (bridge, third)):
            b.wait_log("delivered", qid)
        table = bridge.verb("status")
        assert table.returncode == 0, table.stderr
        blocks = table.stdout.split("\n\n")
        assert [b.splitlines()[0].split(":")[0] for b in blocks] == [
            "bridge user-remote@demo", "bridge user-remote@ops"]
        assert "open questions: 2" in blocks[0] and mine in blocks[0] and third in blocks[0]
        assert "open questions: 1" in blocks[1] and theirs in blocks[1]
        report = json.loads(bridge.verb("status", "--json").stdout)
        assert [(p["project"], [q["qid"] for q in p["open"]]) for p in report["projects"]] == [
            ("demo", [mine, third]), ("ops", [theirs])]
        done = bridge.verb("answer", mine, "2")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"answered {mine}: selects 'Revise'; wrote ")
        env = bridge.asker.response()
        assert (env["msg_id"], env["response"]) == (mine, {"kind": "selection", "selections": ["Revise"]})
        done = bridge.verb("answer", theirs, "x")
        assert done.returncode == 0, done.stderr
        env = second.asker.response()
        assert (env["msg_id"], env["response"]) == (theirs, {"kind": "freeform", "text": "x"})
        done = bridge.verb("cancel", third)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"cancelled {third} through user-remote (pid {bridge.entry['pid']})\n"
        bridge.wait_log("cancelled", third)
    finally:
        second.kill()
        second.asker.close()


def test_one_unreadable_state_file_hides_no_other_project(bridge: Bridge) -> None:
    # the verbs without --project read every project's file: a damaged one is said, the
    # others still work (and a file whose name is no project is no project)
    bridge.start("--project", "demo")
    qid = bridge.ask("Still findable?")
    bridge.wait_log("delivered", qid)
    (bridge.bridge_dir / "state-aaa.sqlite3").write_bytes(b"not a database " * 100)
    (bridge.bridge_dir / "state-..sqlite3").write_bytes(b"")
    done = bridge.verb("answer", qid, "yes")
    assert done.returncode == 0, done.stderr
    assert bridge.asker.response()["response"] == {"kind": "freeform", "text": "yes"}
    table = bridge.verb("status")
    assert table.returncode == 1
    blocks = table.stdout.split("\n\n")
    assert blocks[0].startswith("bridge user-remote@demo: running")
    assert blocks[1].startswith("bridge for project aaa: cannot read its state: ")
    assert len(blocks) == 2
    missing = new_qid()
    done = bridge.verb("answer", missing, "x")
    assert done.returncode == 1
    assert f"no open question {missing} in any project" in done.stderr
    assert "could not read: cannot read state database" in done.stderr and "state-aaa" in done.stderr


def test_the_running_bridge_and_the_projects_come_from_live_bridge_entries(
    tmp_path: Path,
) -> None:  # W9 decides live; the model says which peers are bridges
    config = parse_config(["--project", "demo"], {"HOME": str(tmp_path),
                                                  "PI_COMS_DIR": str(tmp_path / "coms")})
    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    fresh, stale = iso(now), iso(now - timedelta(seconds=91))
    gone = 2**22 + 1  # above pid_max: no such process

    def register(project: str, name: str, model: str, heartbeat_at: str) -> RegistryEntry:
        entry = RegistryEntry(session_id=name, name=name, model=model, pid=gone,
                              endpoint=f"/tmp/{name}.sock", heartbeat_at=heartbeat_at)
        agents_dir(config.coms_dir, project).mkdir(parents=True, exist_ok=True)
        write_entry(agents_dir(config.coms_dir, project) / f"{name}.json", entry)
        return entry

    assert running_bridge(config, now) is None and projects(config, now) == []
    register("demo", "a-agent", "claude", fresh)  # live, but no bridge
    register("demo", "b-dead", MODEL, stale)  # a bridge, but dead
    assert running_bridge(config, now) is None
    other = register("demo", "c-other", MODEL, fresh)
    assert running_bridge(config, now) == other  # the only live bridge, whatever its name
    ours = register("demo", "user-remote", MODEL, fresh)
    assert running_bridge(config, now) == ours  # the one named --name comes first
    register("spare", "user-remote", MODEL, stale)
    register("zeta", "user-remote", MODEL, fresh)
    (config.coms_dir / "projects" / "empty").mkdir()
    (agents_dir(config.coms_dir, "junk")).mkdir(parents=True)
    (agents_dir(config.coms_dir, "junk") / "x.json").write_text("{not json")
    assert projects(config, now) == ["demo", "zeta"]


def test_status_json_is_byte_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # the --json object, its keys in this order, seconds to three places
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PI_COMS_DIR", str(tmp_path / "coms"))
    config = parse_config(["--project", "demo"], {"HOME": str(tmp_path),
                                                  "PI_COMS_DIR": str(tmp_path / "coms")})
    now = 1_800_000_000.0
    open_qid, closed_qid, stale, failed, timed_out = (new_qid() for _ in range(5))
    store = Store.open(config.state_path)
    prompts = {}
    for qid, text, asker in ((closed_qid, "Old?", "builder"), (open_qid, OPTIONS_PROMPT, "builder"),
                             (stale, "Gone?", "b"), (timed_out, "Slow?", "asker-Slow"),
                             (failed, "Lost?", "asker-Lost")):
        prompts[qid] = prompt = prompt_envelope(qid, text=text, sender_name=asker)
        deadline = now - 12.3456 + 1800
        store.put_open(QuestionSpec(qid, prompt, parse_prompt(prompt), 1_800_000, deadline,
                                    state="delivered"), owner="q")
    store.close(closed_qid, "answered", owner="q")
    # X11's memory: failed within the hour, newest first; one older is not shown
    closed_at = "2026-12-04T12:00:00.000Z"
    log = [{"at": closed_at, "qid": closed_qid, "event": "answered"}]
    for qid, error, at in (
        (stale, "hermes send failed (1): old", now - 3600.5),
        (timed_out, "hermes send failed: timed out after 60000ms", now - 3599.5),
        (failed, "hermes send failed (3): \n chat not found\nTraceback: …", now - 61.5),
    ):
        owed = SendResponse(prompts[qid], None, error, "q")
        store.close(qid, None, owner="q", response=owed, undelivered_at=at)
        log += [{"at": "T", "qid": qid, "event": "question_received",
                 "detail": {"from": prompts[qid].sender_name}},
                {"at": "T", "qid": qid, "event": "delivery_error", "detail": {"error": error}},
                {"at": "T", "qid": qid, "event": "delivery_error",  # a later note's: not its
                 "detail": {"error": "hermes send failed (9): a note"}}]
    store.shutdown()
    config.log_path.write_text("".join(json.dumps(record) + "\n" for record in log))
    heartbeat = iso(datetime.now(UTC))
    entry = RegistryEntry(session_id="s", name="user-remote", model=MODEL, pid=os.getpid(),
                          endpoint="/tmp/b.sock", started_at=closed_at, heartbeat_at=heartbeat)
    agents_dir(config.coms_dir, "demo").mkdir(parents=True)
    write_entry(agents_dir(config.coms_dir, "demo") / "user-remote.json", entry)
    monkeypatch.setattr(time, "time", lambda: now)

    assert main(["status", "--json", "--project", "demo"]) == 0
    assert capsys.readouterr().out == f"""\
{{
  "project": "demo",
  "state_path": "{config.state_path}",
  "bridge": {{
    "name": "user-remote",
    "pid": {os.getpid()},
    "endpoint": "/tmp/b.sock",
    "started_at": "{closed_at}",
    "heartbeat_at": "{heartbeat}"
  }},
  "open": [
    {{
      "qid": "{open_qid}",
      "asker": "builder",
      "state": "delivered",
      "age_s": 12.346,
      "time_left_s": 1787.654,
      "question": "Ship the release?",
      "options": [
        "Approve",
        "Revise",
        "Stop"
      ]
    }}
  ],
  "closed": [
    {{
      "qid": "{closed_qid}",
      "state": "answered",
      "closed_at": "{closed_at}"
    }}
  ],
  "failed": [
    {{
      "qid": "{failed}",
      "at": "2027-01-15T07:58:58.500Z",
      "asker": "asker-Lost",
      "exit_status": 3,
      "error": "chat not found"
    }},
    {{
      "qid": "{timed_out}",
      "at": "2027-01-15T07:00:00.500Z",
      "asker": "asker-Slow",
      "exit_status": null,
      "error": "timed out after 60000ms"
    }}
  ]
}}
"""


def test_status_of_one_project_its_closed_limit_and_its_questions_dir(bridge: Bridge) -> None:
    qids = state_file(bridge.bridge_dir / "state-default.sqlite3", 11)
    table = bridge.verb("status", "--project", "default")
    assert table.returncode == 0 and table.stdout.startswith(
        "bridge for project default: not running\nopen questions: 1\n  QID")
    assert "recently closed: 10\n" in table.stdout  # the ten newest unless told
    assert "recently closed: 1\n" in bridge.verb("status", "--project", "default",
                                                 "--closed", "1").stdout
    assert "recently closed" not in bridge.verb("status", "--project", "default",
                                                "--closed", "0").stdout
    report = json.loads(bridge.verb("status", "--json", "--closed", "2").stdout)
    assert [p["project"] for p in report["projects"]] == ["default"]
    assert [row["qid"] for row in report["projects"][0]["closed"]] == qids[:0:-1][:2]
    # a daemon run with --questions-dir keeps its state beside that directory
    elsewhere = bridge.base / "q"
    moved = state_file(elsewhere / "state-default.sqlite3", 0)
    done = bridge.verb("status", "--json", "--project", "default",
                       "--questions-dir", str(elsewhere / "questions"))
    assert [row["qid"] for row in json.loads(done.stdout)["open"]] == moved


def test_status_names_a_project_whose_state_cannot_be_read(bridge: Bridge) -> None:
    state_file(bridge.bridge_dir / "state-default.sqlite3", 0)
    (bridge.bridge_dir / "state-aaa.sqlite3").write_bytes(b"not a database " * 100)
    done = bridge.verb("status", "--json")
    assert done.returncode == 1
    projects = json.loads(done.stdout)["projects"]
    assert projects[0]["project"] == "default"
    assert list(projects[1]) == ["project", "error"] and projects[1]["project"] == "aaa"
    assert projects[1]["error"].startswith("cannot read state database ")


def test_status_json_of_every_project_and_answer_by_qid_alone_with_a_questions_dir(
    bridge: Bridge,
) -> None:
    bridge.bridge_dir.mkdir(parents=True)
    (bridge.bridge_dir / "state-aaa.sqlite3").write_bytes(b"not a database " * 100)
    done = bridge.verb("status")  # nothing readable: the damaged project alone is said
    assert done.returncode == 1
    assert done.stdout.startswith("bridge for project aaa: cannot read its state: ")
    assert "\n\n" not in done.stdout
    elsewhere = bridge.base / "q"
    (qid,) = state_file(elsewhere / "state-default.sqlite3", 0)
    done = bridge.verb("status", "--json", "--questions-dir", str(elsewhere / "questions"))
    assert done.stdout.startswith('{\n  "projects": [\n    {\n      "project": "default",\n')
    assert [row["qid"] for row in json.loads(done.stdout)["projects"][0]["open"]] == [qid]
    # the project found from the qid; the answer goes to the daemon's own directory
    done = bridge.verb("answer", qid, "héllo", "--questions-dir", str(elsewhere / "questions"))
    assert done.returncode == 0, done.stderr
    path = elsewhere / "questions" / f"{qid}.answer.json"
    assert done.stdout == (f'answered {qid}: freeform "héllo"; wrote {path} '
                           "(no bridge is running; the next one to start reads it)\n")


# -- the verbs' own rules, word for word, without a daemon --------------------------------


@pytest.fixture
def config(coms_dir: Path) -> BridgeConfig:
    env = {"HOME": str(coms_dir / "h"), "PI_COMS_DIR": str(coms_dir / "c")}
    return parse_config(["--project", "demo"], env)


def refusal(action: Callable[[], object]) -> str:
    with pytest.raises(OpsError) as refused:
        action()
    return str(refused.value)


def test_answer_refuses_in_one_line_each(config: BridgeConfig) -> None:  # C7, X12
    open_qid, closed_qid = state_file(config.state_path, closed=1)
    unknown = new_qid()
    assert refusal(lambda: answer(config, closed_qid, "Yes", "me")) == (
        f"question {closed_qid} is already closed (answered)")
    assert refusal(lambda: answer(config, unknown, "Yes", "me")) == (
        f"no open question {unknown} in project demo (state file {config.state_path})")
    assert refusal(lambda: answer(config, open_qid, " \n", "me")) == "the answer is empty"
    assert refusal(lambda: answer(config, open_qid, "y" * 16_001, "me")) == (
        "the answer is longer than 16000 characters")
    assert refusal(lambda: answer(config, open_qid, "Yes", " ")) == "--by must not be empty"
    assert refusal(lambda: answer(config, open_qid, "Yes\udc80", "me")) == (
        "the answer is not valid Unicode (not UTF-8?)")
    assert refusal(lambda: answer(config, open_qid, "Yes", "m\udc80")) == (
        "--by is not valid Unicode (not UTF-8?)")
    assert not config.questions_dir.exists()  # nothing written by a refusal


def test_answer_writes_at_the_longest_and_never_over_a_waiting_file(config: BridgeConfig) -> None:
    (qid,) = state_file(config.state_path, closed=0)
    config.questions_dir.mkdir(parents=True, mode=0o755)
    config.questions_dir.chmod(0o755)
    written = answer(config, qid, "y" * 16_000, "me")
    assert written.path == config.questions_dir / f"{qid}.answer.json"
    assert json.loads(written.path.read_bytes())["answer"] == "y" * 16_000
    assert config.questions_dir.stat().st_mode & 0o777 == 0o755  # the daemon's to tighten
    assert refusal(lambda: answer(config, qid, "No", "me")) == (
        f"an answer file for {qid} is already waiting: {written.path}")


def test_answer_says_why_it_cannot_write(config: BridgeConfig) -> None:
    (qid,) = state_file(config.state_path, closed=0)
    blocked = dataclasses.replace(config, questions_dir=config.state_path / "questions")
    assert refusal(lambda: answer(blocked, qid, "Yes", "me")) == (
        f"cannot write the answer file in {blocked.questions_dir}: "
        f"[Errno 20] Not a directory: '{blocked.questions_dir}'")


def test_cancel_refuses_in_one_line_each(config: BridgeConfig) -> None:  # C12, X2
    open_qid, closed_qid = state_file(config.state_path, closed=1)
    assert refusal(lambda: cancel(config, closed_qid)) == (
        f"question {closed_qid} is already closed (answered)")
    assert refusal(lambda: cancel(config, open_qid)) == (
        "no running bridge is registered for project demo")
    nameless = dataclasses.replace(config, state_path=config.state_path.with_name("other.db"))
    (anonymous,) = state_file(nameless.state_path, closed=0, asker="")
    assert refusal(lambda: cancel(nameless, anonymous)) == (
        f"question {anonymous} names no asker, so it cannot be cancelled as its asker")


@contextlib.contextmanager
def registered_bridge(config: BridgeConfig, **options: Any) -> Iterator[Asker]:
    """A socket registered as the project's live bridge; what it replies is `options`'."""
    config.coms_dir.mkdir(parents=True)
    bridge = Asker.beside(config.coms_dir, **options)
    register_bridge(config, bridge.endpoint)
    try:
        yield bridge
    finally:
        bridge.close()


@pytest.mark.parametrize(("reply", "why"), [
    (b'{"type":"nack","error":"not yours"}\n', "nack: not yours"), (None, "timed out")])
def test_a_cancel_the_bridge_does_not_take_is_said(
    config: BridgeConfig, monkeypatch: pytest.MonkeyPatch, reply: bytes | None, why: str,
) -> None:
    if reply is None:  # a silent bridge is waited for this long
        monkeypatch.setattr(ops, "CANCEL_TIMEOUT_S", 0.2)
    (qid,) = state_file(config.state_path, closed=0)
    with registered_bridge(config, reply=lambda line: reply) as bridge:
        assert refusal(lambda: cancel(config, qid)) == (
            f"the bridge at {bridge.endpoint} did not take the cancel: {why}")


def test_a_cancel_is_sent_in_the_askers_name_and_waits_for_the_close(
    config: BridgeConfig, monkeypatch: pytest.MonkeyPatch,
) -> None:  # C12, X2
    monkeypatch.setattr(ops, "CANCEL_TIMEOUT_S", 1.0)  # for the ack, and for the close
    (qid,) = state_file(config.state_path, closed=0)
    with registered_bridge(config) as bridge:  # acks, and leaves the question open
        assert refusal(lambda: cancel(config, qid)) == (
            f"the bridge acked the cancel, but {qid} is still open")
        sent = json.loads(bridge.lines[0])
        assert {key: sent[key] for key in ("type", "from", "to", "ref_msg_id", "by")} == {
            "type": "cancel", "from": "builder", "to": "user-remote", "ref_msg_id": qid,
            "by": "operator"}  # X15
        assert str(ULID.from_str(sent["msg_id"])) == sent["msg_id"]  # a fresh ULID (W3)
        store = Store.open(config.state_path)

        def closing(line: bytes) -> bytes:
            store.close(qid, "cancelled", owner="q")
            return b'{"type":"ack"}\n'

        bridge.reply = closing
        assert cancel(config, qid).endpoint == bridge.endpoint
        store.shutdown()


def test_a_cancel_overtaken_by_an_answer_says_so(
    config: BridgeConfig, monkeypatch: pytest.MonkeyPatch,
) -> None:  # X15: never "cancelled" for a question an answer closed first
    monkeypatch.setattr(ops, "CANCEL_TIMEOUT_S", 1.0)
    (qid,) = state_file(config.state_path, closed=0)
    store = Store.open(config.state_path)

    def answered_first(line: bytes) -> bytes:
        store.close(qid, "answered", owner="q")
        return b'{"type":"ack"}\n'

    try:
        with registered_bridge(config, reply=answered_first):
            assert refusal(lambda: cancel(config, qid)) == (
                f"{qid} closed as answered before the cancel reached it")
    finally:
        store.shutdown()


def test_status_reads_ages_states_and_closing_times(
    config: BridgeConfig, monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now)
    open_qid, *closed = state_file(config.state_path, closed=2)
    store = Store.open(config.state_path)
    early, late = new_qid(), new_qid()  # one starts 5 s from now, one ended 2 s ago
    for qid, deadline in ((early, now + 65), (late, now - 2)):
        prompt = prompt_envelope(qid, text="Hm?")
        store.put_open(QuestionSpec(qid, prompt, parse_prompt(prompt), 60_000, deadline),
                       owner="q")
    store.shutdown()
    tail = [
        b"\xff not UTF-8",
        b"not JSON",
        b"[1]",
        json.dumps({"at": "T1", "qid": closed[0], "event": "answered"}).encode(),
        json.dumps({"at": "T2", "event": "answered"}).encode(),  # no qid
        json.dumps({"at": "T3", "qid": closed[0], "event": "late_answer"}).encode(),
        json.dumps({"qid": closed[1], "event": "answered"}).encode(),  # no time
        json.dumps({"at": "T4", "qid": closed[1], "event": "cancelled"}).encode(),
        json.dumps({"at": 5, "qid": closed[1], "event": "timeout"}).encode(),
    ]
    config.log_path.parent.mkdir(parents=True, exist_ok=True)
    config.log_path.write_bytes(b"\n".join(tail) + b"\n")
    report = status(config, closed_limit=10)
    assert [(q["qid"], q["state"], q["age_s"], q["time_left_s"]) for q in report["open"]] == [
        (open_qid, "new", 0.0, 60.0), (early, "new", 0.0, 65.0), (late, "new", 62.0, 0.0)]
    assert report["closed"] == [
        {"qid": closed[1], "state": "answered", "closed_at": "T4"},
        {"qid": closed[0], "state": "answered", "closed_at": "T1"}]


def _failed_delivery(config: BridgeConfig, monkeypatch: pytest.MonkeyPatch) -> tuple[float, str]:
    """A state file whose one question failed delivery a second ago (X11), at a pinned now."""
    now = 1_800_000_000.0
    monkeypatch.setattr(time, "time", lambda: now)
    (qid,) = state_file(config.state_path, closed=0)
    store = Store.open(config.state_path)
    store.close(qid, None, owner="q", undelivered_at=now - 1)
    store.shutdown()
    return now, qid


def test_status_shows_a_failure_whose_log_lines_are_gone_and_skips_a_damaged_one(
    config: BridgeConfig, monkeypatch: pytest.MonkeyPatch,
) -> None:  # X11, X12: a row that does not read is left out, the others shown
    now, bare = _failed_delivery(config, monkeypatch)
    with contextlib.closing(sqlite3.connect(config.state_path)) as conn, conn:
        conn.execute("INSERT INTO undelivered VALUES (X'34', ?)", (now - 2,))
        conn.execute("INSERT INTO undelivered VALUES (CAST(X'ff' AS TEXT), ?)",
                     (now - 3,))  # not UTF-8
    assert status(config, closed_limit=0)["failed"] == [
        {"qid": bare, "at": "2027-01-15T07:59:59.000Z", "asker": None, "exit_status": None,
         "error": None}]


def test_a_failures_asker_and_error_are_its_own_records_only(
    config: BridgeConfig, monkeypatch: pytest.MonkeyPatch,
) -> None:  # X11: the asker its question_received names, the error its delivery_error says
    _, qid = _failed_delivery(config, monkeypatch)
    log = [{"at": "T", "qid": qid, "event": "question_received", "detail": {"from": "builder"}},
           {"at": "T", "qid": qid, "event": "late_answer", "detail": {"from": "telegram:bob"}},
           {"at": "T", "qid": qid, "event": "response_failed", "detail": {"error": "gone"}},
           {"at": "T", "qid": qid, "event": "delivery_error",
            "detail": {"error": "hermes send failed (3): chat not found"}}]
    config.log_path.parent.mkdir(parents=True, exist_ok=True)
    config.log_path.write_text("".join(json.dumps(record) + "\n" for record in log))
    assert status(config, closed_limit=0)["failed"] == [
        {"qid": qid, "at": "2027-01-15T07:59:59.000Z", "asker": "builder", "exit_status": 3,
         "error": "chat not found"}]


def test_status_reads_closing_times_from_the_logs_tail_only(config: BridgeConfig) -> None:
    _, old, recent = state_file(config.state_path, closed=2)
    first = json.dumps({"at": "T1", "qid": old, "event": "answered"}).encode() + b"\n"
    last = json.dumps({"at": "T2", "qid": recent, "event": "answered"}).encode() + b"\n"
    filler = b"x" * (LOG_TAIL_BYTES - len(last) - 1) + b"\n"  # the tail begins with `last`
    config.log_path.parent.mkdir(parents=True, exist_ok=True)
    config.log_path.write_bytes(first + last + filler)
    times = {c["qid"]: c["closed_at"] for c in status(config, 10)["closed"]}
    assert times == {old: None, recent: "T2"}  # `first` is older than the tail


def test_status_refuses_a_state_file_of_another_schema_in_one_line(bridge: Bridge) -> None:
    path = bridge.bridge_dir / "state-default.sqlite3"
    state_file(path, 0)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    done = bridge.verb("status", "--project", "default")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"coms-hermes-bridge: state file {path} has schema 5, this bridge reads "
        f"{SCHEMA_VERSION}; stop the bridge and move {path} (and its -wal, -shm) aside to"
        " start afresh\n")


def test_a_qid_is_looked_for_in_every_projects_state_file(config: BridgeConfig) -> None:
    (demo_qid,) = state_file(config.state_path, closed=0)
    assert project_of(config, demo_qid) == "demo"
    other = config.state_path.with_name("state-other.sqlite3")
    (gone,) = state_file(other, closed=0)
    store = Store.open(other)
    store.close(gone, None, owner="q", undelivered_at=time.time())  # X11
    store.shutdown()
    assert refusal(lambda: project_of(config, gone)) == (  # not "closed (undelivered)"
        f"no open question {gone} in any project (state files in {config.state_path.parent})")
    for name in ("state-bad1.sqlite3", "state-bad2.sqlite3"):
        config.state_path.with_name(name).write_bytes(b"garbage" * 100)
    unknown = new_qid()
    said = refusal(lambda: project_of(config, unknown))
    bad1, bad2 = (config.state_path.with_name(f"state-bad{n}.sqlite3") for n in (1, 2))
    assert said == (
        f"no open question {unknown} in any project (state files in {config.state_path.parent})"
        f"; could not read: cannot read state database {bad1}: file is not a database"
        f"; cannot read state database {bad2}: file is not a database")
