"""The real daemon, end to end: real sockets, real inotify, a fake hermes on PATH."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bridge_process import ROOT, Bridge, new_qid
from tests.fakes import read_line, request, wait_for

QUESTION = "\n\n↩ Reply to this message, or type: HUB-Q:{qid}: <answer>"
IN_A_GROUP = "\n\n↩ Reply to this message, or type: @<bot name> HUB-Q:{qid}: <answer>"  # X14


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def expect_response(bridge: Bridge, qid: str, response: object, error: str | None) -> None:
    env = bridge.asker.response()
    ts = env.pop("timestamp")
    assert ts.endswith("Z") and len(ts) == 24
    assert env == {
        "type": "response",
        "msg_id": qid,
        "sender_session": bridge.entry["session_id"],
        "sender_endpoint": bridge.entry["endpoint"],
        "hops": 0,
        "response": response,
        "error": error,
    }


def test_plain_round_trip(bridge: Bridge) -> None:
    # C2, C4, C6, C7, C11, C20, W15, W20
    bridge.start()
    qid = bridge.ask("Deploy now?")
    bridge.wait_log("delivered", qid)
    assert bridge.hermes.argvs() == [[
        "send", "--to", "telegram",
        f"❓ [HUB-Q:{qid}] Deploy now?\n\n📁 Project: default"  # X4
        "\n\nContext: From builder @ /work/app" + QUESTION.format(qid=qid),
    ]]
    path = bridge.answer(qid, "  yes, ship it ")
    expect_response(bridge, qid, {"kind": "freeform", "text": "yes, ship it"}, None)
    wait_for(lambda: not path.exists(), what="answer file removed")
    bridge.wait_log("answered", qid)  # the log is written by its own actor, in parallel
    assert bridge.events(qid) == ["question_received", "delivered", "answered"]
    records = [r for r in bridge.log_records() if r["qid"] == qid]
    assert records[0]["detail"] == {"from": "builder"}
    assert records[1]["detail"] == {"to": "telegram"}
    assert records[2]["detail"] == {"answered_by": "telegram:alice"}
    # X16: every record names the project, after C20's fields in C20's order
    assert [list(r) for r in records] == [["at", "qid", "event", "detail", "project"]] * 3
    assert {r["project"] for r in bridge.log_records()} == {"default"}
    assert bridge.ping()["agent_card"]["queue_depth"] == 0


def test_an_answer_is_acted_on_from_its_inotify_event_with_the_rescan_an_hour_away(
        bridge: Bridge) -> None:
    # The promise "an answer is acted on from its file's inotify event, not from a poll"
    # (docs/operations.md): with the safety-net rescan an hour away, only the file's own
    # event can bring each answer, whether it is renamed in or written in place (C7, C10).
    bridge.start("--poll-ms", "3600000")
    renamed, written = bridge.ask("Deploy now?"), bridge.ask("Roll back?")
    bridge.wait_log("delivered", renamed)
    bridge.wait_log("delivered", written)
    bridge.answer(renamed, "yes")
    assert bridge.asker.response_for(renamed, timeout=5.0)["response"] == {
        "kind": "freeform", "text": "yes"}
    body = {"qid": written, "answer": "no", "answered_by": "telegram:alice",
            "at": "2026-11-30T12:01:00.000Z"}
    (bridge.questions / f"{written}.answer.json").write_text(json.dumps(body))
    assert bridge.asker.response_for(written, timeout=5.0)["response"] == {
        "kind": "freeform", "text": "no"}


@pytest.mark.parametrize(
    ("answer", "selected"), [("2", "Revise"), ("  approve ", "Approve"), ("STOP", "Stop")]
)
def test_json_prompt_with_options(bridge: Bridge, answer: str, selected: str) -> None:
    # C4, C6, C11, W19: the ask_user tool's JSON prompt, answered by number and by title;
    # to a group's topic, whose typed form names the bot (X14)
    bridge.start("--to", "telegram:-100123:7", "--hermes-profile", "ops")
    prompt = json.dumps({
        "question": "Ship the release?",
        "context": "CI is green.",
        "options": [{"title": "Approve", "description": "Ship it"}, {"title": "Revise"}, "Stop"],
    })
    qid = bridge.ask(prompt)
    bridge.wait_log("delivered", qid)
    assert bridge.hermes.argvs() == [[
        "--profile", "ops", "send", "--to", "telegram:-100123:7",
        f"❓ [HUB-Q:{qid}] Ship the release?\n\n📁 Project: default"  # X4
        "\n\nContext: CI is green.\n\nOptions:\n"
        "1. Approve — Ship it\n2. Revise\n3. Stop" + IN_A_GROUP.format(qid=qid),
    ]]
    bridge.answer(qid, answer)
    expect_response(bridge, qid, {"kind": "selection", "selections": [selected]}, None)


def test_cancel_then_late_answer(bridge: Bridge) -> None:
    # C12, C13, C15: acked, note sent, no response; the late file is removed and noted
    bridge.start()
    qid = bridge.ask("Are you there?")
    bridge.wait_log("delivered", qid)
    bridge.cancel(qid)
    record = bridge.wait_log("cancelled", qid)
    assert record["detail"] == {"reason": "cancel envelope"}
    wait_for(lambda: len(bridge.hermes.calls()) == 2, what="cancel note")
    assert bridge.sent_texts()[1] == (
        f"✖ [HUB-Q:{qid}] The question was cancelled — it was answered from the console."
    )
    assert bridge.ping()["agent_card"]["queue_depth"] == 0
    path = bridge.answer(qid, "yes")
    late = bridge.wait_log("late_answer", qid)
    assert late["detail"] == {"state": "cancelled"}
    wait_for(lambda: not path.exists(), what="late file removed")
    wait_for(lambda: len(bridge.hermes.calls()) == 3, what="late note")
    assert bridge.sent_texts()[2] == (
        f"ℹ [HUB-Q:{qid}] This question is already closed; the late answer was ignored."
    )
    bridge.no_response()
    assert bridge.events(qid) == ["question_received", "delivered", "cancelled", "late_answer"]


RACES = 150


def test_an_answer_racing_its_cancel_is_judged_at_once(bridge: Bridge) -> None:
    # C13, C15, C19: RACES times, an answer file lands and its question's cancel is sent
    # at the same moment (two threads, let go together), with the Watcher's safety net
    # (the re-offer) an hour away. Whichever the question took first decides; the other
    # is judged at once. A late answer gets its note, its file removed and its log line,
    # once each; the file that answered gets none of them. (Before the Router judged
    # what it had routed to a question that closed, 17 to 50 of the 150 races lost
    # their answer until the re-offer, from run to run.) hermes is a one-line shell script recording the texts
    # it is given, so the questions and up to twice as many notes go in a moment.
    texts = bridge.base / "texts"
    bridge.hermes.path.write_text(
        f'#!/bin/sh\nfor last; do :; done\nprintf "%s\\0" "$last" >> {shlex.quote(str(texts))}\n')

    def sent() -> list[str]:
        return [t.decode() for t in texts.read_bytes().split(b"\0")[:-1]] if texts.exists() else []

    bridge.start(COMS_HERMES_BRIDGE_REOFFER_MS="3600000")
    qids = [bridge.ask(f"race {n}?") for n in range(RACES)]
    # (each send starts a waiter process: about 20 ms a send, one at a time)
    wait_for(lambda: len(sent()) == RACES, 60, "every question delivered")
    together = threading.Barrier(2, timeout=5)

    def answer_each() -> None:
        for qid in qids:
            staged = bridge.base / f"{qid}.tmp"
            staged.write_bytes(json.dumps({"qid": qid, "answer": "yes",
                                           "answered_by": "telegram:alice",
                                           "at": "2026-11-30T12:01:00.000Z"}).encode())
            together.wait()
            os.rename(staged, bridge.questions / f"{qid}.answer.json")

    answering = threading.Thread(target=answer_each)
    answering.start()
    for qid in qids:
        line = json.dumps(bridge.cancel_envelope(qid)).encode() + b"\n"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(5)
            conn.connect(bridge.endpoint)
            together.wait()
            conn.sendall(line)
            assert json.loads(read_line(conn))["type"] == "ack"
    answering.join(5)
    events: dict[str, list[str]] = {}
    unjudged: list[str] = []

    def all_judged() -> bool:
        events.clear()
        for record in bridge.log_records():
            events.setdefault(record["qid"], []).append(record["event"])
        unjudged[:] = [qid for qid in qids
                       if events.get(qid, [])[-1:] not in (["answered"], ["late_answer"])]
        return not unjudged and not any(bridge.questions.iterdir())

    try:
        wait_for(all_judged, timeout=5)
    except AssertionError:
        left = sorted(path.name for path in bridge.questions.iterdir())
        raise AssertionError(f"within 5 s, {len(unjudged)} of {RACES} answers not judged, "
                             f"{len(left)} files left: {left[:3]}...") from None
    start = ["question_received", "delivered"]
    late = [qid for qid in qids if events[qid] == [*start, "cancelled", "late_answer"]]
    answered = [qid for qid in qids if events[qid] == [*start, "answered"]]
    assert len(late) + len(answered) == RACES, {qid: events[qid] for qid in qids}
    assert late, "no race ended in a late answer: nothing was tested"
    # every note decided by now is sent before a question asked now (Delivery keeps order)
    last = bridge.ask("the last?")
    wait_for(lambda: f"[HUB-Q:{last}]" in "".join(sent()[-1:]), 60, "the last question sent")
    assert sorted(sent()[RACES:-1]) == sorted(
        [f"✖ [HUB-Q:{qid}] The question was cancelled — it was answered from the console."
         for qid in late]
        + [f"ℹ [HUB-Q:{qid}] This question is already closed; the late answer was ignored."
           for qid in late])
    # each answered asker got its response; a cancelled one none (C13)
    wait_for(lambda: bridge.owed() == 0, timeout=15, what="every response acked")
    assert sorted(bridge.asker.arrivals) == sorted(answered)


def test_cancel_of_unknown_or_invalid_qid_is_only_acked(bridge: Bridge) -> None:
    # C14
    bridge.start()
    open_qid = bridge.ask("Still open?")
    bridge.wait_log("delivered", open_qid)
    unknown = new_qid()
    bridge.cancel(unknown)
    bridge.cancel("not-a-qid")
    # then a real cancel: once it is handled, the two before it were handled too
    bridge.cancel(open_qid)
    bridge.wait_log("cancelled", open_qid)
    assert {r["qid"] for r in bridge.log_records()} == {open_qid}
    wait_for(lambda: len(bridge.hermes.calls()) == 2, what="the one cancel note")
    assert "[HUB-Q:" + open_qid + "]" in bridge.sent_texts()[1]
    assert bridge.ping()["agent_card"]["queue_depth"] == 0


def test_delivery_failure(bridge: Bridge) -> None:
    # C18: dropped, logged, error response at once with exit code and stderr
    bridge.hermes.configure(exit=3, stderr="chat not found\n")
    bridge.start()
    qid = bridge.ask("Anyone?")
    expect_response(bridge, qid, None, "hermes send failed (3): chat not found")
    record = bridge.wait_log("delivery_error", qid)
    assert record["detail"] == {"error": "hermes send failed (3): chat not found"}
    assert bridge.ping()["agent_card"]["queue_depth"] == 0
    # state back to none: a later file for it is foreign, not late (C19), and since
    # hermes may have failed after Telegram took it, the human is told (X11)
    bridge.hermes.configure(exit=0, stderr="")
    path = bridge.answer(qid, "yes")
    rejected = bridge.wait_log("answer_rejected", qid)
    assert rejected["detail"] == {"reason": "foreign_qid", "file": f"{qid}.answer.json",
                                  "delivery_failed": True}
    wait_for(lambda: not path.exists(), what="the file removed")
    wait_for(lambda: len(bridge.hermes.calls()) == 2, what="the X11 note")
    assert bridge.sent_texts()[1] == (
        f"ℹ [HUB-Q:{qid}] This question could not be confirmed delivered; its asker was told "
        "it failed, so this answer was not passed on."
    )
    assert "late_answer" not in bridge.events(qid)


def test_invalid_qid_prompt_never_reaches_telegram(bridge: Bridge) -> None:
    # C3
    bridge.start()
    bridge.ask("hello", qid="not-a-ulid")
    expect_response(bridge, "not-a-ulid", None, "prompt msg_id must be a 26-character Crockford ULID qid")
    assert bridge.hermes.calls() == []


@pytest.mark.parametrize("how", ["flag", "env"])
def test_timeout(bridge: Bridge, how: str) -> None:
    # C16, C17
    if how == "flag":
        bridge.start("--timeout", "400", PI_COMS_TIMEOUT_MS="999999")
    else:
        bridge.start(PI_COMS_TIMEOUT_MS="400")
    qid = bridge.ask("Quick one?")
    expect_response(bridge, qid, None, "no remote answer within 400ms")
    assert bridge.wait_log("timeout", qid)["detail"] == {"timeout_ms": 400}
    wait_for(lambda: len(bridge.hermes.calls()) == 2, what="timeout note")
    assert bridge.sent_texts()[1] == f"⌛ [HUB-Q:{qid}] The question timed out after 400ms."
    bridge.answer(qid, "too late")
    assert bridge.wait_log("late_answer", qid)["detail"] == {"state": "timeout"}


def test_every_rejection_reason(bridge: Bridge) -> None:
    # C9, C10, C20: logged as answer_rejected with reason and file, and removed
    # (a foreign file at once: no bridge on this host knows its qid, X6)
    bridge.start("--poll-ms", "100")
    qid = bridge.ask("Which?")
    bridge.wait_log("delivered", qid)
    foreign = new_qid()
    body = {"qid": qid, "answer": "x", "answered_by": "telegram:a", "at": "2026-11-30T12:00:00Z"}
    cases = {
        "invalid_path": (f"{qid}.json", json.dumps(body).encode()),
        "invalid_qid": ("nope.answer.json", json.dumps(body).encode()),
        "foreign_qid": (f"{foreign}.answer.json", b"not even json"),
        "invalid_schema": (f"{qid}.answer.json", json.dumps({**body, "at": "whenever"}).encode()),
    }
    for reason, (name, content) in cases.items():
        path = bridge.drop(name, content)
        record = bridge.wait_log("answer_rejected", where=lambda r, n=name: r["detail"]["file"] == n)
        assert record["detail"] == {"reason": reason, "file": name}
        wait_for(lambda p=path: not p.exists(), what=f"{reason} file removed")
    path = bridge.drop(f"{qid}.answer.json", json.dumps({**body, "qid": foreign}).encode())
    record = bridge.wait_log("answer_rejected", where=lambda r: r["detail"]["reason"] == "qid_mismatch")
    assert record["qid"] == qid and record["detail"]["file"] == f"{qid}.answer.json"
    wait_for(lambda: not path.exists(), what="mismatch file removed")
    # invalid_json waits out the grace window (max(2 x 100 ms, 1 s)) before it goes
    path = bridge.drop(f"{qid}.answer.json", b'{"qid": "' + qid.encode())
    seen = time.monotonic()
    record = bridge.wait_log("answer_rejected", where=lambda r: r["detail"]["reason"] == "invalid_json")
    assert time.monotonic() - seen >= 0.9
    wait_for(lambda: not path.exists(), what="invalid json file removed")
    # the question is still open and still answerable
    assert bridge.ping()["agent_card"]["queue_depth"] == 1
    bridge.answer(qid, "fine")
    expect_response(bridge, qid, {"kind": "freeform", "text": "fine"}, None)


def test_partial_write_is_accepted(bridge: Bridge) -> None:
    # C10, W21: the gateway may write in more than one step
    bridge.start()
    qid = bridge.ask("Partial?")
    bridge.wait_log("delivered", qid)
    bridge.questions.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"qid": qid, "answer": "two steps", "answered_by": "telegram:a",
                       "at": "2026-11-30T12:00:00Z"})
    target = bridge.questions / f"{qid}.answer.json"
    with open(target, "w") as f:
        f.write(text[:20])
    time.sleep(0.3)  # the pause between the gateway's two writes is the scenario itself
    with open(target, "a") as f:
        f.write(text[20:])
    expect_response(bridge, qid, {"kind": "freeform", "text": "two steps"}, None)
    bridge.wait_log("answered", qid)
    assert "answer_rejected" not in bridge.events(qid)


def test_queue_depth_and_burst(bridge: Bridge) -> None:
    # C21, W17: five pending; four-plus prompts acked at once, hermes runs never overlap
    bridge.hermes.configure(sleep=0.2)
    bridge.start()
    started = time.monotonic()
    qids = [bridge.ask(f"Question {i}?") for i in range(5)]
    assert time.monotonic() - started < 0.5  # acks never wait on hermes
    pong = bridge.ping()
    assert pong == {
        "type": "pong",
        "msg_id": "p1",
        "agent_card": {
            "name": "user-remote",
            "purpose": "Remote human via Hermes/Telegram",
            "model": "hermes-bridge",
            "color": "#38BDF8",
            "context_used_pct": 0,
            "queue_depth": 5,
        },
    }
    wait_for(lambda: len(bridge.hermes.calls()) == 5, timeout=10, what="five sends")
    calls = bridge.hermes.calls()
    for before, after in itertools.pairwise(calls):
        assert before["end"] <= after["start"]
    assert [c["argv"][-1].split("]")[0] for c in calls] == [f"❓ [HUB-Q:{q}" for q in qids]
    # three threads whatever is open or was sent: main, the loop, the root supervisor
    assert bridge.proc is not None
    status = Path(f"/proc/{bridge.proc.pid}/status").read_text()
    assert "Threads:\t3\n" in status, status


def test_sigterm_cleans_up(bridge: Bridge) -> None:
    # W8: exit 0 within 2 s even with questions pending
    bridge.start()
    bridge.ask("Pending?")
    endpoint = Path(bridge.endpoint)
    assert endpoint.exists()
    started = time.monotonic()
    assert bridge.signal(signal.SIGTERM) == 0
    assert time.monotonic() - started < 2.0
    assert not endpoint.exists()
    assert not bridge.entry_path().exists()


def test_sigint_cleans_up(bridge: Bridge) -> None:
    # W8
    bridge.start()
    assert bridge.signal(signal.SIGINT) == 0
    assert not bridge.entry_path().exists()


def test_registry_entry(bridge: Bridge) -> None:
    # W3, W5, W7
    bridge.start("--name", "remote-a", "--project", "team.x", wait=False)
    path = bridge.coms / "projects" / "team.x" / "agents" / "remote-a.json"
    wait_for(path.exists, timeout=15, what="entry")
    entry = json.loads(path.read_text())
    assert list(entry) == [
        "session_id", "name", "purpose", "model", "color", "pid", "endpoint", "cwd",
        "started_at", "explicit", "version", "context_used_pct", "queue_depth", "heartbeat_at",
    ]
    assert entry["name"] == "remote-a" and entry["model"] == "hermes-bridge"
    assert entry["endpoint"] == str(bridge.coms / "sockets" / f"{entry['session_id']}.sock")
    assert entry["pid"] == bridge.proc.pid if bridge.proc else False
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(entry["endpoint"])  # ready means listening


def test_wire_errors_against_the_daemon(bridge: Bridge) -> None:
    # W13
    bridge.start()
    assert request(bridge.endpoint, b"{nope\n") == {"type": "nack", "msg_id": "", "error": "invalid json"}
    assert request(bridge.endpoint, {"type": "response", "msg_id": "m"}) == {
        "type": "nack", "msg_id": "m", "error": "bridge accepts prompts, cancels, and pings",
    }
    # X17: JSON.parse reads 1e400 as Infinity, a number: the line is JSON, the field is named
    prompt = bridge.asker.prompt_envelope("Ship?")
    line = json.dumps({**prompt, "hops": "@"}).replace('"@"', "1e400") + "\n"
    assert request(bridge.endpoint, line.encode()) == {
        "type": "nack", "msg_id": prompt["msg_id"],
        "error": "invalid prompt envelope: hops is not a finite number",
    }
    assert bridge.ping()["agent_card"]["queue_depth"] == 0  # nothing stored, still serving


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "a", "--to", "b"], "--to may only be specified once"),
        (["--to", "telegram:"], "--to 'telegram:' has nothing after the colon: give the chat, "
         "or telegram alone for hermes' home channel"),
        (["--timeout", "abc"], "--timeout must be a positive number"),
        (["--timeout", "0"], "--timeout must be a positive number"),
        (["--poll-ms", "-1"], "--poll-ms must be a positive number"),
        (["--poll-ms", "1e-9"], "--poll-ms must be at least 10 (ms between rescans)"),
        (["--send-timeout", "x"], "--send-timeout must be a positive number"),
        (["--hermes-profile", "../evil"], "--hermes-profile must be a safe profile name: '../evil'"),
        (["--name", "bad name"], 'invalid name: "bad name"'),
        (["--project", "a/b"], 'invalid project name: "a/b"'),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--timeout"], "argument --timeout: expected one argument"),
    ],
)
def test_bad_flags(bridge: Bridge, args: list[str], message: str) -> None:
    # a bad value: one line, exit 1, nothing registered
    done = bridge.run(*args)
    assert done.returncode == 1
    assert done.stderr == f"coms-hermes-bridge: {message}\n"
    agents = bridge.coms / "projects"
    assert not any(agents.rglob("*.json")) if agents.exists() else True


def test_a_questions_dir_whose_parent_is_missing_is_a_bad_flag(bridge: Bridge) -> None:
    wanted = bridge.base / "typo" / "questions"
    done = bridge.run("--questions-dir", str(wanted))
    assert (done.returncode, done.stderr) == (1, f"coms-hermes-bridge: --questions-dir {wanted}: "
                                              f"its parent {wanted.parent} is not a directory\n")
    assert not wanted.parent.exists() and not bridge.coms.exists()  # nothing made


def test_start_warns_of_another_platform_and_a_reminder_never_due(bridge: Bridge) -> None:
    # still starts: a Telegram-less target can be answered by hand, a prompt may ask longer (X5)
    bridge.start("--to", "whatsapp:+15551234567", "--remind-before", "1800000")
    assert bridge.signal() == 0
    assert bridge.stderr_lines[:3] == [
        "coms-hermes-bridge: warning: --to whatsapp:+15551234567: answers come back only from "
        "Telegram (the liaison listens there alone); answer other questions with "
        "`coms-hermes-bridge answer`",
        "coms-hermes-bridge: warning: --remind-before 1800000 ms is not below the timeout, "
        "1800000 ms: only a question that asks for a longer timeout of its own gets a reminder",
        "coms-hermes-bridge: info: starting as peer user-remote in coms project default (agents "
        "must use this project to ask), hermes target whatsapp:+15551234567"]


def test_a_home_set_but_empty_stops_the_daemon_and_every_verb(bridge: Bridge) -> None:
    # W4: HOME="" once meant `/` (as root, the bridge wrote /.pi/...): one line, exit 1
    said = "coms-hermes-bridge: HOME is set but empty: set it to your home directory, or unset it\n"
    done = bridge.run(HOME="")
    assert (done.returncode, done.stdout, done.stderr) == (1, "", said)
    qid = new_qid()
    for verb in (["status"], ["doctor"], ["answer", qid, "yes"], ["cancel", qid]):
        done = bridge.verb(*verb, HOME="")
        assert (done.returncode, done.stdout, done.stderr) == (1, "", said), verb
    assert not bridge.coms.exists()


def test_help_and_version(bridge: Bridge) -> None:
    done = bridge.run("--help")
    assert done.returncode == 0 and "--questions-dir" in done.stdout and "--send-timeout" in done.stdout
    done = bridge.run("--version")
    assert done.returncode == 0 and done.stdout.startswith("coms-hermes-bridge ")
    # the same command straight from a checkout
    script = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "coms-hermes-bridge"), "--version"],
        capture_output=True, text=True, timeout=20, check=False,
    )
    assert script.returncode == 0 and script.stdout == done.stdout


def test_questions_dir_flag_moves_the_log_beside_it(bridge: Bridge) -> None:
    # C20: the log lives beside the questions directory
    qdir = bridge.base / "q" / "answers"
    qdir.parent.mkdir()  # (the directory itself is made, never its parents)
    bridge.start("--questions-dir", str(qdir))
    qid = bridge.ask("Where?")
    log = qdir.parent / "log.ndjson"
    wait_for(lambda: log.exists() and "delivered" in log.read_text(), what="log beside dir")
    (qdir / f"{qid}.answer.json").write_text(json.dumps(
        {"qid": qid, "answer": "here", "answered_by": "telegram:a", "at": "2026-11-30T12:00:00Z"}))
    expect_response(bridge, qid, {"kind": "freeform", "text": "here"}, None)
    assert os.path.isdir(qdir)


def test_exceeding_the_restart_bound_exits_1_and_unregisters(bridge: Bridge) -> None:
    # supervision: a part that keeps crashing (here: its directory cannot exist)
    # makes the daemon give up with exit 1, leaving nothing registered (W8)
    blocker = bridge.base / "questions"
    blocker.write_text("a file where the questions directory should be")
    bridge.start("--questions-dir", str(blocker), wait=False)
    assert bridge.proc is not None
    assert bridge.proc.wait(timeout=15) == 1
    wait_for(
        lambda: any("watcher crashed 6 times within 10s" in line for line in bridge.stderr_lines),
        what="the reason on stderr",
    )
    assert not any(bridge.coms.rglob("*.json"))
    assert not any((bridge.coms / "sockets").glob("*.sock"))
