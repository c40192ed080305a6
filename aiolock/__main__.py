"""``python -m aiolock``: the ``aiolock`` command line (see :mod:`aiolock._cli.main`)."""

from __future__ import annotations

import sys

from aiolock._cli.main import main

if __name__ == "__main__":
    sys.exit(main())
