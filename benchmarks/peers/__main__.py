"""``python -m benchmarks.peers``: the same as ``python -m benchmarks``."""

import sys

from benchmarks.peers.harness import main

if __name__ == "__main__":
    sys.exit(main())
