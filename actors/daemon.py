"""The `coms-hermes-bridge` command."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Placeholder until the daemon lands: say so and exit 2."""
    print("coms-hermes-bridge: the daemon is not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
