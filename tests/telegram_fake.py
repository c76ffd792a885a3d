"""A fake Telegram Bot API for the real `hermes send` (tests/test_real_hermes.py).

hermes reaches Telegram through python-telegram-bot over httpx; with TELEGRAM_PROXY set
it asks that proxy for `CONNECT api.telegram.org:443`. This module is that proxy: it
answers the CONNECT itself, terminates TLS with a certificate for api.telegram.org
signed by a throwaway CA (trusted through SSL_CERT_FILE), and serves the Bot API over
HTTP/1.1 inside the tunnel.

It parses text as Telegram does (HTML and MarkdownV2 parse modes, refused with
Telegram's 400 "can't parse entities" when the markup is wrong) and records what the
human would read: the rendered plain text of each delivered message, in order, with
its chat, thread and any uploaded file. It can also answer as Telegram does when
things go wrong: an unknown chat, 429 with retry_after, a slow answer, an unreachable
proxy.
"""

from __future__ import annotations

import contextlib
import email.parser
import email.policy
import json
import re
import socket
import socketserver
import ssl
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tests.fakes import wait_for

TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijkl"
BOT = {"id": 123456789, "is_bot": True, "first_name": "Hermes", "username": "hermes_test_bot"}
MAX_TEXT = 4096  # UTF-16 code units, after the markup is parsed
MAX_CAPTION = 1024

# -- TLS ----------------------------------------------------------------------------

# Run by the hermes venv's Python, which has `cryptography` (a hermes-agent dependency).
_CERT_SCRIPT = r"""
import datetime, sys
from pathlib import Path
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

out = Path(sys.argv[1])
now = datetime.datetime.now(datetime.timezone.utc)
start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=7)
ca_key = ec.generate_private_key(ec.SECP256R1())
ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coms-hermes-bridge test CA")])
ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
ca = (
    x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
    .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
    .not_valid_before(start).not_valid_after(end)
    .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=False,
        key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
        critical=True)
    .add_extension(ca_ski, critical=False)
    .sign(ca_key, hashes.SHA256())
)
key = ec.generate_private_key(ec.SECP256R1())
leaf = (
    x509.CertificateBuilder()
    .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "api.telegram.org")]))
    .issuer_name(ca_name).public_key(key.public_key())
    .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
    .add_extension(x509.SubjectAlternativeName([x509.DNSName("api.telegram.org")]),
        critical=False)
    .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=True,
        key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False),
        critical=True)
    .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
        critical=False)
    .sign(ca_key, hashes.SHA256())
)
pem = serialization.Encoding.PEM
(out / "ca.pem").write_bytes(ca.public_bytes(pem))
(out / "server.pem").write_bytes(leaf.public_bytes(pem))
(out / "server.key").write_bytes(key.private_bytes(
    pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
"""


@dataclass(frozen=True)
class Tls:
    """A throwaway CA (`ca`, for SSL_CERT_FILE) and api.telegram.org's cert and key."""

    ca: Path
    cert: Path
    key: Path


