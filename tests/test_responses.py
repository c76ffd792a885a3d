"""The response sender over real unix sockets (W15).

Each test stands up a real asker socket that behaves one way (acks, nacks,
stays silent, is gone, has a full backlog) and checks what the pool reports
through `done`, how often it tried, and that it never waits on one asker
while another could be served. The blocking `send_envelope` (used by the
`cancel` command) must judge each case the same way.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coms_hermes_bridge.actors import responses
from coms_hermes_bridge.actors.loop import Edge
from coms_hermes_bridge.actors.responses import (
    RESPONSE_QUEUE,
    ResponsePool,
    judge_reply,
    send_envelope,
)
from tests.fakes import Asker, close_edge, edge_caught_up, read_line, wait_for

LINE = b'{"type":"response","msg_id":"q"}\n'
NEVER = (30.0, 30.0)  # retry pauses no test waits out: an outcome within one is no retry


@pytest.fixture(autouse=True)
def closed_at_the_end(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every asker a test makes is closed after it, every pool's sends dropped: no send or
    thread outlives it."""
    made: list[Any] = []
    real_pool_init = ResponsePool.__init__
    real_asker_init = Asker.__init__

    def pool_init(self: ResponsePool, *args: Any, **kwargs: Any) -> None:
        real_pool_init(self, *args, **kwargs)
        made.append(self)

    def asker_init(self: Asker, *args: Any, **kwargs: Any) -> None:
        real_asker_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(ResponsePool, "__init__", pool_init)
    monkeypatch.setattr(Asker, "__init__", asker_init)
    yield
    for thing in reversed(made):
        if isinstance(thing, ResponsePool):
            for send in list(thing._sends):  # dropped, cancelled on the loop: nothing outlives it
                send.cancel()
        else:
            thing.close()
    while CLOSE_AT_THE_END:
        server = CLOSE_AT_THE_END.pop()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes its accept()
        server.close()


CLOSE_AT_THE_END: list[socket.socket] = []  # servers a test made itself


class Done:
    """Collects `done` calls by qid, with the moment each came."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str | None] = {}
        self.at: dict[str, float] = {}

    def __call__(self, qid: str) -> Callable[[str | None], None]:
        def done(reason: str | None) -> None:
            assert qid not in self.outcomes, f"done twice for {qid}"
            self.outcomes[qid] = reason
            self.at[qid] = time.monotonic()

        return done


def socket_module(make: Callable[..., socket.socket]) -> Any:
    """The socket module as the sender sees it, its sockets made by `make`."""
    return type("socket_module", (), {**vars(socket), "socket": make})


def full_backlog(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    """A peer at `path` that never accepts, its listen backlog filled (as by many of its
    peers connecting at once): the server, and the connections that fill it."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)
    CLOSE_AT_THE_END.append(server)
    fillers: list[socket.socket] = []
    while True:
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(str(path))
        except BlockingIOError:
            filler.close()
            return server, fillers
        fillers.append(filler)


# -- what the asker says ---------------------------------------------------------------


