"""``python -m aiolock``: the ``aiolock`` command line (see :mod:`aiolock._cli`)."""

from __future__ import annotations

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
