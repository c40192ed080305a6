"""What ``aiolock list`` and ``aiolock show`` read of a read-write lock, and what it says.

Its keys are those of :mod:`aiolock._kinds.rw.kind`: ``P:rw:{T}``, the hash of holds
plus ``writer``, ``writer_owner`` and ``writer_attempt``; ``:leases`` (each hold's lease
end) and ``:claims`` (waiting writers), which may outlive the hash. ``show`` reads
``:fence`` too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiolock._redis.inspect import Describer, Holder, LockInfo, int_of, lease_ends, members_of

__all__ = ["ReadWriteDescriber"]

#: The hash's metadata fields, which are not holds.
_META = frozenset({"writer", "writer_owner", "writer_attempt"})


class ReadWriteDescriber(Describer):
    """The read-write lock's keys, for the inspector."""

    kind = "rw"
    suffixes = frozenset({"", ":leases", ":claims"})
    extra = 2

    def queue(self, pipe: Any, key: str) -> None:
        pipe.zrange(f"{key}:leases", 0, -1, withscores=True)
        pipe.zrange(f"{key}:claims", 0, -1)

    def parse(
        self, base: LockInfo, raw: Any, fields: dict[str, str], extra: list[Any], now_ms: float
    ) -> LockInfo | None:
        writer = fields.get("writer")
        ends = lease_ends(extra[0], now_ms)
        holders = tuple(
            Holder(
                owner,
                int_of(count),
                "writer" if owner == writer else "reader",
                lease_left=ends.get(owner, base.ttl),
            )
            for owner, count in sorted(fields.items())
            if owner not in _META
        )
        waiting = members_of(extra[1])
        return replace(base, holders=holders, waiters=len(waiting), waiting=waiting)
