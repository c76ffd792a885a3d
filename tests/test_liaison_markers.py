"""The marker grammar (coms_hermes_bridge/liaison/markers.py): one definition that the
daemon writes with and the liaison plugin reads with (C3, C4, X14)."""

from __future__ import annotations

import ast
import sys

import pytest

from coms_hermes_bridge.liaison import markers
from coms_hermes_bridge.messages.contract import format_question
from coms_hermes_bridge.messages.wire import ParsedPrompt, is_valid_qid
from tests.bridge_process import ROOT

QID = "01HZY5B7R8XK3M9Q2W4E6T8Y0A"


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (QID, True),
        ("0" * 26, True),
        ("Z" * 26, True),
        (QID.lower(), False),  # upper case only
        (QID[:-1], False),
        (QID + "0", False),
        ("01HZY5B7R8XK3M9Q2W4E6T8Y0I", False),  # I, L, O, U are not Crockford digits
        ("01HZY5B7R8XK3M9Q2W4E6T8Y0L", False),
        ("01HZY5B7R8XK3M9Q2W4E6T8Y0O", False),
        ("01HZY5B7R8XK3M9Q2W4E6T8Y0U", False),
        (QID + "\n", False),  # `$` must not let a trailing newline through
        ("", False),
        (None, False),
        (26, False),
    ],
)
def test_one_qid_grammar_for_both_ends(value: object, valid: bool) -> None:
    # C3: the daemon's check and the liaison's are the same function
    assert markers.is_qid(value) is valid
    assert is_valid_qid(value) is valid


def test_the_markers_as_written() -> None:
    # C4, X14
    assert markers.hub_tag(QID) == f"[HUB-Q:{QID}]"
    assert markers.answer_prefix(QID) == f"HUB-Q:{QID}:"
    assert markers.QID_PATTERN.pattern == "^[0-9A-HJKMNP-TV-Z]{26}$"


def test_the_question_text_carries_both_markers_from_the_grammar() -> None:
    # C4: the question starts with the tag and ends with the typed form's instruction,
    # which the liaison's own patterns read back
    text = format_question(QID, ParsedPrompt(question="Ship?", context=None, options=()))
    assert text == (f"❓ [HUB-Q:{QID}] Ship?\n\n↩ Reply to this message, or type: "
                    f"HUB-Q:{QID}: <answer>")
    assert [m.group(1) for m in markers.TAG_PATTERN.finditer(text)] == [QID]
    typed = text.rsplit("type: ", 1)[1]
    head = markers.ANSWER_HEAD_PATTERN.match(typed)
    assert head is not None and head.group(1) == QID


def test_the_liaison_folder_imports_only_the_standard_library() -> None:
    # X14: the plugin runs in Hermes' Python, where none of our dependencies need exist
    folder = ROOT / "coms_hermes_bridge" / "liaison"
    for source in sorted(folder.glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level == 1:  # a sibling in the same folder
                    continue
                assert node.level == 0, f"{source.name} imports outside its folder"
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", (source.name, name)
