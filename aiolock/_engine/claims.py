"""The registrations in Redis of waiting tasks (a fair lock's queue, a writer's claim).

A waiter of a kind with claims registers with its first attempt, under one field for
its whole wait (see :mod:`aiolock._engine.acquire`). Each kind's registrations expire
after its ``claim_ttl`` unless refreshed: :meth:`WaiterClaims.keep`, a background task
of the manager, refreshes them in batches (one script call per name and manager every
``claim_ttl / 3``), so a crashed waiter leaves the queue within ``claim_ttl``; a waiter
that gives up withdraws its registration at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import anyio

from aiolock._errors import LockError

if TYPE_CHECKING:
    from aiolock._engine.kind import LockKind
    from aiolock._keys import LockKeys

__all__ = ["CLAIM_BATCH", "WaiterClaims"]

logger = logging.getLogger("aiolock")

#: Registrations refreshed per script call (WaiterClaims.keep): a call keeps Redis from
#: every other client while it runs, so it stays well under a millisecond. A fair lock's
#: refresh costs about 2 us per field plus a fixed part (redis-server 7.0, 1k-5k waiters
#: queued): 128 fields took 0.40-0.42 ms, 500 took 1.0-1.2 ms.
CLAIM_BATCH = 128


class WaiterClaims:
    """The fields of this manager's waiting tasks registered in Redis, per kind and lock."""

    def __init__(self) -> None:
        #: (kind, lock key) -> the lock's keys and the fields of this manager's waiters
        self._fields: dict[tuple[LockKind, str], tuple[LockKeys, set[str]]] = {}
        #: when the sleep of :meth:`keep` ends (monotonic), and what ends it sooner
        self._wake_at = float("inf")
        self._sooner = asyncio.Event()

    def add(self, kind: LockKind, keys: LockKeys, field: str) -> None:
        entry = self._fields.get((kind, keys.lock))
        if entry is None:
            entry = self._fields[(kind, keys.lock)] = (keys, set())
        entry[1].add(field)
        # A kind whose claims expire sooner than keep() wakes: it must not wait out a
        # sleep chosen for longer-lived claims (its claim would lapse first).
        if time.monotonic() + kind.claim_ttl / 3 < self._wake_at:
            self._sooner.set()

    def discard(self, kind: LockKind, keys: LockKeys, field: str) -> None:
        entry = self._fields.get((kind, keys.lock))
        if entry is not None:
            entry[1].discard(field)
            if not entry[1]:
                del self._fields[(kind, keys.lock)]

    @property
    def count(self) -> int:
        """Registrations kept alive in Redis."""
        return sum(len(fields) for _, fields in self._fields.values())

    async def keep(self) -> None:
        """Refresh the registrations of waiting tasks, in batches (see the module docstring)."""
        while True:
            period = min((kind.claim_ttl for kind, _ in self._fields), default=1.0) / 3
            self._wake_at = time.monotonic() + period
            self._sooner.clear()
            with anyio.move_on_after(period):
                await self._sooner.wait()  # set by add(): refresh now, then at its pace
            for (kind, _), (keys, fields) in list(self._fields.items()):
                ordered = sorted(fields)
                # In calls of at most CLAIM_BATCH: one script over all of them would keep
                # Redis from anything else for longer the more waiters there are.
                for start in range(0, len(ordered), CLAIM_BATCH):
                    try:
                        await kind.refresh_claims(keys, ordered[start : start + CLAIM_BATCH])
                    except LockError as exc:  # the waiters' own attempts report it
                        logger.warning("refreshing the waiters of %r failed: %s", keys.name, exc)
                        break
