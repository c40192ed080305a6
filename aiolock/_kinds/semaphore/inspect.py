"""What ``aiolock list`` and ``aiolock show`` read of a semaphore, and what it says.

Its keys are those of :mod:`aiolock._kinds.semaphore.kind`: ``P:sem:{T}``, the hash
``<permit field>`` -> permits plus ``#held`` (the running total); ``:expiry`` (each
hold's lease end), ``:claims``, ``:wants`` and ``:limit``, any of which may outlive the
hash. ``show`` reads ``:fence`` too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiolock._redis.inspect import (
    Describer,
    Holder,
    LockInfo,
    int_of,
    lease_ends,
    members_of,
    ttl_of,
)

__all__ = ["SemaphoreDescriber"]

#: The hash's running total, not a permit field.
_TOTAL = "#held"


class SemaphoreDescriber(Describer):
    """The semaphore's keys, for the inspector."""

    kind = "semaphore"
    suffixes = frozenset({"", ":expiry", ":claims", ":wants", ":limit"})
    extra = 4

    def queue(self, pipe: Any, key: str) -> None:
        pipe.zrange(f"{key}:expiry", 0, -1, withscores=True)
        pipe.zrange(f"{key}:claims", 0, -1)
        pipe.get(f"{key}:limit")
        pipe.pttl(f"{key}:expiry")

    def parse(
        self, base: LockInfo, raw: Any, fields: dict[str, str], extra: list[Any], now_ms: float
    ) -> LockInfo | None:
        ends = lease_ends(extra[0], now_ms)
        holders = tuple(
            Holder(owner, int_of(permits), lease_left=ends.get(owner, base.ttl))
            for owner, permits in sorted(fields.items())
            if owner != _TOTAL
        )
        waiting = members_of(extra[1])
        ttl = ttl_of(extra[3]) if base.ttl is None and holders else base.ttl
        return replace(
            base,
            ttl=ttl,
            holders=holders,
            waiters=len(waiting),
            waiting=waiting,
            limit=None if extra[2] is None else int_of(extra[2]),
            held=int_of(fields.get(_TOTAL, "0")),
        )
