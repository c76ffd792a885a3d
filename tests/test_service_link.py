"""The daemon's line to its service manager, in this process: sd_notify's datagrams on a
real socket, the earned watchdog, stderr lines for journald."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from coms_hermes_bridge.actors.service import ServiceLink
from tests.fakes import NotifySocket, wait_for


def test_no_watchdog_ping_while_the_tree_does_not_answer(coms_dir: Path) -> None:
    # the ping is earned by a bounded ask, not sent by a bare timer
    notify = NotifySocket(coms_dir / "n.sock")
    healthy = threading.Event()
    asked: list[float] = []

    def probe(timeout: float) -> int:
        asked.append(timeout)
        if not healthy.is_set():
            raise TimeoutError("no answer")  # as Tree.queue_depth says it
        return 3

    link = ServiceLink.from_env(
        {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "100000"}, pid=os.getpid()
    )
    try:
        link.start_watchdog(probe)
        wait_for(lambda: len(asked) >= 4, what="four probes")
        assert notify.messages.empty()
        assert all(t == pytest.approx(0.025) for t in asked)  # half the tick, at most 2 s
        healthy.set()
        _, text = notify.until("WATCHDOG=1", timeout=2.0)
        assert text == "WATCHDOG=1\nSTATUS=3 open questions"
    finally:
        link.close()
        notify.close()


def test_service_link_without_systemd_does_nothing() -> None:
    link = ServiceLink.from_env({"WATCHDOG_USEC": "100000"}, pid=os.getpid())
    assert link.address is None and link.watchdog_s is None
    assert link.notify("READY=1") is False
    link.start_watchdog(lambda timeout: 0)
    link.ready(0)
    link.stopping()
    link.close()
    # WATCHDOG_PID names another process: the watchdog is not ours to feed
    other = ServiceLink.from_env(
        {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}, pid=os.getpid()
    )
    assert other.address == "\0x" and other.watchdog_s is None


def test_ready_and_stopping_tell_the_service_manager(coms_dir: Path) -> None:  # sd_notify(3)
    notify = NotifySocket(coms_dir / "n.sock")
    link = ServiceLink.from_env({"NOTIFY_SOCKET": str(notify.path)}, pid=os.getpid())
    try:
        assert link.notify("X=1", "Y=2") is True
        for count in (0, 1, 2):
            link.ready(count)
        link.stopping()
        assert notify.sync() == [
            "X=1\nY=2",
            "READY=1\nSTATUS=0 open questions",
            "READY=1\nSTATUS=1 open question",
            "READY=1\nSTATUS=2 open questions",
            "STOPPING=1\nSTATUS=stopping",
        ]
    finally:
        link.close()
        notify.close()


def test_an_abstract_notify_socket_is_reached_by_its_name() -> None:  # sd_notify(3): "@"
    name = f"coms-hermes-bridge-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind("\0" + name)
        manager.settimeout(5)
        link = ServiceLink.from_env({"NOTIFY_SOCKET": "@" + name}, pid=os.getpid())
        try:
            link.ready(1)
            assert manager.recv(4096) == b"READY=1\nSTATUS=1 open question"
        finally:
            link.close()


def test_a_notify_socket_that_is_no_unix_address_is_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    link = ServiceLink.from_env({"NOTIFY_SOCKET": "vsock:2:3", "WATCHDOG_USEC": "100000"},
                                pid=os.getpid())
    assert (link.address, link.watchdog_s) == (None, None)  # no watchdog without a socket
    assert capsys.readouterr().err == (
        "coms-hermes-bridge: warning: ignoring NOTIFY_SOCKET='vsock:2:3': "
        "not a unix socket address\n")
    for env in ({"NOTIFY_SOCKET": ""}, {}):  # empty is unset: nothing to say
        assert ServiceLink.from_env(env, pid=os.getpid()).address is None
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("env", "interval"),
    [
        ({"WATCHDOG_USEC": "4000000"}, 2.0),  # half of it
        ({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "OURS"}, 2.0),
        ({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": ""}, 2.0),
        ({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}, None),  # another process's
        ({"WATCHDOG_USEC": "1"}, 0.0000005),
        ({"WATCHDOG_USEC": "172800000000"}, 86_400.0),  # two days: a tick a day
        ({"WATCHDOG_USEC": "172800000002"}, 86_400.0),  # longer: still a tick a day
        ({"WATCHDOG_USEC": "18446744073709551615"}, 86_400.0),  # no thread waits that long
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-4000000"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_the_watchdog_interval(env: dict[str, str], interval: float | None) -> None:
    # sd_watchdog_enabled(3): WATCHDOG_USEC, for WATCHDOG_PID when it is set
    pid = os.getpid()
    env = {k: str(pid) if v == "OURS" else v for k, v in env.items()}
    link = ServiceLink.from_env({"NOTIFY_SOCKET": "@x", **env}, pid=pid)
    assert link.watchdog_s == interval


def test_the_watchdog_is_for_this_process_unless_told_which() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "4000000"}
    assert ServiceLink.from_env({**env, "WATCHDOG_PID": str(os.getpid())}).watchdog_s == 2.0
    assert ServiceLink.from_env({**env, "WATCHDOG_PID": "1"}).watchdog_s is None
    assert ServiceLink.from_env({**env, "WATCHDOG_PID": "1"}, pid=1).watchdog_s == 2.0


def test_a_manager_that_reads_nothing_never_holds_the_daemon(
    coms_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # its queue fills, and a send gives up (said once) instead of waiting for room
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(coms_dir / "n.sock"))
        link = ServiceLink.from_env({"NOTIFY_SOCKET": str(coms_dir / "n.sock")},
                                    pid=os.getpid())
        try:
            sent = 0
            while True:
                began = time.monotonic()
                if not link.notify("WATCHDOG=1"):
                    break
                sent += 1
                assert sent < 100_000, "the queue never filled"
            waited = time.monotonic() - began
            assert capsys.readouterr().err == (
                "coms-hermes-bridge: warning: cannot notify the service manager: timed out\n")
            # the most a send waits, as docs/operations.md promises: a second
            assert 0.9 <= waited < 2.5, waited
        finally:
            link.close()


def test_a_probe_that_never_answers_never_holds_the_stop(coms_dir: Path) -> None:
    stuck = threading.Event()
    release = threading.Event()

    def probe(timeout: float) -> int:
        stuck.set()
        release.wait()
        return 0

    link = ServiceLink.from_env({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "100000"},
                                pid=os.getpid())
    try:
        link.start_watchdog(probe)
        watchdog = next(t for t in threading.enumerate() if t.name == "sd-watchdog")
        assert watchdog.daemon  # nor the process's exit
        wait_for(stuck.is_set, what="the probe")
        link.close()  # returns although the probe is still asking
        assert watchdog.is_alive()
    finally:
        release.set()
        link.close()


def test_a_notify_that_cannot_go_is_said_once_per_cause_and_its_end_too(
    coms_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = coms_dir / "n.sock"
    link = ServiceLink.from_env({"NOTIFY_SOCKET": str(path)}, pid=os.getpid())
    try:
        assert link.notify("READY=1") is False
        assert link.notify("WATCHDOG=1") is False  # the same cause: not said again
        assert capsys.readouterr().err == (
            "coms-hermes-bridge: warning: cannot notify the service manager: "
            "[Errno 2] No such file or directory\n")
        path.write_bytes(b"")  # a new cause is news
        assert link.notify("WATCHDOG=1") is False
        assert capsys.readouterr().err == (
            "coms-hermes-bridge: warning: cannot notify the service manager: "
            "[Errno 111] Connection refused\n")
        path.unlink()
        notify = NotifySocket(path)
        try:
            assert link.notify("READY=1") is True
            assert capsys.readouterr().err == (
                "coms-hermes-bridge: info: notifying the service manager works again "
                "(3 failed)\n")
            assert link.notify("WATCHDOG=1") is True
            assert capsys.readouterr().err == ""
            assert notify.sync() == ["READY=1", "WATCHDOG=1"]
        finally:
            notify.close()
    finally:
        link.close()


def test_the_watchdog_says_a_bad_spell_once_and_stops_with_the_daemon(
    coms_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    notify = NotifySocket(coms_dir / "n.sock")
    answers = queue.Queue[int | None]()
    for answer in (None, None, 5):  # two ticks unanswered, then the tree answers
        answers.put(answer)
    probes: list[float] = []

    def probe(timeout: float) -> int:
        probes.append(timeout)
        answer = answers.get()  # the fourth waits until the test answers it
        if answer is None:
            raise TimeoutError
        return answer

    link = ServiceLink.from_env(
        {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "100000"}, pid=os.getpid())
    try:
        link.start_watchdog(probe)
        link.start_watchdog(probe)  # one watchdog, however often it is started
        assert sum(t.name == "sd-watchdog" for t in threading.enumerate()) == 1
        _, text = notify.until("WATCHDOG=1", timeout=5.0)
        assert text == "WATCHDOG=1\nSTATUS=5 open questions"
        assert capsys.readouterr().err == (
            "coms-hermes-bridge: warning: actor tree did not answer within 0.025s "
            "(TimeoutError); withholding the watchdog ping\n"
            "coms-hermes-bridge: info: actor tree answers again; watchdog pings resume\n")
        wait_for(lambda: len(probes) == 4, what="the fourth probe")
        link.stopping()  # while the tree is being asked: its answer earns no ping now
        answers.put(7)
        link.close()
        assert not any(t.name == "sd-watchdog" for t in threading.enumerate())
        assert notify.sync() == ["STOPPING=1\nSTATUS=stopping"]
    finally:
        link.close()
        notify.close()


def test_journald_reads_the_priority_when_stderr_is_the_journal(tmp_path: Path) -> None:
    # under systemd (JOURNAL_STREAM names our stderr) each line starts with <N>
    out = tmp_path / "journal"
    code = (
        "from coms_hermes_bridge.actors.loop import report\n"
        "report('a\\nb', 'error'); report('w', 'warning'); report('i', 'info'); report('plain')\n"
    )
    with open(out, "wb") as stream:
        st = os.fstat(stream.fileno())
        for journal in (f"{st.st_dev}:{st.st_ino}", "1:2"):
            subprocess.run(
                [sys.executable, "-c", code], stderr=stream, check=True, timeout=20,
                env={**os.environ, "JOURNAL_STREAM": journal},
            )
    assert out.read_text().splitlines() == [
        "<3>coms-hermes-bridge: error: a b",
        "<4>coms-hermes-bridge: warning: w",
        "<6>coms-hermes-bridge: info: i",
        "coms-hermes-bridge: plain",
        # another stream's id: a terminal or a file, no priority prefix
        "coms-hermes-bridge: error: a b",
        "coms-hermes-bridge: warning: w",
        "coms-hermes-bridge: info: i",
        "coms-hermes-bridge: plain",
    ]

