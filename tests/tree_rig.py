"""The whole actor tree in one process, with a fake hermes and a real asker.

For tests that need the real wire, store and watcher without a daemon process:
crash tests (test_supervisor.py) and property-based runs (test_fuzz.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pykka

from coms_hermes_bridge.actors.config import parse_config
from coms_hermes_bridge.actors.questions import QuestionRouter
from coms_hermes_bridge.actors.registry import resolve_identity
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.actors.supervisor import Tree as ActorTree
from coms_hermes_bridge.actors.supervisor import start_tree
from tests.fakes import Asker, read_ndjson, request, wait_for
from tests.hermes_fake import FakeHermes


class Boom:
    """No actor takes this: telling it is how a test injects a crash."""


@dataclass
class Tree:
    tree: ActorTree
    store: Store
    asker: Asker
    hermes: FakeHermes
    questions: Path
    endpoint: str
    fatal: list[str]
    fatal_event: threading.Event
    session_id: str = ""

    def ask(self, text: str) -> str:
        env = self.asker.prompt_envelope(text)
        assert request(self.endpoint, env) == {"type": "ack", "msg_id": env["msg_id"]}
        return str(env["msg_id"])

    def answer(self, qid: str, text: str) -> None:
        body = {"qid": qid, "answer": text, "answered_by": "telegram:a", "at": "2026-11-30T12:00:00Z"}
        self.drop(f"{qid}.answer.json", json.dumps(body).encode())

    def drop(self, name: str, content: bytes) -> Path:
        """Put a file in the questions directory as the gateway does: a temp name, a rename."""
        tmp = self.questions.parent / f"{name}.tmp"
        tmp.write_bytes(content)
        target = self.questions / name
        tmp.rename(target)
        return target

    def log_records(self) -> list[dict[str, Any]]:
        return read_ndjson(self.questions.parent / "log.ndjson")

    def child_ref(self, name: str) -> Any:
        return self.tree.slots[name].ref

    def crash(self, name: str) -> Any:
        before = self.child_ref(name)
        self.tree.slots[name].tell(Boom())
        return wait_for(lambda: (r := self.child_ref(name)) is not before and r, what=f"{name} restarted")

    @property
    def router(self) -> QuestionRouter:
        actor = self.child_ref("router")._actor_weakref()  # white-box: the table
        assert actor is not None
        return actor  # type: ignore[no-any-return]

    def state(self, qid: str) -> Any:
        question = self.router.open.get(qid)
        if question is None:
            return None
        spec = self.store.open_spec(qid, question.child)
        return spec.state if spec is not None else None


@contextmanager
def running_tree(*flags: str, options: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None) -> Iterator[Tree]:
    """Start the tree (with daemon `flags`, and `env` beside its HOME and PI_COMS_DIR),
    wait for the peer, stop it all afterwards. `options` go to start_tree (3 restarts in
    10 s unless they say otherwise)."""
    base = Path(tempfile.mkdtemp(prefix="chs", dir="/tmp"))
    hermes = FakeHermes(base / "bin")
    env = {"HOME": str(base / "h"), "PI_COMS_DIR": str(base / "c"), **(env or {})}
    config = parse_config(["--poll-ms", "100", *flags], env)
    config = type(config)(**{**config.__dict__, "hermes": str(hermes.path)})
    identity = resolve_identity(
        config.coms_dir, config.project, config.name, cwd="/", pid=12345678, now=datetime.now(UTC)
    )
    fatal: list[str] = []
    event = threading.Event()

    def on_fatal(reason: str) -> None:
        fatal.append(reason)
        event.set()

    store = Store.open(config.state_path)
    actors = start_tree(config=config, identity=identity, store=store, on_fatal=on_fatal,
                        **({"max_restarts": 3, "window_s": 10} if options is None else options))
    entry = config.coms_dir / "projects" / "default" / "agents" / "user-remote.json"
    wait_for(entry.exists, what="peer ready")
    asker = Asker.beside(base)
    yield Tree(actors, store, asker, hermes, config.questions_dir, str(identity.endpoint), fatal,
               event, identity.session_id)
    pykka.ActorRegistry.stop_all()
    store.shutdown()
    asker.close()
    shutil.rmtree(base, ignore_errors=True)
