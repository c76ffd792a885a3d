"""`python -m coms_hermes_bridge`: the same command as the console script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
