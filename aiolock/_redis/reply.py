"""Reply elements as Python values, whether the client decodes responses or not.

A module of its own (not part of :mod:`aiolock._redis.client`) so that the kind seam can decode
replies without importing the client and what it needs (redis-py's connections).
"""

from __future__ import annotations

from aiolock._errors import LockBackendError

__all__ = ["as_int", "as_text"]


def as_text(value: object) -> str:
    """A reply element as str, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def as_int(value: object) -> int:
    """A reply element as int; anything else is a :class:`LockBackendError`."""
    if isinstance(value, (int, str, bytes)):
        return int(value)
    raise LockBackendError(f"Redis sent {value!r} where aiolock expected an integer")
