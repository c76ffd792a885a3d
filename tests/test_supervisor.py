"""The whole tree in-process: crash children with injected exceptions, watch them heal."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.bridge_process import request
from tests.fakes import wait_for
from tests.tree_rig import Boom, Tree, running_tree


@pytest.fixture
def tree() -> Iterator[Tree]:
    with running_tree() as running:
        yield running


def test_crashed_peer_is_restarted_on_the_same_endpoint(tree: Tree) -> None:
    tree.crash("peer")
    reply = wait_for(lambda: _ping(tree.endpoint), what="ping after restart")
    assert reply["type"] == "pong" and reply["agent_card"]["queue_depth"] == 0
    qid = tree.ask("still there?")
    tree.answer(qid, "yes")
    assert tree.asker.response()["response"] == {"kind": "freeform", "text": "yes"}


def _ping(endpoint: str) -> Any:
    try:
        return request(endpoint, {"type": "ping", "msg_id": "p"})
    except OSError:
        return None


@pytest.mark.parametrize("child", ["watcher", "delivery", "logger"])
def test_crashed_child_is_restarted_and_works(tree: Tree, child: str) -> None:
    tree.crash(child)
    qid = tree.ask("after the crash?")
    wait_for(lambda: len(tree.hermes.calls()) == 1, what="question delivered")
    tree.answer(qid, "1")
    assert tree.asker.response()["response"] == {"kind": "freeform", "text": "1"}
    assert tree.fatal == []


def test_crashed_question_is_restarted_and_still_answered(tree: Tree) -> None:
    qid = tree.ask("crash me?")
    wait_for(lambda: tree.state(qid) == "delivered", what="delivered")
    question = tree.router.open[qid]
    before = question.slot.ref
    question.slot.tell(Boom())
    wait_for(lambda: question.slot.ref is not before, what="question restarted")
    assert tree.state(qid) == "delivered"  # C19: resumed from its row
    tree.answer(qid, "survived")
    assert tree.asker.response()["response"] == {"kind": "freeform", "text": "survived"}
    # one question_received, no second hermes send
    assert len(tree.hermes.calls()) == 1
    assert tree.fatal == []


def test_a_crash_in_one_question_does_not_touch_another(tree: Tree) -> None:
    a, b = tree.ask("a?"), tree.ask("b?")
    wait_for(lambda: all(tree.state(q) == "delivered" for q in (a, b)), what="both delivered")
    crashed = tree.router.open[a].slot
    before = crashed.ref
    crashed.tell(Boom())
    tree.answer(b, "b answered")
    assert tree.asker.response()["response"] == {"kind": "freeform", "text": "b answered"}
    wait_for(lambda: b not in tree.router.open, what="b closed")
    # a was restarted in place and is still open and answerable
    wait_for(lambda: crashed.ref is not before, what="a restarted")
    assert tree.state(a) == "delivered"
    tree.answer(a, "a answered")
    assert tree.asker.response()["response"] == {"kind": "freeform", "text": "a answered"}


def test_restart_bound_exceeded_is_fatal(tree: Tree) -> None:
    # at most N restarts per child within T seconds; past that the daemon gives up
    for _ in range(3):
        tree.crash("logger")
    tree.tree.slots["logger"].tell(Boom())
    assert tree.fatal_event.wait(5)
    assert tree.fatal[0].startswith("logger crashed 4 times within 10s")


def test_deleted_questions_directory_heals(tree: Tree) -> None:
    # the watcher makes its directory again and watches it anew, without
    # failing: deleting it repeatedly must not become a crash loop
    qid = tree.ask("after the directory is gone?")
    wait_for(lambda: len(tree.hermes.calls()) == 1, what="question delivered")
    before = tree.child_ref("watcher")
    for _ in range(8):
        shutil.rmtree(tree.questions)
        wait_for(tree.questions.is_dir, what="directory back")
    assert tree.child_ref("watcher") is before
    assert tree.questions.stat().st_mode & 0o777 == 0o700
    tree.answer(qid, "still here")
    assert tree.asker.response()["response"] == {"kind": "freeform", "text": "still here"}
    assert tree.fatal == []


def test_open_question_survives_a_crash_of_the_router(tree: Tree) -> None:
    # C19: the router runs the questions, so they die with it; its successor rebuilds
    # the table from the store and starts each again from its row, under a new name
    qid = tree.ask("still open after the crash?")
    wait_for(lambda: tree.state(qid) == "delivered", what="delivered")
    before = tree.router.open[qid]
    old_question = before.slot.ref
    assert old_question is not None
    tree.crash("router")
    wait_for(lambda: tree.state(qid) == "delivered", what="question running again")
    assert tree.router.open[qid].child != before.child
    wait_for(lambda: not old_question.is_alive(), what="the old question stopped")
    tree.answer(qid, "yes")
    assert tree.asker.response()["response"] == {"kind": "freeform", "text": "yes"}
    assert len(tree.hermes.calls()) == 1  # delivered before: not sent again
    assert tree.fatal == []


def test_poison_question_is_closed_with_an_error_and_the_daemon_lives_on(tree: Tree) -> None:
    # a question that keeps crashing exhausts its own restarts (3 in 10 s),
    # not the root's; its asker hears why, and every other question carries on
    poison, other = tree.ask("poison?"), tree.ask("healthy?")
    wait_for(lambda: all(tree.state(q) == "delivered" for q in (poison, other)),
             what="both delivered")
    slot = tree.router.open[poison].slot
    for _ in range(3):
        before = slot.ref
        slot.tell(Boom())
        wait_for(lambda b=before: slot.ref not in (None, b), what="restarted")  # type: ignore[misc]
    slot.tell(Boom())
    env = tree.asker.response()
    assert env["msg_id"] == poison and env["response"] is None
    assert env["error"].startswith("bridge failed on this question: UnknownMessage: ")
    wait_for(lambda: poison not in tree.router.open, what="closed in the table")
    assert tree.store.load()[0] == [tree.store.open_spec(other, tree.router.open[other].child)]
    tree.answer(other, "fine")
    assert tree.asker.response()["response"] == {"kind": "freeform", "text": "fine"}
    assert tree.fatal == []
    assert tree.tree.root.is_alive()
