"""Test doubles for collaborator actors: a ref that records what it is told."""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class FakeRef:
    """Records every `tell` in a queue, as a stand-in for a collaborator's address."""

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.seen: list[Any] = []

    def tell(self, message: Any) -> None:
        self.inbox.put(message)

    def expect(self, kind: type[T], timeout: float = 5.0) -> T:
        """The next message of type `kind`, skipping others (kept in `seen`)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no {kind.__name__} within {timeout}s; saw {self.seen}")
            try:
                message = self.inbox.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(message)
            if isinstance(message, kind):
                return message

    def next(self, timeout: float = 5.0) -> Any:
        """The next message, whatever it is."""
        try:
            message = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name}: nothing told within {timeout}s") from None
        self.seen.append(message)
        return message

    def quiet(self, within: float = 0.2) -> None:
        """Assert nothing more is told within `within` seconds."""
        try:
            message = self.inbox.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(f"{self.name}: unexpected {message!r}")


def wait_for(
    condition: Callable[[], T | None], timeout: float = 5.0, what: str = "condition"
) -> T:
    """Poll `condition` until it is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def read_line(conn: socket.socket) -> bytes:
    """Bytes up to and including the first newline, or all there was before EOF."""
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf
