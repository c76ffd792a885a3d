"""Score a finished mutmut run per module, minus the mutants known to be equivalent.

A score only means something if every survivor is either killed by a new test
or written down as equivalent (no test could tell it from the original) with
the reason. `scripts/mutation_equivalents.txt` is that list: one mutant key per
line, then ` # why`. A listed key that no longer exists is reported, so the list
cannot silently go stale when the code moves.

Usage: python scripts/mutation_report.py MODULE.py [MODULE.py ...]   (after scripts/mutate)
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "scripts" / "mutation_equivalents.txt"
KILLED = {1, 3}
# mutmut's timeout codes: the tests hung on the mutant, so it did not pass them
# either; counted as detected (as mutmut's own score does), but shown apart, because a
# run in which most mutants time out means the harness is broken, not the code.
TIMED_OUT = {-24, 24, 36, 152, 255}
DETECTED = KILLED | TIMED_OUT
SURVIVED = 0


def equivalents() -> dict[str, str]:
    """Mutant key -> why it is equivalent."""
    found: dict[str, str] = {}
    if not EQUIVALENTS.exists():
        return found
    for raw in EQUIVALENTS.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, why = line.partition("#")
        found[key.strip()] = why.strip()
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    modules = argv
    known = equivalents()
    seen_keys: set[str] = set()
    worst = 100.0
    survivors: list[str] = []
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
        status = Counter(
            "killed" if code in KILLED
            else "timeout" if code in TIMED_OUT
            else "survived" if code == SURVIVED
            else "other"
            for code in codes.values()
        )
        left = [k for k, code in codes.items() if code not in DETECTED and k not in known]
        equiv = sum(1 for k, code in codes.items() if code not in DETECTED and k in known)
        counted = len(codes) - equiv
        detected = status["killed"] + status["timeout"]
        score = 100.0 * detected / counted if counted else 100.0
        worst = min(worst, score)
        survivors.extend(left)
        print(f"{module:<32} {len(codes):>7} {status['killed']:>6} {status['timeout']:>7} "
              f"{equiv:>5} {len(left):>4} {score:>6.1f}%")
    # Only the modules of this run can vouch for a key: others were not mutated now.
    prefixes = tuple(
        f"coms_hermes_bridge.{m.removesuffix('.py').replace('/', '.')}." for m in modules
    )
    stale = sorted(k for k in set(known) - seen_keys if k.startswith(prefixes))
    if stale:
        print("\nlisted as equivalent but no longer generated (remove from the list):")
        for key in stale:
            print(f"  {key}")
    if survivors:
        print("\nsurvivors (kill each with a test, or list it as equivalent with the reason):")
        for key in survivors:
            shown = subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "mutmut_tree.py"), "--", "show", key],
                cwd=ROOT, capture_output=True, text=True, check=False,
            )
            print(f"\n## {key}\n{shown.stdout.strip()}")
    print(f"\nlowest module score: {worst:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