def make_tls(directory: Path, python: str | Path) -> Tls:
    """Make the CA and the server certificate with `python` (one that has cryptography)."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(python), "-c", _CERT_SCRIPT, str(directory)],
        check=True, capture_output=True, timeout=60,
    )
    return Tls(directory / "ca.pem", directory / "server.pem", directory / "server.key")


# -- Telegram's parse modes ------------------------------------------------------------


class ParseError(Exception):
    """Telegram's `can't parse entities` refusal; `str()` is the part after that prefix."""


def _offset(text: str, index: int) -> int:
    """Telegram reports positions as byte offsets into the UTF-8 text."""
    return len(text[:index].encode("utf-8", "surrogatepass"))


HTML_TAGS = frozenset({
    "a", "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span",
    "tg-spoiler", "tg-emoji", "code", "pre", "blockquote",
})
_NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


def _html_entity(text: str, i: int) -> tuple[str, int] | None:
    """The character an entity at text[i] == '&' stands for and where it ends.

    Only &lt; &gt; &amp; &quot; and numeric references are entities; anything else
    is a literal '&' (Telegram does not refuse it). The closing ';' may be missing.
    """
    n, j = len(text), i + 1
    if j < n and text[j] == "#":
        j += 1
        hexa = j < n and text[j] in "xX"
        if hexa:
            j += 1
        digits = "0123456789abcdefABCDEF" if hexa else "0123456789"
        start = j
        while j < n and text[j] in digits:
            j += 1
        if j == start or j - i >= 10:
            return None
        code = int(text[start:j], 16 if hexa else 10)
        if code == 0 or code >= 0x10FFFF or 0xD800 <= code < 0xE000:
            return None
        char = chr(code)
    else:
        while j < n and text[j].isascii() and text[j].isalpha():
            j += 1
        name = text[i + 1 : j]
        if name not in _NAMED_ENTITIES:
            return None
        char = _NAMED_ENTITIES[name]
    if j < n and text[j] == ";":
        j += 1
    return char, j


def _html_attributes(text: str, i: int, begin: int) -> tuple[dict[str, str], int]:
    """Attributes of a start tag from text[i] up to its '>'; returns them and the index
    after the '>'."""
    attrs: dict[str, str] = {}
    n = len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            raise ParseError(f"Unclosed start tag at byte offset {_offset(text, begin)}")
        if text[i] == ">":
            return attrs, i + 1
        start = i
        while i < n and not text[i].isspace() and text[i] not in "=>":
            i += 1
        name = text[start:i].lower()
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            raise ParseError(f"Unclosed start tag at byte offset {_offset(text, begin)}")
        if text[i] != "=":
            attrs[name] = ""
            continue
        i += 1
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            raise ParseError(f"Unclosed start tag at byte offset {_offset(text, begin)}")
        if text[i] in "\"'":
            quote = text[i]
            end = text.find(quote, i + 1)
            if end < 0:
                raise ParseError(f"Unclosed start tag at byte offset {_offset(text, begin)}")
            raw, i = text[i + 1 : end], end + 1
        else:
            start = i
            while i < n and not text[i].isspace() and text[i] != ">":
                i += 1
            raw = text[start:i]
        value, k = [], 0
        while k < len(raw):
            entity = _html_entity(raw, k) if raw[k] == "&" else None
            if entity:
                value.append(entity[0])
                k = entity[1]
            else:
                value.append(raw[k])
                k += 1
        attrs[name] = "".join(value)


def parse_html(text: str) -> str:
    """The plain text a message in parse mode HTML shows, or ParseError as Telegram's."""
    out: list[str] = []
    open_tags: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "&":
            entity = _html_entity(text, i)
            if entity:
                out.append(entity[0])
                i = entity[1]
            else:
                out.append(c)
                i += 1
            continue
        if c != "<":
            out.append(c)
            i += 1
            continue
        begin = i
        i += 1
        if i < n and text[i] == "/":
            end = text.find(">", i)
            if end < 0:
                raise ParseError(f"Unclosed end tag at byte offset {_offset(text, begin)}")
            name = text[i + 1 : end].strip().lower()
            if not open_tags:
                raise ParseError(f"Unexpected end tag at byte offset {_offset(text, begin)}")
            if name != open_tags[-1]:
                raise ParseError(
                    f"Unmatched end tag at byte offset {_offset(text, begin)}, "
                    f'expected "</{open_tags[-1]}>", found "</{name}>"'
                )
            open_tags.pop()
            i = end + 1
            continue
        start = i
        while i < n and not text[i].isspace() and text[i] != ">":
            i += 1
        if i >= n:
            raise ParseError(f"Unclosed start tag at byte offset {_offset(text, begin)}")
        name = text[start:i].lower()
        if name not in HTML_TAGS:
            raise ParseError(f'Unsupported start tag "{name}" at byte offset {_offset(text, begin)}')
        attrs, i = _html_attributes(text, i, begin)
        if name == "span" and attrs.get("class") != "tg-spoiler":
            raise ParseError(
                f'Tag "span" must have class "tg-spoiler" at byte offset {_offset(text, begin)}'
            )
        open_tags.append(name)
    if open_tags:
        raise ParseError(f'Can\'t find end tag corresponding to start tag "{open_tags[-1]}"')
    return "".join(out)


MDV2_RESERVED = frozenset("_*[]()~`>#+-=|{}.!")


