"""The timer service: one heap, one thread, every deadline (issue 14.2)."""

from __future__ import annotations

import threading
import time

from coms_hermes_bridge.actors.timers import TimerService
from tests.fakes import FakeClock, wait_for


def test_fires_at_the_absolute_deadline_not_before() -> None:
    clock = FakeClock()
    timers = TimerService(clock)
    fired = threading.Event()
    timers.at(clock.now + 30.0, fired.set)
    assert not fired.wait(0.3)
    clock.now += 29.9
    assert not fired.wait(1.3)  # the service looks at the clock at least once a second
    clock.now += 0.1
    assert fired.wait(2.0)
    assert len(timers) == 0


def test_a_deadline_already_past_fires_at_once() -> None:
    timers = TimerService()
    fired = threading.Event()
    timers.at(time.time() - 5, fired.set)
    assert fired.wait(1.0)


def test_fires_in_deadline_order_ties_in_the_order_set() -> None:
    clock = FakeClock()
    timers = TimerService(clock)
    order: list[str] = []
    for name, offset in [("c", 3), ("a", 1), ("b1", 2), ("b2", 2), ("d", 4)]:
        timers.at(clock.now + offset, lambda name=name: order.append(name))
    clock.now += 10
    wait_for(lambda: len(order) == 5, what="all fired")
    assert order == ["a", "b1", "b2", "c", "d"]


def test_an_earlier_deadline_set_later_wakes_the_thread() -> None:
    timers = TimerService()
    late = threading.Event()
    early = threading.Event()
    timers.after(3600, late.set)
    started = time.monotonic()
    timers.after(0.05, early.set)
    assert early.wait(1.0)
    assert time.monotonic() - started < 0.5
    assert not late.is_set()


def test_cancel_keeps_an_action_from_running() -> None:
    clock = FakeClock()
    timers = TimerService(clock)
    fired: list[int] = []
    handles = [timers.at(clock.now + 1, lambda i=i: fired.append(i)) for i in range(10)]
    for handle in handles[::2]:
        handle.cancel()
    handles[0].cancel()  # twice is harmless
    assert len(timers) == 5
    clock.now += 2
    wait_for(lambda: len(fired) == 5, what="the others fired")
    assert fired == [1, 3, 5, 7, 9]
    handles[1].cancel()  # after it fired: nothing happens
    assert len(timers) == 0


def test_the_schedule_shape_returns_a_cancel() -> None:
    timers = TimerService()
    fired = threading.Event()
    cancel = timers.schedule(0.1, fired.set)
    cancel()
    assert not fired.wait(0.4)


def test_many_timers_one_thread_cancelled_ones_do_not_pile_up() -> None:
    clock = FakeClock()
    timers = TimerService(clock)
    before = threading.active_count()
    fired: list[int] = []
    handles = [timers.at(clock.now + 100 + i % 50, lambda i=i: fired.append(i))
               for i in range(10_000)]
    assert threading.active_count() == before + 1
    for handle in handles[:9_000]:
        handle.cancel()
    assert len(timers) == 1000
    assert len(timers._heap) < 5_000  # rebuilt once more than half was cancelled
    clock.now += 200
    wait_for(lambda: len(fired) == 1000, what="the live ones fired")
    assert sorted(fired) == list(range(9_000, 10_000))


def test_an_action_that_raises_does_not_stop_the_others() -> None:
    timers = TimerService()
    fired = threading.Event()

    def bad() -> None:
        raise RuntimeError("bad action")

    timers.after(0.01, bad)
    timers.after(0.02, fired.set)
    assert fired.wait(1.0)
