"""``python -m benchmarks``: the main harness, aiolock beside its peers (peers/harness.py)."""

import sys

from benchmarks.peers.harness import main

if __name__ == "__main__":
    sys.exit(main())
