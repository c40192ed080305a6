"""What ``aiolock list`` and ``aiolock show`` read of a Redlock, and what it says.

``P:redlock:{T}`` on one master is a string, the token ``<manager id>:<number>`` of the
hold (:mod:`aiolock._redlock.manager`). The other masters are not read: point the
command at each to compare. ``show`` reads ``:fence`` too (a Redlock keeps none).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiolock._redis.inspect import Describer, Holder, LockInfo, text_of

__all__ = ["RedlockDescriber"]


class RedlockDescriber(Describer):
    """A Redlock's key on one master, for the inspector."""

    kind = "redlock"
    string = True  # a holder's token

    def parse(
        self, base: LockInfo, raw: Any, fields: dict[str, str], extra: list[Any], now_ms: float
    ) -> LockInfo | None:
        # one holder on this master: its token, count 1
        token = text_of(raw) if isinstance(raw, (bytes, str)) else None
        return replace(
            base, holders=() if token is None else (Holder(token, 1, lease_left=base.ttl),)
        )
