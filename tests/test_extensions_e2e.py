"""The extensions end to end: the real daemon, real sockets and inotify."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bridge_process import Bridge, new_qid
from tests.fakes import Asker, request, wait_for


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


@pytest.fixture
def other(bridge: Bridge) -> Iterator[Asker]:
    """A second agent in the pool, with its own endpoint."""
    b = Asker.beside(bridge.base)
    yield b
    b.close()


def questions_sent(bridge: Bridge) -> list[str]:
    return [t for t in bridge.sent_texts() if t.startswith("❓")]


def refused(qid: str) -> dict[str, Any]:
    return {"type": "nack", "msg_id": qid, "error": f"qid {qid} is already in use"}


# open qids are owned ----------------------------------------------


def test_replayed_qid_is_refused_and_the_answer_goes_to_its_asker(
    bridge: Bridge, other: Asker
) -> None:
    # X2: B replays A's open qid -> nacked, human asked once, A answered, B nothing
    bridge.start()
    qid = bridge.ask("Deploy to prod?")
    bridge.wait_log("delivered", qid)
    replay = other.prompt_envelope("Delete the backups?", qid, sender_name="agent-b")
    assert request(bridge.endpoint, replay) == refused(qid)
    record = bridge.wait_log("duplicate_refused", qid)
    assert record["detail"]["from"] == "agent-b"
    # the same text from another endpoint is not the asker either
    copy = other.prompt_envelope("Deploy to prod?", qid)
    assert request(bridge.endpoint, copy) == refused(qid)
    # delivery runs in arrival order: a second question would be sent before this one
    marker = bridge.ask("Next?")
    bridge.wait_log("delivered", marker)
    assert len(questions_sent(bridge)) == 2
    assert qid in questions_sent(bridge)[0] and marker in questions_sent(bridge)[1]
    bridge.answer(qid, "yes")
    env = bridge.asker.response()
    assert env["msg_id"] == qid and env["response"] == {"kind": "freeform", "text": "yes"}
    bridge.no_response(other)
    # once closed, the qid is not reusable either (its human may still be answering)
    bridge.wait_log("answered", qid)
    again = bridge.asker.prompt_envelope("Deploy again?", qid)
    assert request(bridge.endpoint, again) == refused(qid)
    assert bridge.wait_log(
        "duplicate_refused", qid, where=lambda r: r["detail"].get("reason") == "closed"
    )


def test_identical_resend_by_its_asker_is_acked_and_changes_nothing(bridge: Bridge) -> None:
    # X2: a client retrying after a lost ack
    bridge.start()
    envelope = bridge.asker.prompt_envelope("Ship it?")
    qid = envelope["msg_id"]
    assert request(bridge.endpoint, envelope) == {"type": "ack", "msg_id": qid}
    bridge.wait_log("delivered", qid)
    assert request(bridge.endpoint, envelope) == {"type": "ack", "msg_id": qid}
    marker = bridge.ask("Next?")
    bridge.wait_log("delivered", marker)
    assert len(questions_sent(bridge)) == 2  # the human was asked once
    assert bridge.ping()["agent_card"]["queue_depth"] == 2
    bridge.answer(qid, "ship")
    env = bridge.asker.response()
    assert env["msg_id"] == qid and env["response"] == {"kind": "freeform", "text": "ship"}
    bridge.wait_log("answered", qid)
    assert bridge.events(qid) == ["question_received", "delivered", "answered"]
    bridge.no_response()  # one response


# only the asker cancels --------------------------------------------


def test_cancel_from_another_sender_is_ignored_and_the_askers_own_works(bridge: Bridge) -> None:
    # X2, C12: acked, ignored, logged with the claimed sender
    bridge.start()
    qid = bridge.ask("Rotate the keys?")
    bridge.wait_log("delivered", qid)
    bridge.cancel(qid, sender="evil")  # asserts the ack (C12)
    assert bridge.wait_log("cancel_refused", qid)["detail"] == {"from": "evil"}
    assert bridge.ping()["agent_card"]["queue_depth"] == 1
    assert "cancelled" not in bridge.events(qid)
    bridge.answer(qid, "rotate")
    env = bridge.asker.response()
    assert env["msg_id"] == qid and env["response"] == {"kind": "freeform", "text": "rotate"}
    # the asker's own cancel still works (C13)
    mine = bridge.ask("Still needed?")
    bridge.wait_log("delivered", mine)
    bridge.cancel(mine)  # from "builder", the prompt's sender_name
    bridge.wait_log("cancelled", mine)
    wait_for(lambda: any(t.startswith(f"✖ [HUB-Q:{mine}]") for t in bridge.sent_texts()),
             what="cancel note")
    assert bridge.ping()["agent_card"]["queue_depth"] == 0
    bridge.no_response()


# only the bridge writes markers ----------------------------------

STRICT = re.compile(r"HUB-Q\s*:\s*([0-9A-HJKMNP-TV-Z]{26})")


@pytest.mark.parametrize(("answer", "selected"), [("1", 0), ("approve hub-q:{other}", 0), ("2", 1)])
def test_spoofed_markers_are_defused_and_options_still_map(
    bridge: Bridge, answer: str, selected: int
) -> None:
    # X3, C11
    bridge.start()
    victim = new_qid()
    titles = [f"Approve HUB-Q:{victim}", f"Reject [HUB-Q:{victim}]"]
    prompt = json.dumps({
        "question": f"Please confirm [HUB-Q:{victim}] now",
        "context": f"↩ Reply to this message, or type: hub-q : {victim}: <answer>",
        "options": [
            {"title": titles[0], "description": f"HUB-Q：{victim}"},
            {"title": titles[1]},
        ],
    })
    qid = bridge.ask(prompt, sender_name=f"HUB-Q:{victim}")
    bridge.wait_log("delivered", qid)
    text = questions_sent(bridge)[0]
    assert STRICT.findall(text) == [qid, qid]
    assert text.startswith(f"❓ [HUB-Q:{qid}] Please confirm [HUB-Ɋ:{victim}] now")
    assert f"↩ Reply to this message, or type: hub-ɋ : {victim}: <answer>" in text
    assert f"1. Approve HUB-Ɋ:{victim} — HUB-Ɋ：{victim}" in text
    assert f"2. Reject [HUB-Ɋ:{victim}]" in text
    bridge.answer(qid, answer.format(other=victim))
    env = bridge.asker.response()
    assert env["response"] == {"kind": "selection", "selections": [titles[selected]]}


# `at` and the project line ------------------------------------

AT_FORMS = [
    "Mon Nov 30 18:00:00 UTC 2026",
    "Mon, 30 Nov 2026 18:00:00 +0000",
    "2026-11-30 18:00:00",
]


def test_answers_stamped_as_the_real_writers_stamp_them_are_delivered(bridge: Bridge) -> None:
    # X4, C8
    bridge.start("--project", "shop")
    qids = [bridge.ask(f"Question {i}?") for i in range(len(AT_FORMS))]
    for qid in qids:
        bridge.wait_log("delivered", qid)
    for qid, at in zip(qids, AT_FORMS, strict=True):
        bridge.answer(qid, f"stamped {at}", at=at)
    got = {}
    for _ in qids:
        env = bridge.asker.response()
        got[env["msg_id"]] = env["response"]
    assert got == {
        qid: {"kind": "freeform", "text": f"stamped {at}"}
        for qid, at in zip(qids, AT_FORMS, strict=True)
    }
    assert not [r for r in bridge.log_records() if r["event"] == "answer_rejected"]
    # X4: the project line, right after the header
    assert questions_sent(bridge)[0] == (
        f"❓ [HUB-Q:{qids[0]}] Question 0?\n\n📁 Project: shop"
        f"\n\nContext: From builder @ /work/app"
        f"\n\n↩ Reply to this message, or type: HUB-Q:{qids[0]}: <answer>"
    )


# the asker's own timeout ---------------------------------------------


def test_reply_timeout_ms_is_the_questions_timeout(bridge: Bridge) -> None:
    # X5, C17: 400 ms asked for under the default 30 minutes
    bridge.start()
    patient = bridge.ask("No hurry?")
    quick = bridge.ask("Quick one?", reply_timeout_ms=400)
    env = bridge.asker.response()
    assert env["msg_id"] == quick
    assert env["response"] is None and env["error"] == "no remote answer within 400ms"
    assert bridge.wait_log("timeout", quick)["detail"] == {"timeout_ms": 400}
    wait_for(lambda: f"⌛ [HUB-Q:{quick}] The question timed out after 400ms."
             in bridge.sent_texts(), what="timeout note")
    # the other question keeps the default timeout (C17: 30 minutes), and no response
    with contextlib.closing(sqlite3.connect(f"file:{bridge.state_path()}?mode=ro", uri=True)) as db:
        [(timeout_ms, deadline)] = db.execute(
            "SELECT timeout_ms, deadline FROM open_questions WHERE qid = ?", (patient,)
        ).fetchall()
    assert timeout_ms == 1_800_000.0 and deadline > time.time() + 1_790  # its timer's time
    bridge.no_response()
    assert bridge.ping()["agent_card"]["queue_depth"] == 1
    assert "timeout" not in bridge.events(patient)


# several bridges, one wire ------------------------------------------


def open_qids(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return {row[0] for row in db.execute("SELECT qid FROM open_questions")}


def test_bridges_of_two_projects_keep_their_state_apart(bridge: Bridge) -> None:
    # a restart of one does not restore the other's questions
    second = Bridge(bridge.base)
    try:
        bridge.start("--project", "a")
        second.start("--project", "b")
        qa = bridge.ask("For a?")
        qb = second.ask("For b?")
        wait_for(lambda: qa in open_qids(bridge.state_path())
                 and qb in open_qids(second.state_path()), what="both stored")
        assert open_qids(bridge.state_path()) == {qa}
        assert open_qids(second.state_path()) == {qb}
        assert bridge.signal() == 0
        bridge.start("--project", "a")
        assert any("restored 1 open" in line for line in bridge.stderr_lines)
        assert bridge.ping()["agent_card"]["queue_depth"] == 1
        assert second.ping()["agent_card"]["queue_depth"] == 1
    finally:
        second.kill()  # the base directory is the first bridge's to remove
        second.asker.close()


def test_two_bridges_on_one_home_lose_no_answer(bridge: Bridge) -> None:
    # with X6: five questions each, all answered at once -> 10 of 10
    second = Bridge(bridge.base)
    try:
        bridge.start("--project", "a", "--poll-ms", "100")
        second.start("--project", "b", "--poll-ms", "100")
        qids = {b: [b.ask(f"{b.project} {i}?") for i in range(5)] for b in (bridge, second)}
        for b, mine in qids.items():
            for qid in mine:
                b.wait_log("delivered", qid)
        writers = [
            threading.Thread(target=b.answer, args=(qid, f"answer {qid}"))
            for b, mine in qids.items() for qid in mine
        ]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        for b, mine in qids.items():
            got = {b.asker.response(timeout=30)["msg_id"] for _ in mine}
            assert got == set(mine)
        assert not [r for r in bridge.log_records() if r["event"] == "answer_rejected"]
    finally:
        second.kill()  # the base directory is the first bridge's to remove
        second.asker.close()


def test_a_stray_answer_file_is_foreign_at_once(bridge: Bridge) -> None:
    # X6 as revised, C9: no bridge on this host knows the qid, so nothing waits for one
    bridge.start("--project", "demo")
    stray = new_qid()
    path = bridge.answer(stray, "hello?")
    record = bridge.wait_log("answer_rejected", stray, timeout=1.0)
    assert record["detail"] == {"reason": "foreign_qid", "file": f"{stray}.answer.json"}
    assert not path.exists()


@pytest.mark.slow
def test_a_stopped_siblings_answer_file_waits_for_it_however_long(bridge: Bridge) -> None:
    # X6 as revised: left for its owner while the owner is down (25 s, past any window),
    # and answered by the owner once it is back
    sibling = Bridge(bridge.base)
    try:
        bridge.start("--project", "a", "--poll-ms", "100")
        sibling.start("--project", "b", "--poll-ms", "100")
        qid = sibling.ask("For b?")
        sibling.wait_log("delivered", qid)
        assert sibling.signal() == 0
        path = sibling.answer(qid, "b's answer")
        down = time.monotonic()
        while time.monotonic() - down < 25:  # the live bridge rescans 250 times meanwhile
            assert path.exists(), "the live bridge took its sibling's answer file"
            time.sleep(0.5)
        assert "answer_rejected" not in bridge.events(qid)
        sibling.start("--project", "b", "--poll-ms", "100")
        env = sibling.asker.response()
        assert (env["msg_id"], env["response"]) == (qid, {"kind": "freeform", "text": "b's answer"})
        sibling.wait_log("answered", qid)
        assert [r["event"] for r in bridge.log_records() if r["qid"] == qid] == [
            "question_received", "delivered", "answered"]
    finally:
        sibling.kill()  # the base directory is the first bridge's to remove
        sibling.asker.close()


def test_agent_text_reaches_hermes_with_no_directive(bridge: Bridge) -> None:
    # X8: MEDIA: tags and [[...]] directives in question, context and options are defused;
    # the words stay, and the asker gets its own option title back
    bridge.start()
    bad = "MEDIA:/home/u/chart.png, Media: '/tmp/x.jpg' [[as_document]]"
    prompt = json.dumps({"question": f"Look at {bad}?", "context": f"ctx {bad}",
                         "options": [{"title": "MEDIA:/a.png", "description": bad}, "[[as_document]]"]})
    qid = bridge.ask(prompt)
    bridge.wait_log("delivered", qid)
    (text,) = questions_sent(bridge)
    assert not re.search(r"media:", text, re.IGNORECASE) and "[[" not in text and "]]" not in text
    counts = {"/home/u/chart.png": 3, "'/tmp/x.jpg'": 3, "as_document": 4, "/a.png": 1}
    assert {word: text.count(word) for word in counts} == counts  # every word is still there
    bridge.answer(qid, "1")
    env = bridge.asker.response()
    assert env["response"] == {"kind": "selection", "selections": ["MEDIA:/a.png"]}


def test_one_asker_is_held_to_its_share(bridge: Bridge, other: Asker) -> None:
    # X10: with --max-open-per-asker 2, the third prompt of one asker is nacked, nothing
    # stored; another asker's first is acked
    bridge.start("--max-open-per-asker", "2")
    first, second = bridge.ask("one?"), bridge.ask("two?")
    third = bridge.asker.prompt_envelope("three?")
    assert request(bridge.endpoint, third) == {
        "type": "nack", "msg_id": third["msg_id"],
        "error": "builder has 2 open questions; try again later"}
    theirs = other.prompt_envelope("mine?", sender_name="reviewer")
    assert request(bridge.endpoint, theirs) == {"type": "ack", "msg_id": theirs["msg_id"]}
    assert bridge.ping()["agent_card"]["queue_depth"] == 3
    assert open_qids(bridge.state_path()) == {first, second, theirs["msg_id"]}  # none stored


def owed_notes(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return int(db.execute("SELECT COUNT(*) FROM notes").fetchone()[0])


def reminders(bridge: Bridge) -> list[str]:
    return [t for t in bridge.sent_texts() if t.startswith("⏰")]


@pytest.mark.slow  # seconds of real time: in `just test-slow`
def test_one_reminder_before_the_deadline_and_none_for_an_answered_question(
    bridge: Bridge,
) -> None:
    # X9: --timeout 5000 --remind-before 3000: one ⏰ note about 2 s after asking
    bridge.start("--timeout", "5000", "--remind-before", "3000")
    answered = bridge.ask("Quick?")
    bridge.answer(answered, "yes")
    assert bridge.asker.response()["msg_id"] == answered
    asked = time.monotonic()
    waiting = bridge.ask("Still there?\nsecond line")
    wait_for(lambda: reminders(bridge), timeout=5, what="the reminder")
    assert time.monotonic() - asked >= 1.9  # not before deadline - 3 s
    # the answered question's reminder would have been due first: none came (X9)
    assert reminders(bridge) == [
        f"⏰ [HUB-Q:{waiting}] Still waiting for your answer, 3s left: Still there?"]
    assert bridge.wait_log("reminded", waiting)["detail"]["left_ms"] <= 3000
    bridge.answer(waiting, "here")  # a reply to the reminder carries the marker (W21)
    env = bridge.asker.response()
    assert (env["msg_id"], env["response"]) == (waiting, {"kind": "freeform", "text": "here"})
    assert "reminded" not in bridge.events(answered)


@pytest.mark.slow  # seconds of real time: in `just test-slow`
def test_an_owed_reminder_survives_a_kill(bridge: Bridge) -> None:
    # X9: decided and stored, hermes still running it, the daemon SIGKILLed: that run goes
    # on, and the restart takes its outcome (sent once, never twice); and a question whose
    # reminder was not due yet is reminded by the next run on time
    bridge.start("--timeout", "6000", "--remind-before", "3500")
    qid = bridge.ask("Who?")
    bridge.wait_log("delivered", qid)
    bridge.hermes.configure(sleep=2)  # the reminder's hermes is slow
    bridge.wait_log("reminded", qid, timeout=5)
    bridge.hermes.wait_started(2)
    bridge.kill()
    bridge.hermes.configure()
    bridge.start("--timeout", "6000", "--remind-before", "3500")
    wait_for(lambda: reminders(bridge), timeout=5, what="the owed reminder sent")
    assert reminders(bridge)[0].startswith(f"⏰ [HUB-Q:{qid}] Still waiting for your answer, ")
    wait_for(lambda: owed_notes(bridge.state_path()) == 0, what="the reminder settled")
    later = bridge.ask("And you?")
    bridge.kill()  # before its reminder is due
    bridge.start("--timeout", "6000", "--remind-before", "3500")
    wait_for(lambda: any(f"[HUB-Q:{later}]" in t for t in reminders(bridge)), timeout=6,
             what="the later question's reminder")
    assert [t for t in reminders(bridge) if qid in t] == reminders(bridge)[:1]  # once each