@dataclass
class _Open:
    kind: str  # Telegram's entity type names, as its errors spell them
    at: int  # byte offset of the opening marker


def _reserved(c: str) -> ParseError:
    return ParseError(f"Character '{c}' is reserved and must be escaped with the preceding '\\'")


def parse_markdown_v2(text: str) -> str:
    """The plain text a message in parse mode MarkdownV2 shows, or ParseError as Telegram's.

    Every character of `_*[]()~`>#+-=|{}.!` outside an entity's markup must be escaped
    with a backslash; `\\` followed by any ASCII character stands for that character.
    """
    out: list[str] = []
    stack: list[_Open] = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        top = stack[-1].kind if stack else None
        if c == "\\" and i + 1 < n and 0 < ord(text[i + 1]) <= 126:
            out.append(text[i + 1])
            i += 2
            line_start = False
            continue
        if top in ("Code", "Pre"):
            if c == "`" and (top == "Code" or text.startswith("```", i)):
                stack.pop()
                i += 1 if top == "Code" else 3
            else:
                out.append(c)
                i += 1
            continue
        if c not in MDV2_RESERVED:
            out.append(c)
            line_start = c == "\n"
            i += 1
            continue
        if c == ">" and line_start:  # a quoted line: the marker is not shown
            i += 1
            if i < n and text[i] == " ":
                i += 1
            line_start = False
            continue
        line_start = False
        closes = {
            "Bold": c == "*",
            "Italic": c == "_" and not text.startswith("__", i),
            "Underline": text.startswith("__", i),
            "Strikethrough": c == "~",
            "Spoiler": text.startswith("||", i),
            "TextUrl": c == "]",
            "CustomEmoji": c == "]",
        }
        if top is not None and closes.get(top, False):
            opened = stack.pop()
            i += 2 if top in ("Underline", "Spoiler") else 1
            if top in ("TextUrl", "CustomEmoji"):
                if i < n and text[i] == "(":
                    end = i + 1
                    while end < n and text[end] != ")":
                        end += 2 if text[end] == "\\" else 1
                    if end >= n:
                        raise ParseError(
                            f"Can't find end of a url at byte offset {_offset(text, i)}"
                        )
                    i = end + 1
                elif top == "CustomEmoji":
                    raise ParseError(
                        f"Custom emoji entity must contain a tg://emoji URL at byte offset "
                        f"{opened.at}"
                    )
            continue
        at = _offset(text, i)
        if c == "_":
            kind, width = ("Underline", 2) if text.startswith("__", i) else ("Italic", 1)
        elif c == "*":
            kind, width = "Bold", 1
        elif c == "~":
            kind, width = "Strikethrough", 1
        elif c == "|" and text.startswith("||", i):
            kind, width = "Spoiler", 2
        elif c == "[":
            kind, width = "TextUrl", 1
        elif c == "!" and text.startswith("![", i):
            kind, width = "CustomEmoji", 2
        elif c == "`":
            if text.startswith("```", i):
                kind, width = "Pre", 3
                newline = text.find("\n", i + 3)
                language = text[i + 3 : newline] if newline >= 0 else ""
                if newline >= 0 and " " not in language and "`" not in language:
                    width = newline + 1 - i  # the language line is not shown
            else:
                kind, width = "Code", 1
        else:
            raise _reserved(c)
        stack.append(_Open(kind, at))
        i += width
    if stack:
        raise ParseError(f"Can't find end of {stack[-1].kind} entity at byte offset {stack[-1].at}")
    return "".join(out)


def render(text: str, parse_mode: str | None) -> str:
    """What the human reads for `text` sent in `parse_mode` (ParseError if refused)."""
    mode = (parse_mode or "").lower()
    if mode == "html":
        shown = parse_html(text)
    elif mode == "markdownv2":
        shown = parse_markdown_v2(text)
    elif mode in ("", "none"):
        shown = text
    else:
        raise BotApiError(400, "Bad Request: unsupported parse_mode")
    return shown.strip()  # Telegram trims the whitespace around a message


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


# -- what was delivered and asked -----------------------------------------------------


