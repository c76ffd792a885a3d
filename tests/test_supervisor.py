"""The whole tree in-process: crash children with injected exceptions, watch them heal."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pykka
import pytest

from coms_hermes_bridge.actors import supervisor
from coms_hermes_bridge.actors.config import HEARTBEAT_ENV
from coms_hermes_bridge.actors.supervision import Slot
from coms_hermes_bridge.messages.commands import QueueDepthQuery
from tests.fakes import request, wait_for
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


def test_the_watcher_offers_again_after_the_span_the_environment_sets() -> None:
    # a test's way to see that no answer is rescued by the 30 s safety net
    with running_tree(env={"COMS_HERMES_BRIDGE_REOFFER_MS": "3600000"}) as running:
        assert running.child_ref("watcher")._actor_weakref().reoffer_s == 3600
    with running_tree() as running:
        assert running.child_ref("watcher")._actor_weakref().reoffer_s == 30


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


def test_the_open_count_is_the_routers_and_none_while_it_restarts(tree: Tree) -> None:
    # C21: the watchdog's proof of life is the Router's own count
    assert tree.tree.queue_depth() == 0
    tree.ask("counted?")
    assert tree.tree.queue_depth() == 1
    restarting = supervisor.Tree(tree.tree.root, {"router": Slot("router")})
    with pytest.raises(TimeoutError, match=r"^the router is restarting$"):
        restarting.queue_depth()


def test_a_router_that_does_not_answer_the_count_in_time_is_a_timeout() -> None:
    class Silent:
        alive = True

        def __init__(self) -> None:
            self.told: list[Any] = []

        def tell(self, message: Any) -> None:
            self.told.append(message)

    silent = Silent()
    mute = supervisor.Tree(None, {"router": silent})  # type: ignore[arg-type, dict-item]
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        mute.queue_depth(0.05)
    assert time.monotonic() - started < 5
    assert [type(m) for m in silent.told] == [QueueDepthQuery]


def test_by_default_the_sixth_crash_within_ten_seconds_ends_the_daemon() -> None:
    # the root's intensity, as the daemon starts it: 5 restarts in 10 s, the 6th is fatal
    with running_tree(options={}) as tree:
        for _ in range(5):
            tree.crash("logger")
        assert tree.fatal == []
        tree.tree.slots["logger"].tell(Boom())
        assert tree.fatal_event.wait(10)
        assert tree.fatal[0].startswith("logger crashed 6 times within 10s; last error: ")


def test_the_tree_runs_on_the_clocks_and_under_the_run_tag_it_is_given() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    ahead = time.time() + 3600  # an hour ahead: the deadline follows the injected clock
    with running_tree(options={"now": lambda: at, "clock": lambda: ahead}) as tree:
        qid = tree.ask("whose clock?")
        question = tree.router.open[qid]
        # the question's name carries the daemon's run tag (the owner guard across runs)
        assert question.child == f"question:{qid}:{tree.session_id[-8:]}.0.1"
        spec = tree.store.open_spec(qid, question.child)
        assert spec is not None and spec.deadline == ahead + spec.timeout_ms / 1000
        wait_for(lambda: any(r["event"] == "question_received" for r in tree.log_records()),
                 what="question_received logged")
        assert tree.log_records()[0]["at"] == "2026-01-02T03:04:05.000Z"


def test_each_actor_is_given_its_own_collaborators_and_the_trees_clock() -> None:
    # the design's wiring: no bag; start_tree hands each actor the addresses, store and
    # clock it uses, and the Peer its heartbeat from the environment (W6)
    def at() -> datetime:
        return datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    with running_tree(options={"now": at}, env={HEARTBEAT_ENV: "2500"}) as tree:
        slots = tree.tree.slots
        actor = {name: tree.child_ref(name)._actor_weakref() for name in slots}
        delivery, router, watcher, peer = (actor[n] for n in ("delivery", "router", "watcher",
                                                                "peer"))
        assert (delivery.router, delivery.logger, delivery.now) == (
            slots["router"], slots["logger"], at)
        assert delivery.store is tree.store and router.store is tree.store
        assert (router.router, router.peer, router.delivery, router.watcher, router.logger,
                router.now) == (slots["router"], slots["peer"], slots["delivery"],
                                slots["watcher"], slots["logger"], at)
        assert (watcher.router, watcher.delivery, watcher.logger, watcher.now) == (
            slots["router"], slots["delivery"], slots["logger"], at)
        assert (peer.router, peer.logger, peer.now, peer.heartbeat_s) == (
            slots["router"], slots["logger"], at, 2.5)
        assert peer.store is tree.store


def test_the_roots_stop_returns_once_every_child_has_stopped(tree: Tree) -> None:
    refs = [slot.ref for slot in tree.tree.slots.values()]
    assert all(ref is not None and ref.is_alive() for ref in refs)
    tree.tree.root.stop()
    assert [ref.is_alive() for ref in refs if ref is not None] == [False] * len(refs)
    assert pykka.ActorRegistry.get_by_class(supervisor.RootSupervisor) == []


class Monotonic:
    """The supervisors' clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _crash_question(tree: Tree, qid: str) -> None:
    """Crash the question's actor; return once it is running again or gone for good."""
    question = tree.router.open[qid]
    before = question.slot.ref
    question.slot.tell(Boom())
    wait_for(lambda: tree.router.open.get(qid) is None or question.slot.ref not in (None, before),
             what="the question restarted or given up")


@pytest.mark.parametrize(("window_s", "poison"), [(100, True), (10, False)])
def test_the_questions_restart_bound_window_and_clock_are_the_trees(
    window_s: float, poison: bool
) -> None:
    # a second crash 20 s (on the tree's clock) after the first: within a 100 s window the
    # question is poison (one restart allowed), past a 10 s one it is restarted again
    clock = Monotonic()
    options = {"question_restarts": 1, "window_s": window_s, "monotonic": clock}
    with running_tree(options=options) as tree:
        qid = tree.ask("crash twice?")
        wait_for(lambda: tree.state(qid) == "delivered", what="delivered")
        _crash_question(tree, qid)
        assert tree.state(qid) == "delivered"
        clock.now += 20
        _crash_question(tree, qid)
        if poison:
            assert tree.asker.response_for(qid)["error"].startswith(
                "bridge failed on this question: ")
        else:
            assert tree.state(qid) == "delivered"
            tree.answer(qid, "still here")
            assert tree.asker.response_for(qid)["response"] == {"kind": "freeform",
                                                                "text": "still here"}


def test_the_roots_intensity_counts_on_the_trees_clock() -> None:
    clock = Monotonic()
    with running_tree(options={"max_restarts": 1, "window_s": 10, "monotonic": clock}) as tree:
        for _ in range(3):  # each crash 20 s after the last: never two within the window
            tree.crash("logger")
            clock.now += 20
        assert tree.fatal == []


