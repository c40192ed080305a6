"""The ``aiolock`` command (``python -m aiolock``): inspect and manage locks in Redis."""

from aiolock._cli.main import main

__all__ = ["main"]