class BotApiError(Exception):
    """An answer `{"ok": false, ...}` with this HTTP status and description."""

    def __init__(self, code: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": False, "error_code": self.code,
                                "description": self.description}
        if self.retry_after is not None:
            body["parameters"] = {"retry_after": self.retry_after}
        return body


@dataclass(frozen=True)
class Upload:
    field: str  # photo, document, video, audio, voice
    filename: str
    content: bytes


@dataclass(frozen=True)
class Seen:
    """One message as it reached the human's chat."""

    message_id: int
    method: str
    chat_id: str
    text: str  # the rendered text, or the caption of a file
    parse_mode: str | None
    thread_id: str | None = None
    upload: Upload | None = None


@dataclass(frozen=True)
class Call:
    """One Bot API request, whatever was answered."""

    method: str
    params: dict[str, str]
    status: int
    description: str | None = None
    uploads: tuple[Upload, ...] = ()


@dataclass
class Faults:
    """How the fake misbehaves from now on (see FakeTelegram.configure)."""

    unknown_chats: frozenset[str] = frozenset()
    too_many: int = 0  # answer this many of the next sends with 429
    retry_after: int = 1
    delay: float = 0.0  # seconds before each send is answered (the message is delivered)
    unreachable: str | None = None  # "refuse": 502 to CONNECT; "close": hang up at once


_SENDS = {"sendmessage": None, "sendphoto": "photo", "senddocument": "document",
          "sendvideo": "video", "sendaudio": "audio", "sendvoice": "voice",
          "sendanimation": "animation"}


@dataclass
class _World:
    tls: Tls
    token: str
    faults: Faults = field(default_factory=Faults)
    seen: list[Seen] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    connects: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closing: threading.Event = field(default_factory=threading.Event)
    # what the human sends the bot, served to getUpdates in order (the gateway's side)
    updates: list[dict[str, Any]] = field(default_factory=list)
    inbound: list[dict[str, Any]] = field(default_factory=list)
    arrived: threading.Condition = field(init=False)
    polls: int = 0  # getUpdates calls answered or waiting

    def __post_init__(self) -> None:
        self.arrived = threading.Condition(self.lock)


def _chat(chat_id: str) -> dict[str, Any]:
    if chat_id.startswith("@"):
        return {"id": -1009999999999, "type": "channel", "title": chat_id[1:],
                "username": chat_id[1:]}
    number = int(chat_id)
    if number > 0:
        return {"id": number, "type": "private", "first_name": "Alice"}
    return {"id": number, "type": "supergroup", "title": "Team"}


class _Proxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    world: _World


