"""The `coms-hermes-bridge` command: the main thread takes the lock, installs the signal
handlers before anything is published (W7), starts the tree and waits; a signal or a
give-up stops it (the Peer first, W8) with exit 0, or 1 when it gave up."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
import stat
import sys
import threading
from types import FrameType

import pykka

from .config import BridgeConfig, UsageError, parse_config
from .loop import report, utc_now
from .peer import PeerActor
from .registry import (
    EXIT_ALREADY_RUNNING,
    AlreadyRunning,
    IdentityError,
    PeerIdentity,
    instance_lock_path,
    read_entry,
    remove_entry_if_ours,
    resolve_identity,
    take_instance_lock,
    validate_name,
    validate_project,
)
from .service import ServiceLink
from .store import Store, UnusableStateError
from .supervisor import start_tree

SHUTDOWN_BUDGET_S = 1.5


def _quiet_pykka() -> None:
    """Crashes are one line from the supervisors; tracebacks only on request."""
    if os.environ.get("COMS_HERMES_BRIDGE_DEBUG"):
        logging.basicConfig(level=logging.DEBUG)
    else:
        logging.getLogger("pykka").setLevel(logging.CRITICAL)


def published(identity: PeerIdentity) -> bool:
    """Our entry is up, so the socket is (the Peer listens first, W7)."""
    entry = read_entry(identity.entry_path)
    return entry is not None and entry.session_id == identity.session_id


def unpublish_if_left(identity: PeerIdentity) -> bool:
    """W8 whatever the stops managed (a Peer stuck behind a backlog may not have released):
    our own entry goes, and the endpoint if it is a socket. True if the entry was there."""
    if not remove_entry_if_ours(identity.entry_path, identity.session_id):
        return False
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(identity.endpoint).st_mode):
            os.unlink(identity.endpoint)
    return True


def run(config: BridgeConfig) -> int:
    """The exit code. X13: the lock comes before the registry and state are touched, and is
    held to the very end."""
    try:
        validate_project(config.project)
        validate_name(config.name)
        lock = take_instance_lock(instance_lock_path(config.coms_dir, config.project,
                                                     config.name))
    except IdentityError as exc:
        report(str(exc))
        return 1
    except AlreadyRunning as exc:
        holder = f"pid {exc.pid}" if exc.pid is not None else "its pid not written yet"
        report(f"{config.name}@{config.project} already has a bridge running ({holder});"
               f" not starting a second one (lock {exc.path})", "error")
        return EXIT_ALREADY_RUNNING
    except OSError as exc:
        report(f"cannot prepare the coms directory {config.coms_dir}: {exc.strerror or exc}",
               "error")
        return 1
    try:
        return _serve(config)
    finally:
        os.close(lock)  # the kernel would let go at exit; an in-process run lets go here


def _serve(config: BridgeConfig) -> int:
    fatal = threading.Event()  # set from the supervisor's thread
    exit_code = [0]
    # A handler may run inside Event.wait, holding the event's lock: it takes no lock
    # (Event.set would deadlock), only records the signal.
    signalled: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not signalled:  # the first names the stop; a flood of them holds nothing more
            signalled.append(signal.Signals(signum).name)

    def on_fatal(reason: str) -> None:
        exit_code[0] = 1
        fatal.set()

    def running(interval: float) -> bool:
        return not signalled and not fatal.wait(interval)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    link = ServiceLink.from_env(os.environ)
    for notice in config.notices:
        report(notice, "warning")
    try:
        identity = resolve_identity(
            config.coms_dir,
            config.project,
            config.name,
            cwd=os.getcwd(),
            pid=os.getpid(),
            now=utc_now(),
        )
    except OSError as exc:
        report(
            f"cannot prepare the coms directory {config.coms_dir}: {exc.strerror or exc}", "error"
        )
        return 1
    try:
        store = Store.open(config.state_path)
    except UnusableStateError as exc:  # the line says what to do
        report(str(exc), "error")
        return 1
    except OSError as exc:
        report(f"cannot open the state database {config.state_path}: {exc}", "error")
        return 1
    try:
        tree = start_tree(config=config, identity=identity, on_fatal=on_fatal, store=store)
    except (RuntimeError, OSError) as exc:  # no thread or loop to be had (a pids limit, say)
        report(f"cannot start the actors: {type(exc).__name__}: {exc}", "error")
        with contextlib.suppress(sqlite3.Error):
            store.shutdown()
        return 1
    report(f"starting as peer {identity.name} in coms project {config.project} (agents must "
           f"use this project to ask), hermes target {config.target}", "info")
    while running(0.02):  # ready: published (W7), and the Router answers
        if not published(identity):
            continue
        try:
            count = tree.queue_depth()
        except TimeoutError:
            continue
        report(f"ready: {identity.name}@{config.project} at {identity.endpoint},"
               f" {count} open question(s)", "info")
        link.ready(count)
        link.start_watchdog(tree.queue_depth)  # pings only while the tree answers
        while running(0.2):  # a signal is seen at the next timeout at the latest
            pass
        break
    link.stopping()
    why = f"on {signalled[0]}" if signalled else "giving up"
    report(f"stopping {why} (exit {exit_code[0]})", "info" if exit_code[0] == 0 else "error")
    try:
        tree.root.stop(timeout=SHUTDOWN_BUDGET_S)
    except pykka.Timeout:
        report("shutdown took too long; exiting anyway", "warning")
    except pykka.ActorDeadError:
        pass
    # a dead root leaves its children up: the Peer at least must go (W8)
    for peer in pykka.ActorRegistry.get_by_class(PeerActor):
        try:
            peer.stop(timeout=0.3)
        except (pykka.Timeout, pykka.ActorDeadError):
            pass
    # each last step on its own: a failure is one line, and the exit code stays
    for step, action in (
        ("stop the actors", lambda: pykka.ActorRegistry.stop_all(block=False)),
        ("remove the registry entry", lambda: unpublish_if_left(identity)),
        ("close the state database", store.shutdown),
        ("close the service link", link.close),
    ):
        try:
            action()
        except Exception as exc:  # the process's last steps: each runs whatever came before
            report(f"while stopping, could not {step}: {exc!r}", "warning")
    return exit_code[0]


def main(argv: list[str] | None = None) -> int:
    _quiet_pykka()
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
    except UsageError as exc:
        report(str(exc))
        return 1
    return run(config)
