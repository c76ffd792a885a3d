"""Score a finished mutmut run per module, minus the mutants known to be equivalent.

A score only means something if every survivor is either killed by a new test
or written down as equivalent (no test could tell it from the original) with
the reason. `scripts/mutation_equivalents.txt` is that list: one mutant key per
line, the fingerprint of its change (`@` and 8 hex digits), then ` # why`.

mutmut numbers a function's mutants in order, so an edit to the function moves
its keys: a listed key may come to name another mutant, and its reason then
vouches for a change it was never written for. The fingerprint is a hash of the
lines the mutant changes (before and after) and of where in its function they
are; a listed mutant counts as
equivalent only while the run's mutant under that key still has it. One that
moved is reported, as is a listed key that no longer exists.

Usage: python scripts/mutation_report.py MODULE.py [MODULE.py ...]   (after scripts/mutate)
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from mutmut_tree import mutant_name  # a sibling script: the one naming of mutants

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "scripts" / "mutation_equivalents.txt"
KILLED = {1, 3}
# mutmut's timeout codes: the tests hung on the mutant, so it did not pass them
# either; counted as detected (as mutmut's own score does), but shown apart, because a
# run in which most mutants time out means the harness is broken, not the code.
TIMED_OUT = {-24, 24, 36, 152, 255}
DETECTED = KILLED | TIMED_OUT
SURVIVED = 0


def equivalents(text: str | None = None) -> dict[str, tuple[str | None, str]]:
    """Mutant key -> (the fingerprint it was listed with, why it is equivalent)."""
    found: dict[str, tuple[str | None, str]] = {}
    if text is None:
        if not EQUIVALENTS.exists():
            return found
        text = EQUIVALENTS.read_text(encoding="utf-8")
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, _, why = line.partition("#")
        key, *rest = head.split()
        mark = rest[0] if rest and rest[0].startswith("@") else None
        found[key] = (mark[1:] if mark else None, why.strip())
    return found


def mutant_changes(code: str) -> dict[str, list[str]]:
    """Each mutant function of a mutmut-made module -> its diff against the original:
    each hunk's `@@` line (where in the function), then the lines it changes, stripped,
    `-` the original's and `+` its own (the function's own name left out). The place
    tells apart the same change made to two identical lines of one function."""
    lines = code.splitlines()  # once: ast.get_source_segment splits the file per call
    functions = {
        node.name: "\n".join(lines[node.lineno - 1 : node.end_lineno])
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    changes: dict[str, list[str]] = {}
    for name, source in functions.items():
        base, marker, number = name.rpartition("__mutmut_")
        original = functions.get(f"{base}__mutmut_orig")
        if not marker or not number.isdigit() or original is None:
            continue
        unnamed = original.replace(f"{base}__mutmut_orig", "f", 1)
        before = [line.strip() for line in unnamed.splitlines()]
        after = [line.strip() for line in source.replace(name, "f", 1).splitlines()]
        # past the two header lines (--- and +++), whatever the lines themselves say
        changes[name] = list(difflib.unified_diff(before, after, lineterm="", n=0))[2:]
    return changes


def fingerprint(change: list[str]) -> str:
    return hashlib.sha1("\n".join(change).encode()).hexdigest()[:8]


def vouched(known: dict[str, tuple[str | None, str]], prints: dict[str, str], key: str) -> bool:
    """Listed as equivalent, and the mutant under its key is still the change listed."""
    mark = known.get(key, (None, ""))[0]
    return mark is not None and mark == prints.get(key)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    modules = argv
    known = equivalents()
    seen_keys: set[str] = set()
    worst = 100.0
    survivors: list[str] = []
    moved: list[str] = []  # listed, but the key now names a change of another fingerprint
    marks: dict[str, str] = {}  # each survivor's fingerprint, to list it by
    print(
        f"{'module':<32} {'mutants':>7} {'killed':>6} {'timeout':>7} {'equiv':>5} {'left':>4} "
        f"{'score':>7}"
    )
    for module in modules:
        meta = ROOT / "mutants" / f"{module}.meta"
        if not meta.exists():
            print(f"{module:<32} no mutation data (no test covers it, or it was not run)")
            worst = 0.0
            continue
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        seen_keys.update(codes)
        mutated = ROOT / "mutants" / module
        changes = mutant_changes(mutated.read_text(encoding="utf-8")) if mutated.exists() else {}
        prints = {
            mutant_name(Path(module), name): fingerprint(change) for name, change in changes.items()
        }
        moved.extend(k for k, code in codes.items()
                     if code not in DETECTED and k in known and not vouched(known, prints, k))
        status = Counter(
            "killed" if code in KILLED
            else "timeout" if code in TIMED_OUT
            else "survived" if code == SURVIVED
            else "other"
            for code in codes.values()
        )
        left = [k for k, code in codes.items()
                if code not in DETECTED and not vouched(known, prints, k)]
        equiv = sum(1 for k, code in codes.items()
                    if code not in DETECTED and vouched(known, prints, k))
        marks.update({k: prints.get(k, "?") for k in left})
        counted = len(codes) - equiv
        detected = status["killed"] + status["timeout"]
        score = 100.0 * detected / counted if counted else 100.0
        worst = min(worst, score)
        survivors.extend(left)
        print(f"{module:<32} {len(codes):>7} {status['killed']:>6} {status['timeout']:>7} "
              f"{equiv:>5} {len(left):>4} {score:>6.1f}%")
    # Only the modules of this run can vouch for a key: others were not mutated now.
    prefixes = tuple(mutant_name(Path(m), "") for m in modules)
    stale = sorted(k for k in set(known) - seen_keys if k.startswith(prefixes))
    if stale:
        print("\nlisted as equivalent but no longer generated (remove from the list):")
        for key in stale:
            print(f"  {key}")
    if moved:
        print("\nlisted as equivalent under a key that now names another change (counted as"
              " left: check the mutant below, then list it again with its fingerprint):")
        for key in moved:
            mark, why = known[key]
            listed = f"listed as @{mark}" if mark else "listed without a fingerprint"
            print(f"  {key} @{marks.get(key, '?')}  ({listed}: {why})")
    if survivors:
        print("\nsurvivors (kill each with a test, or list it as equivalent with the reason):")
        for key in survivors:
            shown = subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "mutmut_tree.py"), "--", "show", key],
                cwd=ROOT, capture_output=True, text=True, check=False,
            )
            print(f"\n## {key} @{marks.get(key, '?')}\n{shown.stdout.strip()}")
    print(f"\nlowest module score: {worst:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
