"""The I/O edge: one event loop in one thread, its timers and its processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coms_hermes_bridge.actors.edge import (
    OUTPUT_TAIL,
    Edge,
    ProcessResult,
    awaited,
    kill_group,
    run_process,
    shared_edge,
)
from tests.fakes import wait_for


@pytest.fixture
def edge() -> Edge:
    own = Edge("test-edge")
    yield own  # type: ignore[misc]
    own.close()


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """Every process run_process starts, in order, as the spawner made it."""
    from coms_hermes_bridge.actors import edge as edge_module

    made: list[subprocess.Popen[bytes]] = []
    real = edge_module._popen

    def popen(argv: list[str]) -> subprocess.Popen[bytes]:
        made.append(real(argv))
        return made[-1]

    monkeypatch.setattr(edge_module, "_popen", popen)
    return made


def passed(edge: Edge, when: float) -> None:
    """Every timer of `edge` due by the wall clock's `when` has fired (they fire in order)."""
    done = threading.Event()
    edge.at(when, done.set)
    assert done.wait(when - time.time() + 5)


def test_fires_at_the_wall_clock_moment_not_before(edge: Edge) -> None:
    fired: list[float] = []
    when = time.time() + 0.3
    edge.at(when, lambda: fired.append(time.time()))
    wait_for(lambda: fired, what="the timer fired")
    assert fired[0] >= when


def test_a_moment_already_past_fires_at_once(edge: Edge) -> None:
    fired = threading.Event()
    edge.at(time.time() - 5, fired.set)
    assert fired.wait(1.0)


def test_fires_in_deadline_order_whatever_the_order_set(edge: Edge) -> None:
    order: list[str] = []
    now = time.time()
    for name, offset in [("c", 0.3), ("a", 0.1), ("b", 0.2), ("d", 0.4)]:
        edge.at(now + offset, lambda name=name: order.append(name))
    passed(edge, now + 0.5)
    assert order == ["a", "b", "c", "d"]


def test_an_earlier_deadline_set_later_fires_first(edge: Edge) -> None:
    late = threading.Event()
    early = threading.Event()
    edge.after(3600, late.set)
    edge.after(0.05, early.set)
    assert early.wait(1.0)
    assert not late.is_set()


def test_cancel_from_any_thread_keeps_an_action_from_running(edge: Edge) -> None:
    fired: list[int] = []
    now = time.time()
    timers = [edge.at(now + 0.2, lambda i=i: fired.append(i)) for i in range(10)]
    for timer in timers[::2]:
        timer.cancel()
    timers[0].cancel()  # twice is harmless
    passed(edge, now + 0.3)
    assert sorted(fired) == [1, 3, 5, 7, 9]
    timers[1].cancel()  # after it fired: nothing happens


def test_the_schedule_shape_returns_a_cancel(edge: Edge) -> None:
    fired = threading.Event()
    cancel = edge.schedule(0.1, fired.set)
    cancel()
    passed(edge, time.time() + 0.2)
    assert not fired.is_set()


def test_ten_thousand_timers_one_thread(edge: Edge) -> None:
    before = threading.active_count()
    fired: list[int] = []
    hold = threading.Event()
    edge.call(hold.wait, 30)  # the loop waits while the timers are set and cancelled
    now = time.time()
    timers = [edge.at(now + (i % 50) / 1000, lambda i=i: fired.append(i))
              for i in range(10_000)]
    assert threading.active_count() == before + 1  # the loop's thread, nothing per timer
    for timer in timers[:9_000]:
        timer.cancel()
    hold.set()
    passed(edge, now + 0.1)
    assert sorted(fired) == list(range(9_000, 10_000))


def test_an_action_that_raises_does_not_stop_the_others(
    edge: Edge, capfd: pytest.CaptureFixture[str]
) -> None:
    fired = threading.Event()

    def bad() -> None:
        raise RuntimeError("bad action")

    edge.after(0.01, bad)
    edge.after(0.02, fired.set)
    assert fired.wait(1.0)
    assert "coms-hermes-bridge: test-edge: a timer action failed: RuntimeError('bad action')" \
        in capfd.readouterr().err


def test_call_runs_on_the_loop_in_order(edge: Edge) -> None:
    seen: list[tuple[int, bool]] = []
    for i in range(100):
        edge.call(lambda i=i: seen.append((i, edge.on_loop())))
    passed(edge, time.time())
    assert seen == [(i, True) for i in range(100)]


