"""The real daemon against ordinary faults: floods, leftovers, limits."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import stat
import time
from collections.abc import Callable, Iterator

import pytest

from tests.bridge_process import Bridge
from tests.fakes import request, wait_for

LINE_LIMIT = 64 * 1024


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def test_50_mb_of_hermes_stderr_makes_short_lines(bridge: Bridge) -> None:  # C18, W13
    bridge.hermes.configure(exit=1, flood=50_000_000, stderr="final reason")
    bridge.start()
    qid = bridge.ask("Anyone?")
    env = bridge.asker.response(timeout=30)
    assert env["msg_id"] == qid
    assert env["error"].startswith("hermes send failed (1): ")
    assert env["error"].endswith("final reason")
    assert bridge.asker.line_sizes[qid] < LINE_LIMIT
    bridge.wait_log("delivery_error", qid)
    lines = bridge.log.read_bytes().splitlines(keepends=True)
    assert lines and all(len(line) < LINE_LIMIT for line in lines)


def test_a_child_left_holding_stdout_does_not_delay_delivered(bridge: Bridge) -> None:  # 9.6
    bridge.hermes.configure(spawn=True)  # hermes exits 0, `sleep 30` keeps its pipes
    bridge.start()
    try:
        began = time.monotonic()
        qid = bridge.ask("Deploy?")
        bridge.wait_log("delivered", qid, timeout=5)
        assert time.monotonic() - began < 1.0
        assert bridge.events(qid) == ["question_received", "delivered"]
    finally:
        for run in bridge.hermes.started():
            if run["child"]:
                os.kill(run["child"], signal.SIGKILL)
    wait_for(lambda: bridge.ping()["agent_card"]["queue_depth"] == 1, what="still open")


def _nofile(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return apply


def _heartbeat_at(bridge: Bridge) -> str:
    return str(json.loads(bridge.entry_path().read_text())["heartbeat_at"])


def _pong(bridge: Bridge) -> bool:
    try:
        return bridge.ping().get("type") == "pong"
    except BlockingIOError:  # the listen backlog is still full
        return False


def round_trip(bridge: Bridge, text: str) -> None:
    qid = bridge.ask(text)
    bridge.wait_log("delivered", qid)
    bridge.answer(qid, "yes")
    env = bridge.asker.response()
    assert env["msg_id"] == qid and env["response"] == {"kind": "freeform", "text": "yes"}


@pytest.mark.slow  # seconds of real time: in `just test-slow`
def test_200_trickling_clients_with_128_descriptors(bridge: Bridge) -> None:  # W12
    bridge.start(preexec=_nofile(128), COMS_HERMES_BRIDGE_HEARTBEAT_MS="500")
    assert bridge.proc is not None
    endpoint = bridge.endpoint
    clients: list[socket.socket | None] = [None] * 200
    connects = refusals = 0

    def reconnect(i: int) -> None:
        nonlocal connects
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.setblocking(False)
        try:
            conn.connect(endpoint)
        except OSError:  # backlog full: try again at the next tick
            conn.close()
            return
        clients[i] = conn
        connects += 1

    first_beat = _heartbeat_at(bridge)
    began = time.monotonic()
    try:
        for tick in range(3):  # one byte a second from each, across several heartbeats
            time.sleep(max(0.0, began + tick - time.monotonic()))
            for i in range(len(clients)):
                conn = clients[i]
                if conn is None:
                    reconnect(i)
                    continue
                try:
                    conn.send(b"{")
                    if conn.recv(4096, socket.MSG_DONTWAIT) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:  # refused past the cap, or dropped at the line deadline
                    refusals += 1
                    conn.close()
                    clients[i] = None
        assert bridge.proc.poll() is None
        assert _heartbeat_at(bridge) != first_beat  # the heartbeat went on meanwhile
        assert refusals > 0  # the cap was reached
    finally:
        for conn in clients:
            if conn is not None:
                conn.close()
    assert bridge.proc.poll() is None, bridge.stderr_lines
    # the tricklers' connections are closed as soon as their EOFs are read, and the
    # backlog they filled is drained
    wait_for(lambda: _pong(bridge), timeout=3, what="a pong")
    round_trip(bridge, "Still there?")
    assert not [line for line in bridge.stderr_lines if "crashed" in line], bridge.stderr_lines
    assert any("coms connections open; refusing more" in line for line in bridge.stderr_lines)


def test_registry_dir_deleted_comes_back_within_one_heartbeat(bridge: Bridge) -> None:  # 9.3
    bridge.start(COMS_HERMES_BRIDGE_HEARTBEAT_MS="1000")
    agents = bridge.entry_path().parent
    shutil.rmtree(agents)
    began = time.monotonic()
    wait_for(bridge.entry_path().exists, timeout=3, what="entry back")
    assert time.monotonic() - began < 1.0 + 0.3  # one heartbeat, and a little for the write
    assert stat.S_IMODE(agents.stat().st_mode) == 0o700
    assert json.loads(bridge.entry_path().read_text())["pid"] == bridge.proc.pid  # type: ignore[union-attr]
    round_trip(bridge, "After the clean-up?")
    assert any("agents was gone; made it again (0700)" in line for line in bridge.stderr_lines)


@pytest.mark.parametrize("coms_in_home", [False, True])
def test_umask_000_still_makes_private_files(bridge: Bridge, coms_in_home: bool) -> None:
    # W1-W4: every directory the bridge makes is 0700, the registry's too (a bare mkdir
    # under umask 000 made `projects/<p>/agents` and `sockets` writable by every user)
    if coms_in_home:  # PI_COMS_DIR as when unset: the registry makes ~/.pi first
        bridge.coms = bridge.home / ".pi" / "coms"
    bridge.home.chmod(0o755)
    bridge.start(preexec=lambda: os.umask(0))
    made = [bridge.coms, bridge.coms / "projects", bridge.coms / "sockets",
            bridge.coms / "projects" / "default", bridge.coms / "projects" / "default" / "agents",
            bridge.home / ".pi", bridge.home / ".pi" / "coms"]
    assert {str(path): oct(stat.S_IMODE(path.stat().st_mode)) for path in made} == dict.fromkeys(
        map(str, made), oct(0o700))
    assert stat.S_IMODE(bridge.home.stat().st_mode) == 0o755  # there already: not ours
    round_trip(bridge, "Private?")
    bridge.wait_log("answered")
    modes = {
        path.name: stat.S_IMODE(path.stat().st_mode)
        for path in [bridge.bridge_dir, bridge.questions, bridge.log,
                     *bridge.bridge_dir.glob("state*.sqlite3*")]
    }
    states = [name for name in modes if name.startswith("state")]
    assert any(name.endswith("-wal") for name in states), modes
    assert modes == {
        "hermes-bridge": 0o700, "questions": 0o700, "log.ndjson": 0o600,
        **dict.fromkeys(states, 0o600),
    }


def test_looser_private_files_are_tightened_at_start(bridge: Bridge) -> None:
    bridge.start()
    round_trip(bridge, "First run")
    bridge.signal(signal.SIGTERM)
    bridge.bridge_dir.chmod(0o755)
    bridge.log.chmod(0o644)
    state = next(bridge.bridge_dir.glob("state*.sqlite3"))
    state.chmod(0o666)
    bridge.stderr_lines.clear()
    bridge.start()
    assert stat.S_IMODE(bridge.bridge_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(bridge.log.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    for path, was, now in [(bridge.bridge_dir, "0755", "0700"), (bridge.log, "0644", "0600"),
                           (state, "0666", "0600")]:
        line = f"coms-hermes-bridge: {path} was mode {was}; tightened to {now}"
        wait_for(lambda line=line: line in bridge.stderr_lines, what=f"{line} in {bridge.stderr_lines}")


def test_text_that_is_not_unicode_is_refused_and_stops_nothing(bridge: Bridge) -> None:
    # X12, C3, W14: one such line used to poison the store for every later question
    bridge.start()
    poison = bridge.asker.prompt_envelope("hi")
    line = json.dumps(poison).replace(poison["msg_id"], "x\\ud800y") + "\n"
    replies = [request(bridge.endpoint, line.encode())]
    expected = [{"type": "nack", "msg_id": "x\ud800y",
                 "error": "invalid prompt envelope: msg_id is not valid Unicode"}]
    for field in ("sender_name", "prompt", "sender_cwd", "sender_endpoint", "timestamp"):
        env = bridge.asker.prompt_envelope("hi")
        env[field] += "\udc00"
        replies.append(request(bridge.endpoint, json.dumps(env).encode() + b"\n"))
        expected.append({"type": "nack", "msg_id": env["msg_id"],
                         "error": f"invalid prompt envelope: {field} is not valid Unicode"})
    assert replies == expected
    qids = [bridge.ask(f"ordinary {n}") for n in range(3)]
    for n, qid in enumerate(qids):
        bridge.wait_log("delivered", qid)
        bridge.answer(qid, f"answer {n}")
    got = {env["msg_id"]: env for env in (bridge.asker.response() for _ in qids)}
    assert {q: (got[q]["response"], got[q]["error"]) for q in qids} == {
        q: ({"kind": "freeform", "text": f"answer {n}"}, None) for n, q in enumerate(qids)
    }
    assert wait_for(lambda: bridge.owed() == 0, what="responses settled")
    assert bridge.signal(signal.SIGTERM) == 0
    assert not [line for line in bridge.stderr_lines if "Traceback" in line or "Error(" in line]
    assert bridge.owed() == 0  # nothing left to send again
    bridge.start()
    assert bridge.ping()["agent_card"]["queue_depth"] == 0
    bridge.no_response()