class _Handler(socketserver.BaseRequestHandler):
    server: _Proxy
    HOST: ClassVar[str] = "api.telegram.org:443"

    def handle(self) -> None:
        world = self.server.world
        conn: socket.socket = self.request
        conn.settimeout(30)
        rfile = conn.makefile("rb")
        line = rfile.readline(65537)
        while True:  # the CONNECT's headers
            header = rfile.readline(65537)
            if header in (b"\r\n", b"\n", b""):
                break
        parts = line.decode("latin-1").split()
        with world.lock:
            unreachable = world.faults.unreachable
            world.connects.append(" ".join(parts[:2]))
        if unreachable == "close":
            return
        if len(parts) < 2 or parts[0] != "CONNECT" or parts[1] != self.HOST:
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        if unreachable == "refuse":
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(world.tls.cert, world.tls.key)
        try:
            tls = context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            return
        with contextlib.suppress(OSError, ssl.SSLError, ValueError), tls:  # a client gone
            stream = tls.makefile("rb")
            while not world.closing.is_set() and self._exchange(world, stream, tls):
                pass

    def _exchange(self, world: _World, stream: Any, tls: ssl.SSLSocket) -> bool:
        """Serve one HTTP/1.1 request; False when the client is gone."""
        request_line = stream.readline(65537)
        if not request_line.strip():
            return False
        method, target = request_line.decode("latin-1").split()[:2]
        headers: dict[str, str] = {}
        while True:
            raw = stream.readline(65537)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(stream.readline(65537).split(b";")[0].strip() or b"0", 16)
                chunk = stream.read(size + 2)[:size]
                if size == 0:
                    break
                body += chunk
        else:
            body = stream.read(int(headers.get("content-length", "0") or 0))
        status, answer = self._answer(world, method, target, headers, body)
        payload = json.dumps(answer).encode()
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
                  429: "Too Many Requests"}.get(status, "Error")
        tls.sendall(
            f"HTTP/1.1 {status} {reason}\r\nServer: nginx/1.18.0\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: keep-alive\r\n\r\n".encode() + payload
        )
        return True

    def _answer(
        self, world: _World, verb: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, Any]]:
        path = urllib.parse.urlsplit(target).path
        params, uploads = _params(headers.get("content-type", ""), body)
        prefix = f"/bot{world.token}/"
        if not path.startswith("/bot"):
            return 404, BotApiError(404, "Not Found").body()
        if not path.startswith(prefix):
            return 401, BotApiError(401, "Unauthorized").body()
        api = path[len(prefix):]
        try:
            result = self._call(world, api, params, uploads)
        except BotApiError as error:
            with world.lock:
                world.calls.append(Call(api, params, error.code, error.description, uploads))
            return error.code, error.body()
        with world.lock:
            world.calls.append(Call(api, params, 200, None, uploads))
        return 200, {"ok": True, "result": result}

    def _call(
        self, world: _World, api: str, params: dict[str, str], uploads: tuple[Upload, ...]
    ) -> Any:
        name = api.lower()
        if name == "getme":
            return BOT
        if name == "getupdates":
            return _updates(world, params)
        if name in _ANSWERED:
            return _ANSWERED[name]
        if name == "setmessagereaction":
            if not params.get("chat_id") or not params.get("message_id"):
                raise BotApiError(400, "Bad Request: message to react not found")
            return True
        if name not in _SENDS:
            raise BotApiError(404, "Not Found")
        chat_id = params.get("chat_id", "")
        if not chat_id:
            raise BotApiError(400, "Bad Request: chat_id is empty")
        with world.lock:
            faults = world.faults
            if faults.too_many > 0:
                faults.too_many -= 1
                raise BotApiError(429, f"Too Many Requests: retry after {faults.retry_after}",
                                  retry_after=faults.retry_after)
        if chat_id in faults.unknown_chats:
            raise BotApiError(400, "Bad Request: chat not found")
        field_name = _SENDS[name]
        parse_mode = params.get("parse_mode") or None
        upload: Upload | None = None
        if field_name is None:
            raw = params.get("text", "")
        else:
            raw = params.get("caption", "")
            upload = next((u for u in uploads if u.field == field_name), None)
            if upload is None:
                raise BotApiError(400, f"Bad Request: there is no {field_name} in the request")
        try:
            shown = render(raw, parse_mode)
        except ParseError as error:
            raise BotApiError(400, f"Bad Request: can't parse entities: {error}") from None
        if field_name is None and not shown:
            raise BotApiError(400, "Bad Request: message text is empty")
        if field_name is None and utf16_len(shown) > MAX_TEXT:
            raise BotApiError(400, "Bad Request: message is too long")
        if field_name is not None and utf16_len(shown) > MAX_CAPTION:
            raise BotApiError(400, "Bad Request: message caption is too long")
        with world.lock:
            message_id = len(world.seen) + 1
            world.seen.append(Seen(message_id, api, chat_id, shown, parse_mode,
                                   params.get("message_thread_id"), upload))
        result: dict[str, Any] = {
            "message_id": message_id, "from": BOT, "chat": _chat(chat_id),
            "date": int(time.time()),
        }
        if params.get("message_thread_id"):
            result["message_thread_id"] = int(params["message_thread_id"])
        if field_name is None:
            result["text"] = shown
        else:
            if shown:
                result["caption"] = shown
            file = {"file_id": f"F{message_id}", "file_unique_id": f"U{message_id}",
                    "file_size": len(upload.content) if upload else 0}
            if field_name == "photo":
                result["photo"] = [{**file, "width": 1, "height": 1}]
            else:
                result[field_name] = {**file, "file_name": upload.filename if upload else ""}
        if faults.delay:  # delivered, but the answer comes late
            world.closing.wait(faults.delay)
        return result


