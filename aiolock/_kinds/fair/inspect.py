"""What ``aiolock list`` and ``aiolock show`` read of a fair lock, and what it says.

Its keys are those of :mod:`aiolock._kinds.fair.kind`: ``P:fair:{T}``, the hash of its
one holder (owner field -> hold count), and ``:queue`` (its waiters, in order) and
``:claims``, which outlive the hash while waiters wait. ``show`` reads ``:fence`` too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiolock._redis.inspect import Describer, Holder, LockInfo, int_of, members_of

__all__ = ["FairDescriber"]


class FairDescriber(Describer):
    """The fair lock's keys, for the inspector."""

    kind = "fair"
    suffixes = frozenset({"", ":queue", ":claims"})
    extra = 1

    def queue(self, pipe: Any, key: str) -> None:
        pipe.zrange(f"{key}:queue", 0, -1)

    def parse(
        self, base: LockInfo, raw: Any, fields: dict[str, str], extra: list[Any], now_ms: float
    ) -> LockInfo | None:
        holders = tuple(
            Holder(owner, int_of(count), lease_left=base.ttl)
            for owner, count in sorted(fields.items())
        )
        waiting = members_of(extra[0])
        return replace(base, holders=holders, waiters=len(waiting), waiting=waiting)
