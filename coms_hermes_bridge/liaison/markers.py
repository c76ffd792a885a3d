"""The marker grammar, defined once for both ends of the answer-file wire (C3, C4, X14).

The daemon writes these markers into the questions it sends; the liaison plugin reads
them back in the Hermes gateway. The plugin runs in Hermes' own Python and may import
nothing of ours but this folder, so this module is stdlib only and knows no models.
"""

from __future__ import annotations

import re

# C3: a 26-character Crockford ULID, upper case (no I, L, O or U).
QID_CHARS = "[0-9A-HJKMNP-TV-Z]"
QID_PATTERN = re.compile(rf"^{QID_CHARS}{{26}}$")
MARKER = "HUB-Q"


def is_qid(value: object) -> bool:
    """C3, for either side: both must refuse exactly the same strings."""
    return isinstance(value, str) and QID_PATTERN.fullmatch(value) is not None


def hub_tag(qid: str) -> str:
    """`[HUB-Q:<qid>]`: how every message of the bridge names its question."""
    return f"[{MARKER}:{qid}]"


def answer_prefix(qid: str) -> str:
    """`HUB-Q:<qid>:`: what a human types to answer without replying."""
    return f"{MARKER}:{qid}:"


# What the liaison looks for. A tag is any bracketed `[HUB-Q:...]`, valid or not, so
# that a message naming two questions (or a broken one) is seen as ambiguous; an answer
# line is any line starting with `HUB-Q:`, so that it ends the answer before it.
TAG_PATTERN = re.compile(rf"\[{MARKER}:([^\]\n]*)\]")
ANSWER_LINE_PATTERN = re.compile(rf"^{MARKER}:", re.MULTILINE)
ANSWER_HEAD_PATTERN = re.compile(rf"^{MARKER}:({QID_CHARS}{{26}}):")

# Not ours, but read here with the rest: how Hermes 0.19.0 hands an agent turn a Telegram
# reply, `[Replying to: "<the first 500 characters of the replied-to message>"]`, a blank
# line, then the text. A busy chat's answer reaches the liaison only in this form.
REPLY_QUOTE_PATTERN = re.compile(r'\A\[Replying to: "(.*?)"\]\n\n', re.DOTALL)