# -- processes -----------------------------------------------------------------


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "prog.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def test_a_process_exit_status_and_the_tails_of_its_streams(edge: Edge, tmp_path: Path) -> None:
    argv = _script(tmp_path, "import sys\nsys.stdout.write('o' * 100000 + 'END')\n"
                             "sys.stderr.write('why')\nsys.exit(3)\n")
    result = edge.spawn(run_process(argv, 10)).result(15)
    assert result.returncode == 3
    assert result.stdout == ("o" * 100000 + "END")[-OUTPUT_TAIL:]
    assert result.stderr == "why"


def test_a_process_past_its_timeout_is_killed_with_its_group(edge: Edge, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    argv = _script(tmp_path, "import os, subprocess, sys, time\n"
                             "child = subprocess.Popen([sys.executable, '-c', "
                             "'import time; time.sleep(60)'])\n"
                             f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
                             "time.sleep(60)\n")
    began = time.monotonic()
    result = edge.spawn(run_process(argv, 0.5)).result(15)
    assert result.returncode is None
    assert time.monotonic() - began < 5
    child, grandchild = (int(pid) for pid in pids.read_text().split())

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        status = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return status == "Z"  # killed, waiting for its parent (init) to collect it

    wait_for(lambda: gone(grandchild), what="the grandchild killed with the group")
    assert gone(child)


def test_a_process_that_outlives_its_kill_is_given_up_after_the_reap_time(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as one stuck in the kernel: the kill does not take, and the send must end anyway
    from coms_hermes_bridge.actors import edge as edge_module

    monkeypatch.setattr(edge_module, "kill_group", lambda pid: None)
    proc: list[subprocess.Popen[bytes]] = []
    real = edge_module._popen
    monkeypatch.setattr(edge_module, "_popen", lambda argv: proc.append(real(argv)) or proc[-1])
    try:
        began = time.monotonic()
        result = edge.spawn(run_process(["sleep", "60"], 0.1)).result(15)
        assert result == ProcessResult(None, "", "")
        assert 0.1 + edge_module._REAP_S <= time.monotonic() - began < 10
        assert proc[0].poll() is None  # still there: it was given up, not waited on
    finally:
        for p in proc:
            p.kill()
            p.wait()


def test_processes_are_started_by_one_spawner_thread_however_many_at_once(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one thread, whatever the load (the daemon's thread count is bounded)
    from coms_hermes_bridge.actors import edge as edge_module

    monkeypatch.setattr(edge_module, "_SPAWNER", None)  # made afresh for this test
    starters: list[str] = []
    real = edge_module._popen

    def slow_start(argv: list[str]) -> subprocess.Popen[bytes]:
        starters.append(threading.current_thread().name)
        time.sleep(0.05)  # the next start is asked for while this one runs
        return real(argv)

    monkeypatch.setattr(edge_module, "_popen", slow_start)
    try:
        runs = [edge.spawn(run_process(["true"], 5)) for _ in range(3)]
        assert [run.result(15).returncode for run in runs] == [0, 0, 0]
        assert len(starters) == 3 and len(set(starters)) == 1
        assert starters[0].startswith("edge-spawn")
    finally:
        spawner = edge_module._SPAWNER
        if spawner is not None:
            spawner.shutdown(wait=True)


def test_a_group_that_may_not_be_signalled_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # its pid reused by another user's process: never an error on the loop
    from coms_hermes_bridge.actors import edge as edge_module

    def refused(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(edge_module.os, "killpg", refused)
    kill_group(12345)


def test_a_stream_that_fails_to_read_counts_as_ended(tmp_path: Path) -> None:
    from coms_hermes_bridge.actors import edge as edge_module

    removed: list[int] = []

    class Loop:
        def remove_reader(self, fd: int) -> None:
            removed.append(fd)

    fd = os.open(tmp_path, os.O_RDONLY)  # a read of it fails (EISDIR)
    try:
        tail = bytearray(b"kept")
        edge_module._drain(Loop(), fd, tail, 3)  # type: ignore[arg-type]
        assert (removed, tail) == ([fd], bytearray(b"kept"))
    finally:
        os.close(fd)


def test_pipes_a_grandchild_holds_are_not_waited_on(edge: Edge, tmp_path: Path) -> None:
    # the exit decides: a daemonised grandchild keeping stdout open does not hold the send
    argv = _script(tmp_path, "import os, subprocess, sys, time\n"
                             "subprocess.Popen([sys.executable, '-c', "
                             "'import time; time.sleep(30)'], start_new_session=True)\n"
                             "print('sent')\n")
    began = time.monotonic()
    result = edge.spawn(run_process(argv, 20)).result(25)
    assert result.returncode == 0
    assert time.monotonic() - began < 10


def test_a_program_that_cannot_start_raises(edge: Edge, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        edge.spawn(run_process([str(tmp_path / "missing")], 5)).result(5)


def test_a_call_that_raises_does_not_keep_the_others_from_running(
    edge: Edge, capfd: pytest.CaptureFixture[str]
) -> None:
    seen: list[int] = []

    def bad() -> None:
        raise RuntimeError("bad call")

    edge.call(seen.append, 1)
    edge.call(bad)
    edge.call(seen.append, 2)
    passed(edge, time.time())
    assert seen == [1, 2]
    assert "coms-hermes-bridge: test-edge: a call failed: RuntimeError('bad call')" \
        in capfd.readouterr().err


def test_a_timer_set_while_the_loop_is_busy_counts_from_when_it_was_set(edge: Edge) -> None:
    # the delay runs from the call, not from whenever the loop gets to arm it
    edge.call(time.sleep, 1.0)  # the loop is busy for a second
    began = time.time()
    fired: list[float] = []
    edge.after(0.5, lambda: fired.append(time.time()))
    wait_for(lambda: fired, what="the timer fired")
    assert 0.9 <= fired[0] - began < 1.4  # as soon as the loop was free, not 0.5 s later


def test_a_forked_child_runs_its_own_loop(edge: Edge) -> None:
    # a test runner's worker (mutmut) forks a process whose edge already runs: the loop's
    # thread does not come along, so the edge starts a loop of its own in the child
    ran = threading.Event()
    edge.after(0, ran.set)
    assert ran.wait(2)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if a timer fires there
        fired = threading.Event()
        edge.after(0.01, fired.set)
        os._exit(0 if fired.wait(2) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_after_a_fork_every_edge_and_the_spawner_start_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fork hook itself, run here in this process, where the test above runs it in a
    # child: what a thread the fork left behind held (a lock, a loop, queued calls, the
    # spawner) must be let go, or the child's first call waits for ever.
    from coms_hermes_bridge.actors import edge as edge_module

    own = Edge("test-fork")
    ran = threading.Event()
    own.call(ran.set)
    assert ran.wait(2)
    left_loop, left_thread = own._loop, own._thread
    assert left_loop is not None and left_thread is not None
    held = threading.Lock()
    held.acquire()
    monkeypatch.setattr(edge_module, "_SHARED_LOCK", held)
    monkeypatch.setattr(edge_module, "_SPAWNER", object())
    monkeypatch.setattr(edge_module, "_EDGES", weakref.WeakSet([own]))
    own._lock.acquire()
    own._calls.append((print, ("never run",)))
    own._waking = True
    try:
        edge_module._after_fork()
        assert edge_module._SPAWNER is None and not edge_module._SHARED_LOCK.locked()
        assert (own._loop, own._thread, list(own._calls), own._waking) == (None, None, [], False)
        assert not own._lock.locked()
        again = threading.Event()
        own.call(again.set)  # a loop of its own again, on a thread of its own
        assert again.wait(2) and own._thread is not left_thread
    finally:
        own.close()
        left_loop.call_soon_threadsafe(left_loop.stop)
        left_thread.join(timeout=5)
        left_loop.close()


def test_what_asyncio_cannot_handle_is_one_line_on_stderr(
    edge: Edge, capfd: pytest.CaptureFixture[str]
) -> None:
    def fault() -> None:
        edge.loop.call_exception_handler({"message": "lost task", "exception": ValueError("v")})
        edge.loop.call_exception_handler({"message": "no exception"})

    edge.call(fault)
    passed(edge, time.time())
    err = capfd.readouterr().err.splitlines()
    assert err == ["coms-hermes-bridge: edge: lost task: ValueError('v')",
                   "coms-hermes-bridge: edge: no exception"]


def test_close_ends_the_loop_and_its_thread() -> None:
    own = Edge("test-close")
    ran = threading.Event()
    own.call(ran.set)
    assert ran.wait(2)
    thread = own._thread
    loop = own._loop
    assert thread is not None and loop is not None
    assert thread.name == "test-close" and thread.daemon  # never holds the process up
    own.close()
    assert not thread.is_alive() and loop.is_closed()
    own.close()  # twice is harmless
    again = threading.Event()
    own.call(again.set)  # used again: a loop of its own, afresh
    assert again.wait(2)
    own.close()


def test_a_process_given_up_while_it_starts_is_killed(
    edge: Edge, started: list[subprocess.Popen[bytes]]
) -> None:
    from coms_hermes_bridge.actors import edge as edge_module

    busy = threading.Event()
    edge_module._spawner().submit(busy.wait, 10)  # the spawner is busy: the start waits
    running = edge.spawn(run_process([sys.executable, "-c", "import time; time.sleep(60)"], 30))
    wait_for(lambda: edge_module._spawner()._work_queue.qsize() >= 1, what="the start queued")
    running.cancel()
    busy.set()
    wait_for(lambda: started and started[0].returncode is not None, what="killed once started")
    assert started[0].returncode == -signal.SIGKILL
    assert started[0].stdout is not None and started[0].stdout.closed  # its pipes with it
    assert started[0].stderr is not None and started[0].stderr.closed


def test_a_timer_cancelled_while_its_turn_is_queued_does_not_run(edge: Edge) -> None:
    # the cancel's own call to the loop comes after the timer's turn: the flag decides
    hold, running, release = threading.Event(), threading.Event(), threading.Event()
    fired: list[str] = []
    edge.call(hold.wait, 5)  # both timers are armed, and fall due, in one batch
    edge.after(0, lambda: (running.set(), release.wait(5)))
    second = edge.after(0, lambda: fired.append("second"))
    hold.set()
    assert running.wait(5)  # the second one's turn is queued behind this one
    second.cancel()
    release.set()
    passed(edge, time.time())
    assert fired == []


def test_a_cancelled_timer_leaves_nothing_on_the_loop_and_a_late_cancel_is_harmless(
    edge: Edge, capfd: pytest.CaptureFixture[str]
) -> None:
    # at 10,000 open questions, a cancelled deadline must not wait in the loop's heap
    timer = edge.after(3600, lambda: None)
    passed(edge, time.time())
    handle = timer._handle
    assert handle is not None
    timer.cancel()
    passed(edge, time.time())
    assert handle.cancelled() and timer._handle is None
    fired = edge.after(0, lambda: None)
    passed(edge, time.time())
    fired.cancel()  # after it ran
    early = Edge("test-edge-held")
    hold = threading.Event()
    early.call(hold.wait, 5)
    unarmed = early.after(0, lambda: None)  # still queued behind the held call
    unarmed.cancel()  # before it was ever armed
    hold.set()
    passed(early, time.time())
    passed(edge, time.time())
    early.close()
    assert "failed" not in capfd.readouterr().err


def test_what_is_in_the_pipes_at_the_exit_is_read_and_decoded_leniently(
    edge: Edge, tmp_path: Path
) -> None:
    # The loop is held while the process writes more than one read takes and exits:
    # the exit and the output are seen at once, and the rest is read after the exit.
    go, ready = tmp_path / "go", tmp_path / "ready"
    argv = _script(tmp_path, "import fcntl, os, time\n"
                             "fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, 1 << 20)\n"
                             f"open({str(ready)!r}, 'w').write(str(os.getpid()))\n"
                             f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
                             "os.write(1, b'a' * 500_000 + b'b' * 4096)\n"
                             "os.write(2, b'bad \\xff byte')\n"
                             "os._exit(0)\n")
    running = edge.spawn(run_process(argv, 10))
    wait_for(lambda: ready.exists() and ready.read_text(), what="the process started")
    pid = int(ready.read_text())
    passed(edge, time.time())  # its pipes and its exit are watched by now
    hold = threading.Event()
    edge.call(hold.wait, 10)
    go.touch()
    wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z",
             what="the process exited, not yet collected")
    hold.set()
    result = running.result(15)
    assert result.returncode == 0
    assert result.stdout == "b" * OUTPUT_TAIL
    assert result.stderr == "bad \ufffd byte"


def test_a_process_past_its_timeout_gives_no_output(edge: Edge, tmp_path: Path) -> None:
    argv = _script(tmp_path, "import sys, time\nprint('partial', flush=True)\ntime.sleep(60)\n")
    assert edge.spawn(run_process(argv, 0.3)).result(15) == ProcessResult(None, "", "")


def test_running_processes_leaks_no_descriptor(
    edge: Edge, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    def watched() -> int:  # what the loop's selector still watches
        return len(edge.loop._selector.get_map())  # type: ignore[attr-defined]

    quick = _script(tmp_path, "print('hi')\n")
    slow = [sys.executable, "-c", "import time; time.sleep(60)"]
    passed(edge, time.time())  # the loop is up
    before = descriptors(), watched()
    for _ in range(5):
        edge.spawn(run_process(quick, 10)).result(15)
        edge.spawn(run_process(slow, 0.05)).result(15)
    assert (descriptors(), watched()) == before
    # closed by run_process itself, not by the garbage collector some time later
    assert started and all(p.stdout.closed and p.stderr.closed for p in started)  # type: ignore[union-attr]


def test_a_process_without_a_pidfd_is_killed_and_the_error_raised(
    edge: Edge, started: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a kernel without pidfd_open (before 5.3): every send fails the same clear way
    from coms_hermes_bridge.actors import edge as edge_module

    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(edge_module.os, "pidfd_open", no_pidfd)
    with pytest.raises(OSError, match="Function not implemented"):
        edge.spawn(run_process([sys.executable, "-c", "import time; time.sleep(60)"], 30)).result(5)
    assert started[0].wait(5) == -signal.SIGKILL
    os.fstat(1)  # the process's own descriptors are untouched


def test_a_process_reads_no_stdin_and_starts_on_the_spawner_thread(
    edge: Edge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hermes must never wait on (or eat) the daemon's own stdin, whatever it is;
    # starting it blocks, so it happens on the one thread kept for that
    from coms_hermes_bridge.actors import edge as edge_module

    threads: list[str] = []
    real = edge_module._popen

    def popen(argv: list[str]) -> subprocess.Popen[bytes]:
        threads.append(threading.current_thread().name)
        return real(argv)

    monkeypatch.setattr(edge_module, "_popen", popen)
    argv = _script(tmp_path, "import sys\nprint(repr(sys.stdin.read()))\n")
    read_end, write_end = os.pipe()  # a stdin that never ends
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        result = edge.spawn(run_process(argv, 5)).result(10)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert (result.returncode, result.stdout) == (0, "''\n")
    assert [name.rsplit("_", 1)[0] for name in threads] == ["edge-spawn"]


def test_killing_the_group_of_a_process_already_gone_is_harmless() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    kill_group(proc.pid)  # no such group any more: nothing to do, nothing raised


def test_the_shared_edge_is_the_thread_named_edge_and_never_holds_the_process_up(
    tmp_path: Path,
) -> None:
    # docs/architecture.md names the daemon's threads; a process that is done exits
    # without closing the edge (a non-daemon loop thread would keep it alive forever)
    code = ("import threading\n"
            "from coms_hermes_bridge.actors.edge import shared_edge\n"
            "edge = shared_edge()\n"
            "done = threading.Event()\n"
            "edge.call(done.set)\n"
            "assert done.wait(5)\n"
            "print(sorted(t.name for t in threading.enumerate()))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "['MainThread', 'edge']\n"
    shared = shared_edge()  # and here, in this process
    assert shared is shared_edge() and shared.name == "edge" == Edge().name
    passed(shared, time.time())
    assert shared._thread is not None and shared._thread.name == "edge"
    assert shared._thread.daemon


def test_calls_from_another_thread_wake_the_loop_once_per_burst(edge: Edge) -> None:
    # a thousand answers' responses cost one write to the loop's wake-up pipe, not one each
    hold, seen = threading.Event(), []
    edge.call(hold.wait, 5)
    caught_up = threading.Event()
    loop = edge.loop
    real = loop.call_soon_threadsafe
    wakes: list[object] = []

    def counting(callback: Any, *args: Any) -> Any:
        wakes.append(callback)
        return real(callback, *args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        for i in range(100):
            edge.call(seen.append, i)
        hold.set()
        edge.call(caught_up.set)
        assert caught_up.wait(5)
    finally:
        del loop.call_soon_threadsafe
    assert seen == list(range(100))
    assert len(wakes) <= 2  # the burst, and at most one more for the call after it


def test_a_reply_after_the_loop_closed_is_dropped_quietly() -> None:
    own = Edge("test-edge-closing")
    replies: list[Callable[[int], None]] = []
    waiting = own.spawn(awaited(replies.append, 30))
    wait_for(lambda: replies, what="the reply callback handed out")
    waiting.cancel()  # its caller gave up
    passed(own, time.time())
    own.close()
    replies[0](1)  # nobody waits any more: no error


def test_a_missing_program_given_up_while_it_starts_leaves_no_fault(
    edge: Edge, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from coms_hermes_bridge.actors import edge as edge_module

    busy = threading.Event()
    edge_module._spawner().submit(busy.wait, 10)
    running = edge.spawn(run_process([str(tmp_path / "missing")], 30))
    wait_for(lambda: edge_module._spawner()._work_queue.qsize() >= 1, what="the start queued")
    running.cancel()
    busy.set()
    done = threading.Event()
    edge_module._spawner().submit(done.set)  # after the start that failed
    assert done.wait(5)
    passed(edge, time.time())
    assert capfd.readouterr().err == ""
