"""The fair lock kind: a reentrant lock granted in the order its waiters reached Redis.

Keys of a fair lock ``N`` under prefix ``P`` (tag ``fair``; see :mod:`aiolock._keys`):

=============================  ========================================================
``P:fair:{N}``                 hash: ``<owner field>`` -> hold count (one owner)
``P:fair:{N}:queue``           sorted set: waiter field -> arrival number
``P:fair:{N}:claims``          sorted set: waiter field -> claim expiry (server ms)
``P:fair:{N}:fence``           the last fencing token released
``P:fair:{N}:rel:<id>``        tombstone of a final release
``P:fair:{N}:void:<id>``       void marker of an attempt cancelled in flight
``P:fair:{N}:released``        channel: the field of the waiter a release granted to
=============================  ========================================================

A waiter keeps one field for its whole wait. Its first attempt queues it; each attempt
and each refresh (every ``claim_ttl / 3``, batched per name by the engine) sets its
claim to ``claim_ttl`` ahead of the server's clock, and any script that looks at the
queue drops the waiters whose claims expired. A final release (and an undo of a grant,
a force release, or a refresh or attempt that finds the lock free after a lease ran
out) grants the lock straight to the first live waiter: its field gets hold count 1
with a *pickup lease* of ``claim_ttl``, and the field is published. The hub wakes that
waiter alone; its next attempt finds the lock under its own field and picks it up,
setting its own lease and taking its fencing token. Renewal and extension use the
lock's ``renew.lua`` (the hash has the same shape).

The reply codes of each script are named here, next to their decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiolock._engine.kind import (
    Attempt,
    Busy,
    Granted,
    Hold,
    Released,
    Successor,
    decode_attempt,
    decode_release,
)
from aiolock._engine.kindbase import KindBase
from aiolock._engine.runtime import Runtime
from aiolock._errors import LockTimeoutError
from aiolock._keys import LockKeys, ms
from aiolock._redis.client import as_int, key_type_error
from aiolock._redis.scripts import Script

__all__ = ["DEFAULT_CLAIM_TTL", "FairLockKind"]

ACQUIRE = Script("_kinds/fair/acquire")
RELEASE = Script("_kinds/fair/release")
UNDO = Script("_kinds/fair/undo")
REFRESH = Script("_kinds/fair/refresh")
FORCE_RELEASE = Script("_kinds/fair/force_release")
RENEW = Script("_kinds/fair/renew")
EXTEND_BY = Script("_kinds/fair/extend_by")

#: Seconds a waiter's place lasts in Redis unless its process refreshes it; also the
#: pickup lease of a grant, so a dead waiter holds the queue up for this long at most.
DEFAULT_CLAIM_TTL = 10.0


def queue_key(keys: LockKeys) -> str:
    """The sorted set of waiters in arrival order."""
    return keys.part("queue")


def claims_key(keys: LockKeys) -> str:
    """The sorted set of waiters' claim expiries (server milliseconds)."""
    return keys.part("claims")


class FairLockKind(KindBase):
    """Scripts and reply decoding of the fair lock; everything else is the engine's."""

    name = "fair lock"
    renew_script = RENEW
    extend_by_script = EXTEND_BY
    reentrant = True
    hand_over = False  # Redis grants the next waiter itself: no local hand-over
    claims = True
    queued = True

    def __init__(self, runtime: Runtime, claim_ttl: float = DEFAULT_CLAIM_TTL) -> None:
        self._rt = runtime
        self._client = runtime.client
        #: seconds a waiter's claim lasts unless refreshed, and a grant's pickup lease;
        #: set it before use (tests shorten it to see dead waiters dropped quickly)
        self.claim_ttl = claim_ttl

    def timeout_error(self, keys: LockKeys, timeout: float | None, permits: int) -> Exception:
        return LockTimeoutError(
            f"fair lock {keys.name!r} was not granted to this task within {timeout} s "
            "(it was held, or waiters queued earlier came first); pass a longer timeout, "
            "or timeout=None to wait for its turn as long as it takes"
        )

    async def attempt(self, attempt: Attempt) -> Granted | Busy:
        keys = attempt.keys
        # In order: Redis queues waiters in the order their attempts arrive, which must be
        # the order this process's tasks asked in (first come, first served).
        reply = await self._client.run_in_order(
            ACQUIRE,
            (keys.lock, keys.fence, attempt.void, queue_key(keys), claims_key(keys)),
            (
                attempt.field,
                ms(attempt.lease),
                attempt.before,
                ms(self.claim_ttl),
                1 if attempt.claim else 0,
            ),
        )
        return decode_attempt(reply, keys.lock)

    async def undo(self, attempt: Attempt) -> bool:
        keys = attempt.keys
        void_ms = attempt.void_ms
        undone = await self._client.run(
            UNDO,
            (keys.lock, attempt.void, queue_key(keys), claims_key(keys)),
            (attempt.field, attempt.before, void_ms, ms(self.claim_ttl)),
        )
        return as_int(undone) == 1

    async def refresh_claims(self, keys: LockKeys, fields: Sequence[str]) -> None:
        await self._client.run(
            REFRESH,
            (keys.lock, queue_key(keys), claims_key(keys)),
            (ms(self.claim_ttl), *fields),
        )

    async def release(
        self,
        hold: Hold,
        count: int,
        release_id: str,
        successor: Successor | None,
        hand_over_freely: bool,
        listening: bool,
    ) -> Released:
        # successor is always None (hand_over is False): Redis picks the next waiter.
        keys = hold.keys
        rt = self._rt
        reply = await self._client.run(
            RELEASE,
            (keys.lock, keys.fence, keys.tombstone(release_id), queue_key(keys), claims_key(keys)),
            (hold.field, count, hold.token, rt.fence_ms, rt.tombstone_ms, ms(self.claim_ttl)),
        )
        return decode_release(reply, keys.lock)

    async def force_release(self, keys: LockKeys) -> bool:
        code, value = await self._client.run(
            FORCE_RELEASE,
            (keys.lock, queue_key(keys), claims_key(keys)),
            (ms(self.claim_ttl),),
        )
        if as_int(code) == -1:
            raise key_type_error(keys.lock, value)
        return as_int(code) == 1
