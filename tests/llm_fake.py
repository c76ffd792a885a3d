"""A fake OpenAI-compatible model endpoint on 127.0.0.1 for the real Hermes gateway, so a
test can hold an agent turn running for exactly as long as it needs (a busy chat, X14).

It answers every chat completion with one fixed line, at once, except, once the test has
called `hold()`, the next request whose newest user message contains `hold_on`: that one
waits until the test calls `release()` (or its deadline passes), so "a turn is running"
is a fact the test observes, not a guess about timing. Streaming requests get the same line as server-sent events.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fake-model"
REPLY = "Noted."
HOLD_DEADLINE_S = 60.0


class FakeLLM:
    def __init__(self, hold_on: str) -> None:
        self.hold_on = hold_on
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._held = threading.Event()
        self._armed = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:  # quiet: the test reads requests()
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._json({"object": "list",
                                "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}]})
                else:
                    self._json({"error": {"message": "not found"}}, 404)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._json({"error": {"message": "not found"}}, 404)
                    return
                with fake._lock:
                    fake._requests.append(body)
                    hold = fake._armed and fake.hold_on in fake.last_user_text(body)
                    fake._armed = fake._armed and not hold
                if hold:
                    fake._held.set()
                    fake._released.wait(HOLD_DEADLINE_S)
                try:
                    self._complete(bool(body.get("stream")))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the gateway gave up on this call (an interrupt): nothing to say

            def _json(self, payload: dict[str, Any], status: int = 200) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _complete(self, stream: bool) -> None:
                base = {"id": "chatcmpl-fake", "created": int(time.time()), "model": MODEL}
                if not stream:
                    self._json({**base, "object": "chat.completion", "choices": [{
                        "index": 0, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": REPLY}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                  "total_tokens": 2}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                chunks = [
                    {"index": 0, "delta": {"role": "assistant", "content": REPLY},
                     "finish_reason": None},
                    {"index": 0, "delta": {}, "finish_reason": "stop"},
                ]
                for choice in chunks:
                    event = {**base, "object": "chat.completion.chunk", "choices": [choice]}
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @staticmethod
    def last_user_text(body: dict[str, Any]) -> str:
        """The newest user message of a chat request, its text parts joined."""
        for message in reversed(body.get("messages") or []):
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, list):
                return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
        return ""

    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    def hold(self) -> None:
        """Hold the next request for `hold_on` until `release()`."""
        with self._lock:
            self._armed = True
            self._held.clear()
            self._released.clear()

    def holding(self) -> bool:
        """Whether the held request has arrived: a turn is running in the chat."""
        return self._held.is_set()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
