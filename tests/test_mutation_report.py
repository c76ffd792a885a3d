"""scripts/mutation_report.py: a listed equivalent counts only while its key names the
change it was listed for (mutmut renumbers a function's mutants when the function changes)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes import script

# A module as mutmut writes it: each function's original and its mutants side by side.
MUTATED = '''
def x_pick__mutmut_orig(items, last=False):
    """Doc."""
    if not items:
        return None
    return items[-1] if last else items[0]

def x_pick__mutmut_1(items, last=True):
    """Doc."""
    if not items:
        return None
    return items[-1] if last else items[0]

def x_pick__mutmut_2(items, last=False):
    """Doc."""
    if items:
        return None
    return items[-1] if last else items[0]

class Box:
    def xǁBoxǁput__mutmut_orig(self, item):
        self.items.append(item)
        self.full = False

    def xǁBoxǁput__mutmut_1(self, item):
        self.items.append(item)
        self.full = None

    @staticmethod
    async def xǁBoxǁwait__mutmut_orig(flag):
        if flag:
            return None
        if flag:
            return None

    @staticmethod
    async def xǁBoxǁwait__mutmut_1(flag):
        if flag:
            return None
        if not flag:
            return None

    @staticmethod
    async def xǁBoxǁwait__mutmut_2(flag):
        if not flag:
            return None
        if flag:
            return None

    def helper(self):
        return 1
'''


def report() -> ModuleType:
    return script("mutation_report")


def test_each_mutant_is_known_by_the_lines_it_changes() -> None:
    module = report()
    changes = module.mutant_changes(MUTATED)
    assert changes == {
        # a changed default in the signature counts; the function's own name does not
        "x_pick__mutmut_1": ["@@ -1 +1 @@", "-def f(items, last=False):", "+def f(items, last=True):"],
        "x_pick__mutmut_2": ["@@ -3 +3 @@", "-if not items:", "+if items:"],
        "xǁBoxǁput__mutmut_1": ["@@ -3 +3 @@", "-self.full = False", "+self.full = None"],
        # an async method (decorated): the same change to two identical lines, told apart
        "xǁBoxǁwait__mutmut_1": ["@@ -4 +4 @@", "-if flag:", "+if not flag:"],
        "xǁBoxǁwait__mutmut_2": ["@@ -2 +2 @@", "-if flag:", "+if not flag:"],
    }
    assert (module.fingerprint(changes["xǁBoxǁwait__mutmut_1"])
            != module.fingerprint(changes["xǁBoxǁwait__mutmut_2"]))


def test_a_fingerprint_is_eight_hex_digits_of_the_change_alone() -> None:
    module = report()
    change = ["@@ -3 +3 @@", "-self.full = False", "+self.full = None"]
    mark = module.fingerprint(change)
    assert re.fullmatch("[0-9a-f]{8}", mark)
    assert mark == module.fingerprint(list(change))
    assert mark != module.fingerprint(["@@ -3 +3 @@", "-self.full = False", "+self.full = True"])
    assert mark != module.fingerprint(["@@ -4 +4 @@", "-self.full = False", "+self.full = None"])


def test_the_list_reads_key_fingerprint_and_reason() -> None:
    listed = report().equivalents(
        "# a comment\n"
        "\n"
        "pkg.mod.x_pick__mutmut_1 @0123abcd  # the default is never used\n"
        "pkg.mod.x_pick__mutmut_2  # listed before fingerprints\n")
    assert listed == {
        "pkg.mod.x_pick__mutmut_1": ("0123abcd", "the default is never used"),
        "pkg.mod.x_pick__mutmut_2": (None, "listed before fingerprints"),
    }


def test_a_listing_vouches_only_for_the_change_it_names() -> None:
    module = report()
    prints = {"k1": "0123abcd", "k2": "89abcdef", "k3": "00000000"}
    known = {"k1": ("0123abcd", "why"), "k2": ("0123abcd", "why"), "k3": (None, "why")}
    assert module.vouched(known, prints, "k1")
    assert not module.vouched(known, prints, "k2")  # the key now names another change
    assert not module.vouched(known, prints, "k3")  # no fingerprint: nothing to vouch by
    assert not module.vouched(known, prints, "k4")  # not listed


# each folder's modules keyed by their import name (setup.cfg's package_dir)
@pytest.mark.parametrize(("folder", "key"), [("actors", "coms_hermes_bridge.actors.box."),
                                            ("coms_hermes_bridge", "coms_hermes_bridge.box.")])
def test_a_moved_listing_is_counted_as_left_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    folder: str, key: str,
) -> None:
    module = report()
    (tmp_path / "mutants" / folder).mkdir(parents=True)
    (tmp_path / "mutants" / folder / "box.py").write_text(MUTATED)
    (tmp_path / "mutants" / folder / "box.py.meta").write_text(json.dumps({"exit_code_by_key": {
        key + "x_pick__mutmut_1": 0,  # survived, listed with its own fingerprint
        key + "x_pick__mutmut_2": 0,  # survived, listed for a change it no longer is
        key + "xǁBoxǁput__mutmut_1": 1,  # killed
        key + "xǁBoxǁwait__mutmut_1": 0,  # survived, listed without a fingerprint
        key + "xǁBoxǁwait__mutmut_2": 1,  # killed
    }}))
    changes = module.mutant_changes(MUTATED)
    equivalents = tmp_path / "equivalents.txt"
    equivalents.write_text(
        f"{key}x_pick__mutmut_1 @{module.fingerprint(changes['x_pick__mutmut_1'])}  # default\n"
        f"{key}x_pick__mutmut_2 @{module.fingerprint(changes['x_pick__mutmut_1'])}  # moved\n"
        f"{key}xǁBoxǁwait__mutmut_1  # unmarked\n")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "EQUIVALENTS", equivalents)
    assert module.main([f"{folder}/box.py"]) == 0
    out = capsys.readouterr().out
    assert f"{folder + '/box.py':<32}       5      2       0     1    2   50.0%" in out
    moved = module.fingerprint(changes["x_pick__mutmut_2"])
    assert (f"  {key}x_pick__mutmut_2 @{moved}  (listed as "
            f"@{module.fingerprint(changes['x_pick__mutmut_1'])}: moved)") in out
    unmarked = module.fingerprint(changes["xǁBoxǁwait__mutmut_1"])
    assert (f"  {key}xǁBoxǁwait__mutmut_1 @{unmarked}  (listed without a fingerprint: "
            "unmarked)") in out
    assert f"## {key}x_pick__mutmut_2 @{moved}" in out
    assert "lowest module score: 50.0%" in out