def test_an_ack_is_success_and_the_line_arrives_whole(coms_dir: Path) -> None:  # W15
    asker = Asker(coms_dir / "a.sock")
    pool, done = ResponsePool(), Done()
    assert pool.submit(asker.endpoint, LINE, 5.0, NEVER, done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the ack")
    assert done.outcomes == {"q": None}
    assert asker.lines == [LINE]
    assert asker.connections == 1


def test_a_send_whose_key_is_in_flight_is_taken_and_sent_once(coms_dir: Path) -> None:
    # promise 1: a restarted Peer sends all it owes; one still in flight is not sent twice,
    # and is taken (True), not refused as if the pool were full; once done, it may go again
    gate = threading.Event()
    asker = Asker(coms_dir / "a.sock", gate=gate)
    pool, done = ResponsePool(), Done()
    assert pool.submit(asker.endpoint, LINE, 5.0, NEVER, done("q"), key=("q", "o"))
    assert pool.submit(asker.endpoint, LINE, 5.0, NEVER, done("again"), key=("q", "o"))
    gate.set()
    wait_for(lambda: "q" in done.outcomes, what="the ack")
    edge_caught_up()
    assert done.outcomes == {"q": None} and asker.lines == [LINE]
    assert pool.submit(asker.endpoint, LINE, 5.0, NEVER, done("later"), key=("q", "o"))
    wait_for(lambda: "later" in done.outcomes, what="the second ack")
    assert asker.lines == [LINE, LINE]


def test_a_nack_is_final_and_says_why(coms_dir: Path) -> None:  # W15
    asker = Asker(coms_dir / "a.sock", lambda _: b'{"type":"nack","error":"no such qid"}\n')
    pool, done = ResponsePool(), Done()
    pool.submit(asker.endpoint, LINE, 5.0, NEVER, done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the nack")
    assert done.outcomes == {"q": "nack: no such qid"}
    assert asker.connections == 1  # a nack is an answer: not tried again
    assert send_envelope(asker.endpoint, LINE, 5.0) == ("nack: no such qid", True)


@pytest.mark.parametrize("gone", ["missing", "refused"])
def test_an_asker_that_is_gone_is_final_at_once(coms_dir: Path, gone: str) -> None:  # W15
    path = coms_dir / "gone.sock"
    if gone == "refused":  # a socket file nobody listens on
        leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        leftover.bind(str(path))
        leftover.close()
    pool, done = ResponsePool(), Done()
    pool.submit(str(path), LINE, 5.0, NEVER, done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the refusal, before any retry")
    expected = ("[Errno 2] No such file or directory" if gone == "missing"
                else "[Errno 111] Connection refused")
    assert done.outcomes == {"q": expected}
    assert send_envelope(str(path), LINE, 5.0) == (expected, True)


def test_a_reply_without_a_newline_then_eof_is_judged(coms_dir: Path) -> None:  # W12
    asker = Asker(coms_dir / "a.sock", lambda _: b'{"type":"ack"}')
    pool, done = ResponsePool(), Done()
    pool.submit(asker.endpoint, LINE, 5.0, (), done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the reply")
    assert done.outcomes == {"q": None}


@pytest.mark.parametrize("how", ["split", "linger"])
def test_a_reply_in_two_writes_or_without_a_close_is_an_ack(coms_dir: Path, how: str) -> None:
    # W12, W15: the reply is one line, however it arrives; the sender does not wait
    # for the asker to close once the line is in
    asker = Asker(coms_dir / "a.sock", split=how == "split", linger=how == "linger")
    pool, done = ResponsePool(), Done()
    pool.submit(asker.endpoint, LINE, 30.0, (), done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the ack")
    assert done.outcomes == {"q": None}
    assert send_envelope(asker.endpoint, LINE, 30.0) == (None, True)  # not its timeout


def padded_ack(line_bytes: int) -> bytes:
    """An ack whose line is `line_bytes` long before its newline."""
    head = b'{"type":"ack","msg_id":"q","pad":"'
    return head + b"x" * (line_bytes - len(head) - 2) + b'"}\n'


@pytest.mark.parametrize("split", [False, True])
def test_at_most_max_reply_bytes_of_a_reply_are_read(coms_dir: Path, split: bool) -> None:
    # W15, bounded: a reply is judged on its first MAX_REPLY bytes at most, however it
    # is cut into writes: an ack of exactly that many is whole, one byte more is cut
    # short of its closing brace and is no ack
    assert responses.MAX_REPLY == 65536
    fits = padded_ack(responses.MAX_REPLY)
    asker = Asker(coms_dir / "a.sock", lambda _: fits, split=split, linger=True)
    assert send_envelope(asker.endpoint, LINE, 30.0) == (None, True)
    long = padded_ack(responses.MAX_REPLY + 1)
    over = Asker(coms_dir / "b.sock", lambda _: long, split=split, linger=True)
    assert send_envelope(over.endpoint, LINE, 30.0) == (
        "unexpected reply: " + long[:200].decode(), True)
    pool, done = ResponsePool(), Done()
    pool.submit(over.endpoint, LINE, 30.0, NEVER, done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the long reply judged")
    assert done.outcomes == {"q": "unexpected reply: " + long[:200].decode()}
    assert over.connections == 2  # final: never tried again


def test_a_reply_nested_past_the_parsers_depth_is_judged_not_fatal(coms_dir: Path) -> None:
    # json.loads raises RecursionError, not ValueError, for this: the sender must go on
    asker = Asker(coms_dir / "a.sock", lambda _: b"[" * 100_000 + b"\n")
    good = Asker(coms_dir / "b.sock")
    pool, done = ResponsePool(), Done()
    pool.submit(asker.endpoint, LINE, 5.0, NEVER, done("deep"))
    wait_for(lambda: "deep" in done.outcomes, what="the odd reply judged")
    assert done.outcomes["deep"] == "unexpected reply: " + "[" * 200
    assert asker.connections == 1  # an answer, if a strange one: final
    pool.submit(good.endpoint, LINE, 5.0, (), done("next"))
    wait_for(lambda: "next" in done.outcomes, what="the next send")
    assert done.outcomes["next"] is None
    assert send_envelope(asker.endpoint, LINE, 5.0) == ("unexpected reply: " + "[" * 200, True)


@pytest.mark.parametrize(("reply", "outcome"), [
    (b'{"type":"ack","msg_id":"q"}\n{"type":"nack"}\n', (None, True)),  # the first line decides
    (b'{"type":"nack","error":"busy"}\n', ("nack: busy", True)),
    (b"[1, 2]\n", ("unexpected reply: [1, 2]", True)),  # JSON, not an object
    (b'{"type":"ack","n":NaN}\n',
     ('unexpected reply: {"type":"ack","n":NaN}', True)),  # not JSON to a JavaScript peer
    (b'"nack"\n', ('unexpected reply: "nack"', True)),
    (b"\xff\xfe{}\n", ("unexpected reply: \ufffd\ufffd{}", True)),  # not UTF-8: still judged
    (b"x" * 300 + b"\n", ("unexpected reply: " + "x" * 200, True)),  # quoted, cut to 200
    (b'{"type":"pong","x":"' + b"y" * 300 + b'"}\n',
     ("unexpected reply: " + ('{"type":"pong","x":"' + "y" * 300)[:200], True)),  # JSON too
    (b"", ("connection closed without a reply", False)),
    (b"  \n", ("connection closed without a reply", False)),
])
def test_judge_reply(reply: bytes, outcome: tuple[str | None, bool]) -> None:  # W15
    assert judge_reply(reply) == outcome


def test_a_failure_without_words_is_named_by_its_kind() -> None:
    assert responses.failure(TimeoutError()) == "TimeoutError"
    assert responses.failure(OSError(2, "No such file")) == "[Errno 2] No such file"


# -- retries ---------------------------------------------------------------------------


def test_a_closed_connection_without_a_reply_is_retried(coms_dir: Path) -> None:  # W15
    asker = Asker(coms_dir / "a.sock", lambda _: b"")
    pool, done = ResponsePool(), Done()
    pool.submit(asker.endpoint, LINE, 5.0, (0.05, 0.05), done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the last try")
    assert done.outcomes == {"q": "connection closed without a reply"}
    assert asker.connections == 3  # the first try and one per pause
    assert send_envelope(asker.endpoint, LINE, 5.0) == ("connection closed without a reply", False)


def test_a_silent_asker_is_retried_after_each_pause_while_others_are_served(
    coms_dir: Path,
) -> None:  # W15; a send waiting for its asker holds no thread and holds up no other
    slow = Asker(coms_dir / "slow.sock", lambda _: None)
    stuck = Asker(coms_dir / "stuck.sock", lambda _: None)
    fast = Asker(coms_dir / "fast.sock")
    pool, done = ResponsePool(), Done()
    began = time.monotonic()
    pool.submit(slow.endpoint, LINE, 0.2, (0.3, 0.3), done("slow"))
    pool.submit(stuck.endpoint, LINE, 600.0, (), done("stuck"))
    wait_for(lambda: stuck.open_now == 1, what="stuck waiting for its ack")
    pool.submit(fast.endpoint, LINE, 5.0, (), done("fast"))
    wait_for(lambda: "fast" in done.outcomes, what="fast served while stuck waits")
    wait_for(lambda: "slow" in done.outcomes, what="slow given up")
    assert done.outcomes == {"fast": None, "slow": "timed out"}  # stuck: still waiting
    assert slow.connections == 3  # the first try and two retries
    assert done.at["slow"] - began >= 3 * 0.2 + 0.3 + 0.3  # each try waited its timeout
    assert send_envelope(slow.endpoint, LINE, 0.2) == ("timed out", False)  # worth a retry


def test_a_full_backlog_is_waited_out_until_the_timeout(coms_dir: Path) -> None:  # W15
    path = coms_dir / "full.sock"
    full_backlog(path)
    pool, done = ResponsePool(), Done()
    began = time.monotonic()
    pool.submit(str(path), LINE, 0.3, (), done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the timeout")
    assert done.outcomes == {"q": "timed out"}
    assert done.at["q"] - began >= 0.3
    # the blocking send gives up at once (EAGAIN) rather than waiting: worth a retry too
    assert send_envelope(str(path), LINE, 0.3)[1] is False


def test_a_full_backlog_is_tried_again_until_there_is_room(coms_dir: Path) -> None:  # W15
    path = coms_dir / "busy.sock"
    server, fillers = full_backlog(path)
    pool, done = ResponsePool(), Done()
    pool.submit(str(path), LINE, 30.0, (), done("q"))
    edge_caught_up()  # its first connect has met the full backlog
    assert "q" not in done.outcomes

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                if read_line(conn).strip():
                    conn.sendall(b'{"type":"ack"}\n')

    threading.Thread(target=serve, daemon=True).start()
    for filler in fillers:
        filler.close()  # room at last
    wait_for(lambda: "q" in done.outcomes, what="the ack")
    assert done.outcomes == {"q": None}


def serve_badly(path: Path, handle: Callable[[socket.socket], object]) -> list[int]:
    """A peer at `path` that accepts and then mishandles each connection with `handle`
    (then closes it); how many it accepted. It goes when the test's pools and askers do."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    accepted: list[int] = []

    def serve() -> None:
        with server:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                accepted.append(1)
                with conn:
                    handle(conn)

    threading.Thread(target=serve, daemon=True).start()
    CLOSE_AT_THE_END.append(server)
    return accepted


def test_an_asker_that_drops_the_connection_unread_is_tried_again(coms_dir: Path) -> None:
    # it closes with the line unread: the read fails (reset), which may pass
    accepted = serve_badly(coms_dir / "rude.sock",
                           lambda conn: select.select([conn], [], [], 5))  # the line is there
    pool, done = ResponsePool(), Done()
    pool.submit(str(coms_dir / "rude.sock"), LINE, 5.0, (0.01,), done("q"))
    wait_for(lambda: "q" in done.outcomes, what="given up")
    assert done.outcomes == {"q": "[Errno 104] Connection reset by peer"}
    assert len(accepted) == 2  # the first try and one retry


def test_an_asker_that_hangs_up_mid_line_is_tried_again(coms_dir: Path) -> None:
    # a line larger than the socket's buffer is still being written when it goes
    accepted = serve_badly(coms_dir / "gone.sock", lambda conn: conn.recv(1024))
    big = b'{"type":"response","msg_id":"q","x":"' + b"y" * 4_000_000 + b'"}\n'
    pool, done = ResponsePool(), Done()
    pool.submit(str(coms_dir / "gone.sock"), big, 5.0, (0.01,), done("q"))
    wait_for(lambda: "q" in done.outcomes, what="given up")
    assert done.outcomes["q"] in ("[Errno 32] Broken pipe", "[Errno 104] Connection reset by peer")
    assert len(accepted) == 2


# -- endpoints no socket can have --------------------------------------------------------


def test_an_endpoint_too_long_for_a_socket_is_a_failure_worth_no_wait(coms_dir: Path) -> None:
    # a sender_endpoint longer than a unix socket address may be: said, not raised
    endpoint = str(coms_dir / ("x" * 200))
    pool, done = ResponsePool(), Done()
    pool.submit(endpoint, LINE, 5.0, (0.05, 0.05), done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the failure")
    assert done.outcomes == {"q": "AF_UNIX path too long"}
    assert send_envelope(endpoint, LINE, 5.0) == ("AF_UNIX path too long", False)


UNENCODABLE = ("'utf-8' codec can't encode character '\\ud800' in position 6: "
               "surrogates not allowed")


def test_a_path_no_socket_can_have_is_final_at_once() -> None:
    # a lone surrogate cannot be encoded: the endpoint will never do
    pool, done = ResponsePool(), Done()
    pool.submit("/tmp/a\ud800b.sock", LINE, 5.0, NEVER, done("q"))
    wait_for(lambda: "q" in done.outcomes, what="the failure, before any retry")
    assert done.outcomes == {"q": UNENCODABLE}
    assert send_envelope("/tmp/a\ud800b.sock", LINE, 5.0) == (UNENCODABLE, True)


# -- the pool's own bounds and faults ------------------------------------------------------


def test_the_pool_refuses_past_its_capacity_until_a_send_is_done(coms_dir: Path) -> None:
    # W15: at most RESPONSE_QUEUE responses wait or are sent at once; past it, refused
    assert ResponsePool().capacity == RESPONSE_QUEUE == 20_000
    gate = threading.Event()
    asker = Asker(coms_dir / "a.sock", gate=gate)
    pool, done = ResponsePool(capacity=2), Done()
    assert pool.submit(asker.endpoint, LINE, 5.0, (), done("a"))
    assert pool.submit(asker.endpoint, LINE, 5.0, (), done("b"))
    assert not pool.submit(asker.endpoint, LINE, 5.0, (), done("c"))
    gate.set()
    wait_for(lambda: len(done.outcomes) == 2, what="both sent")
    assert done.outcomes == {"a": None, "b": None}
    assert pool.submit(asker.endpoint, LINE, 5.0, (), done("d"))
    wait_for(lambda: "d" in done.outcomes, what="d sent")
    assert asker.connections == 3  # c was never sent


class _Sockets:
    """The response sender's own sockets, counted as it makes and closes them (the
    asker's count lags: its handler notes a close only after the sender has moved on)."""

    def __init__(self) -> None:
        self.open_now = self.most_open = 0
        self._lock = threading.Lock()
        counter = self

        class Counted(socket.socket):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._counted = True
                with counter._lock:
                    counter.open_now += 1
                    counter.most_open = max(counter.most_open, counter.open_now)

            def close(self) -> None:
                if self.__dict__.pop("_counted", False):
                    with counter._lock:
                        counter.open_now -= 1
                super().close()

        self.module = socket_module(Counted)


def test_at_most_flights_sends_hold_a_socket_at_once_in_the_order_given(
    coms_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # bounded descriptors; the rest wait their turn, first come first sent
    gate = threading.Event()
    asker = Asker(coms_dir / "a.sock", gate=gate)
    sockets = _Sockets()
    monkeypatch.setattr(responses, "socket", sockets.module)
    pool, done = ResponsePool(flights=3), Done()
    lines = [b'{"type":"response","msg_id":"q%d"}\n' % i for i in range(10)]
    for i, line in enumerate(lines):
        assert pool.submit(asker.endpoint, line, 5.0, (), done(f"q{i}"))
    wait_for(lambda: len(asker.lines) == 3, what="three in flight")
    edge_caught_up()  # every send has had its turn to take a socket, if the bound let it
    assert (sockets.most_open, sockets.open_now, asker.open_now) == (3, 3, 3)
    assert sorted(asker.lines) == lines[:3]  # the first three given
    assert done.outcomes == {}  # the other seven wait their turn
    gate.set()
    wait_for(lambda: len(done.outcomes) == 10, what="every send")
    assert set(done.outcomes.values()) == {None}
    assert sorted(asker.lines) == sorted(lines)
    assert (sockets.most_open, sockets.open_now) == (3, 0)  # never a fourth, none left open


def test_a_line_larger_than_the_socket_buffer_is_written_in_parts(coms_dir: Path) -> None:
    big = b'{"type":"response","msg_id":"q","response":"' + b"x" * 2_000_000 + b'"}\n'
    gate = threading.Event()
    asker = Asker(coms_dir / "a.sock", gate=gate)
    own = Edge("test-big-line")  # its selector holds this send's socket alone
    pool, done = ResponsePool(edge=own), Done()
    try:
        pool.submit(asker.endpoint, big, 30.0, (), done("q"))
        wait_for(lambda: asker.lines, timeout=10, what="the whole line read")
        # waiting for the ack, the socket is watched for reading only: writable, it would
        # wake the loop at every turn
        events = concurrent.futures.Future[list[int]]()
        loop = own.loop
        loop.call_soon_threadsafe(lambda: events.set_result(
            [key.events for key in loop._selector.get_map().values()]))  # type: ignore[attr-defined]
        assert len(events.result(5)) == 2  # the loop's own wake-up pipe, and the send's socket
        assert not any(mask & selectors.EVENT_WRITE for mask in events.result(5))
        gate.set()
        wait_for(lambda: "q" in done.outcomes, timeout=10, what="the big line acked")
        assert done.outcomes == {"q": None}
        assert asker.lines == [big]
    finally:
        close_edge(own)


def test_a_send_that_faults_fails_alone(
    coms_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # a fault in one send (here: no memory for its socket) is that send's failure
    asker = Asker(coms_dir / "a.sock")
    pool, done = ResponsePool(), Done()
    faults = [OSError(12, "Cannot allocate memory")]

    def make(*args: Any, **kwargs: Any) -> socket.socket:
        if faults:
            raise faults.pop()
        return socket.socket(*args, **kwargs)

    monkeypatch.setattr(responses, "socket", socket_module(make))
    pool.submit(asker.endpoint, LINE, 5.0, (), done("a"))
    wait_for(lambda: "a" in done.outcomes, what="the first outcome")
    pool.submit(asker.endpoint, LINE, 5.0, (), done("b"))
    wait_for(lambda: len(done.outcomes) == 2, what="both outcomes")
    assert done.outcomes == {"a": "[Errno 12] Cannot allocate memory", "b": None}