# What the gateway asks besides sends, answered as Telegram does for a bot with no webhook.
_ANSWERED: dict[str, Any] = {
    "deletewebhook": True,
    "getwebhookinfo": {"url": "", "has_custom_certificate": False, "pending_update_count": 0},
    "setmycommands": True, "deletemycommands": True, "getmycommands": [],
    "setmydescription": True, "setmyshortdescription": True, "setmyname": True,
    "setchatmenubutton": True, "sendchataction": True,
}


def _updates(world: _World, params: dict[str, str]) -> list[dict[str, Any]]:
    """getUpdates as Telegram serves it: every update from `offset` on (earlier ones are
    confirmed and forgotten), waiting up to `timeout` seconds for the first."""
    offset = int(params.get("offset") or 0)
    deadline = time.monotonic() + min(float(params.get("timeout") or 0), 30.0)
    with world.arrived:
        world.polls += 1
        world.arrived.notify_all()
        world.updates = [u for u in world.updates if u["update_id"] >= offset]
        while not world.updates and not world.closing.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            world.arrived.wait(min(left, 0.2))
        return list(world.updates)


def _params(content_type: str, body: bytes) -> tuple[dict[str, str], tuple[Upload, ...]]:
    """The request's parameters (as strings) and files: form, multipart or JSON."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/json":
        data = json.loads(body or b"{}")
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}, ()
    if kind == "multipart/form-data":
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode() + body
        )
        params: dict[str, str] = {}
        uploads: list[Upload] = []
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            content = part.get_payload(decode=True)
            if not isinstance(name, str) or not isinstance(content, bytes):
                continue
            filename = part.get_filename()
            if filename is not None:
                uploads.append(Upload(name, filename, content))
            else:
                params[name] = content.decode("utf-8")
        for upload in uploads:  # PTB names the part and points at it: photo=attach://name
            for key, value in list(params.items()):
                if value == f"attach://{upload.field}":
                    params.pop(key)
                    uploads[uploads.index(upload)] = Upload(key, upload.filename, upload.content)
        return params, tuple(uploads)
    fields = urllib.parse.parse_qs(body.decode("utf-8"), keep_blank_values=True)
    return {k: v[0] for k, v in fields.items()}, ()


class FakeTelegram:
    """The proxy and Bot API on 127.0.0.1; `env()` is what hermes needs to reach it."""

    def __init__(self, tls: Tls, token: str = TOKEN) -> None:
        self.tls = tls
        self.token = token
        self._world = _World(tls, token)
        self._server = _Proxy(("127.0.0.1", 0), _Handler)
        self._server.world = self._world
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment for hermes: this proxy, this CA, no pip installs on first use."""
        return {
            "TELEGRAM_PROXY": self.proxy_url,
            "SSL_CERT_FILE": str(self.tls.ca),
            "HERMES_DISABLE_LAZY_INSTALLS": "1",
            "NO_PROXY": "", "no_proxy": "",
        }

    def configure(
        self,
        *,
        unknown_chats: tuple[str, ...] = (),
        too_many: int = 0,
        retry_after: int = 1,
        delay: float = 0.0,
        unreachable: str | None = None,
    ) -> None:
        """What Telegram does from now on: `unknown_chats` get 400 chat not found; the
        next `too_many` sends get 429 with `retry_after`; each send is delivered and then
        answered `delay` seconds late; `unreachable` is "refuse" (the proxy answers the
        CONNECT with 502) or "close" (it hangs up without a word)."""
        assert unreachable in (None, "refuse", "close"), unreachable
        with self._world.lock:
            self._world.faults = Faults(frozenset(unknown_chats), too_many, retry_after,
                                        delay, unreachable)

    def messages(self) -> list[Seen]:
        """What reached the human, in order."""
        with self._world.lock:
            return list(self._world.seen)

    def texts(self) -> list[str]:
        return [m.text for m in self.messages()]

    def calls(self) -> list[Call]:
        """Every Bot API request, answered or refused, in order."""
        with self._world.lock:
            return list(self._world.calls)

    def connects(self) -> list[str]:
        """The first line of each CONNECT the proxy was sent."""
        with self._world.lock:
            return list(self._world.connects)

    def wait_messages(self, count: int, timeout: float = 20.0) -> list[Seen]:
        return wait_for(lambda: self.messages() if len(self.messages()) >= count else None,
                        timeout,
                        f"{count} Telegram message(s); have {self.texts()}")

    # -- the human's side: what the gateway reads with getUpdates ---------------------

    def polls(self) -> int:
        """getUpdates calls so far (a gateway is listening once it makes one)."""
        with self._world.lock:
            return self._world.polls

    def wait_polling(self, count: int = 1, timeout: float = 30.0) -> int:
        return wait_for(lambda: self.polls() >= count and self.polls(), timeout,
                        f"{count} getUpdates call(s); have {self.polls()}")

    def send(
        self,
        text: str,
        *more: str,
        chat_id: int = 4242,
        user_id: int = 4242,
        username: str | None = "alice",
        reply_to: Seen | None = None,
        quote: str | None = None,
    ) -> list[int]:
        """The human sends `text` (a reply to `reply_to`, a message the bot sent, quoting
        only `quote` of it if given), and `more` messages right after it, all in the same
        getUpdates answer (as Telegram serves a burst); returns the new messages' ids."""
        user: dict[str, Any] = {"id": user_id, "is_bot": False, "first_name": "Alice"}
        if username is not None:
            user["username"] = username
        ids = []
        with self._world.arrived:
            for index, body in enumerate((text, *more)):
                number = len(self._world.inbound) + 1
                message_id = 100_000 + number  # apart from the bot's own ids (1, 2, ...)
                message: dict[str, Any] = {
                    "message_id": message_id, "from": user, "chat": _chat(str(chat_id)),
                    "date": int(time.time()), "text": body,
                }
                command = re.match(r"/[A-Za-z0-9_]{1,32}(@[A-Za-z0-9_]+)?", body)
                mention = re.match(r"@[A-Za-z0-9_]{5,32}", body)
                if command:  # Telegram marks a leading /command as an entity
                    message["entities"] = [{"type": "bot_command", "offset": 0,
                                            "length": len(command.group())}]
                elif mention:  # and a leading @name
                    message["entities"] = [{"type": "mention", "offset": 0,
                                            "length": len(mention.group())}]
                if reply_to is not None and index == 0:
                    message["reply_to_message"] = {
                        "message_id": reply_to.message_id, "from": BOT,
                        "chat": _chat(reply_to.chat_id), "date": int(time.time()),
                        "text": reply_to.text,
                    }
                    if quote is not None:  # the part the human picked (Bot API `quote`)
                        message["quote"] = {"text": quote, "position": reply_to.text.find(quote),
                                            "is_manual": True}
                self._world.inbound.append(message)
                self._world.updates.append({"update_id": 500_000 + number, "message": message})
                ids.append(message_id)
            self._world.arrived.notify_all()
        return ids

    def edit(self, message_id: int, text: str) -> None:
        """The human edits a message they sent: Telegram serves it again, with its new
        text and an `edit_date`, as an `edited_message` update."""
        with self._world.arrived:
            sent = next(m for m in self._world.inbound if m["message_id"] == message_id)
            edited = {**sent, "text": text, "edit_date": int(time.time())}
            self._world.inbound.append(edited)
            number = len(self._world.inbound)
            self._world.updates.append({"update_id": 500_000 + number, "edited_message": edited})
            self._world.arrived.notify_all()

    def bot_said(self, text: str, chat_id: str = "4242") -> Seen:
        """A message the bot sent earlier (by `hermes send`, say), there to be replied to."""
        with self._world.lock:
            seen = Seen(len(self._world.seen) + 1, "sendMessage", chat_id, text, None)
            self._world.seen.append(seen)
        return seen

    def reactions(self) -> list[tuple[str, int, list[str]]]:
        """(chat, message id, emoji) of each reaction the bot set."""
        found = []
        for call in self.calls():
            if call.method.lower() == "setmessagereaction" and call.status == 200:
                emoji = [r.get("emoji", "") for r in json.loads(call.params.get("reaction") or "[]")]
                found.append((call.params["chat_id"], int(call.params["message_id"]), emoji))
        return found

    def close(self) -> None:
        self._world.closing.set()
        self._server.shutdown()
        self._server.server_close()
