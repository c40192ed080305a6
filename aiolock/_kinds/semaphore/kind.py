"""The semaphore kind: permits with leases, shared by many holders up to a limit.

A semaphore ``N`` keeps its state under the tag ``sem`` (see :mod:`aiolock._keys`),
``B = P:sem:{N}``:

=======================  ===============================================================
``B``                    hash: ``<permit field>`` -> permits, and ``#held`` -> the total
``B:expiry``             sorted set: ``<permit field>`` -> lease end (ms, server clock)
``B:claims``             sorted set: ``<claim field>`` -> arrival (us, server clock)
``B:wants``              hash: ``<claim field>`` -> ``<permits>:<claim end ms>``
``B:limit``              string: the limit, kept while anything is held or claimed
``B:fence``              string: the last fencing token issued (kept ``fence_ttl``)
``B:rel:<id>``           tombstone of a release; ``B:void:<id>``: a voided attempt
``B:released``           pub/sub channel: a message (a manager id) per release, withdrawn
                         claim, reclaimed lease, force release or limit change
=======================  ===============================================================

A permit field (also the request's claim field while it waits) is
``<manager id>:<task serial>:<number>``, unique per request. The scripts in
``_kinds/semaphore/`` document their KEYS, ARGV and replies; their shared bookkeeping
(expiry of holders and claims on the server's clock) is ``_kinds/_lua/permits.lua``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from aiolock._engine.kind import (
    Attempt,
    Busy,
    Granted,
    Hold,
    Released,
    ReleaseStatus,
    Successor,
    busy_for,
)
from aiolock._engine.kindbase import KindBase
from aiolock._engine.runtime import Runtime
from aiolock._errors import LockError, LockTimeoutError
from aiolock._keys import SEMAPHORE_TAG, LockKeys, ms
from aiolock._redis.client import as_int, key_type_error
from aiolock._redis.scripts import Script

__all__ = ["SemaphoreKeys", "SemaphoreKind", "check_limit", "check_permits"]

ACQUIRE = Script("_kinds/semaphore/acquire")
RELEASE = Script("_kinds/semaphore/release")
RENEW = Script("_kinds/semaphore/renew")
EXTEND_BY = Script("_kinds/semaphore/extend_by")
UNDO = Script("_kinds/semaphore/undo")
REFRESH = Script("_kinds/semaphore/refresh")
FORCE_RELEASE = Script("_kinds/semaphore/force_release")
SET_LIMIT = Script("_kinds/semaphore/set_limit")
STATE = Script("_kinds/semaphore/state")

#: Limits beyond this are surely a mistake (and would not fit Lua's number precision
#: once summed over many holders).
MAX_LIMIT = 1_000_000_000

# acquire.lua
_GRANTED, _BUSY, _VOIDED, _BAD_KEY, _OTHER_LIMIT, _OVER_LIMIT = 1, 0, 3, -1, -2, -3


def check_limit(limit: object) -> int:
    """A semaphore's limit: an int from 1 to :data:`MAX_LIMIT` (not a bool)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    return limit


def check_permits(permits: object, limit: int) -> int:
    """Permits asked for: an int from 1 to the handle's *limit* (not a bool)."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__}")
    if permits < 1:
        raise ValueError(f"permits must be at least 1, got {permits}")
    if permits > limit:
        raise ValueError(
            f"permits={permits} is more than the semaphore's limit of {limit}: such a "
            "request could never be granted"
        )
    return permits


class SemaphoreKeys(LockKeys):
    """The keys of one semaphore, plus the limit the handle was made with.

    The kind receives only keys (in attempts and holds), so the handle's limit travels
    with them: a new request checks it against the limit stored in Redis.
    """

    __slots__ = ("claims", "expiry", "limit", "limit_key", "wants")

    def __init__(self, prefix: str, name: str, limit: int) -> None:
        super().__init__(prefix, name, SEMAPHORE_TAG)
        self.limit = limit
        self.expiry = self.part("expiry")
        self.claims = self.part("claims")
        self.wants = self.part("wants")
        self.limit_key = self.part("limit")


def _keys(keys: LockKeys) -> SemaphoreKeys:
    if not isinstance(keys, SemaphoreKeys):  # pragma: no cover - a wiring mistake
        raise TypeError(f"the semaphore kind needs SemaphoreKeys, got {type(keys).__name__}")
    return keys


class SemaphoreKind(KindBase):
    """Scripts and reply decoding of the semaphore; everything else is the engine's.

    Shared (a grant lets the next local waiter try at once), not reentrant (a task may
    hold several permits, each its own hold), with claims (a waiter that does not fit
    reserves its permits in Redis against later requests of any client).
    """

    name = "semaphore"
    renew_script = RENEW
    extend_by_script = EXTEND_BY
    #: ZSCORE, ZADD and three PEXPIREs (holders, expiries, limit) per permit of its own
    #: semaphore: about 3x a lock's Redis time per hold, so 100 a call stay under a
    #: millisecond on a loaded server (150 took 1.0-1.6 ms there: benchmarks/NOTES.md)
    renew_batch = 100
    shared = True
    claims = True
    claim_ttl = 10.0

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._client = runtime.client
        #: claim field -> when (monotonic, before sending) an attempt last set its expiry:
        #: a claim refreshed that recently is left out of the next refresh round
        self._claimed_at: dict[str, float] = {}

    def timeout_error(self, keys: LockKeys, timeout: float | None, permits: int) -> Exception:
        limit = _keys(keys).limit
        return LockTimeoutError(
            f"semaphore {keys.name!r}: {permits} permit{'s' if permits != 1 else ''} (of a "
            f"limit of {limit}) could not be had within {timeout} s; pass a longer timeout, "
            "timeout=None to wait as long as it takes, or ask for fewer permits"
        )

    async def attempt(self, attempt: Attempt) -> Granted | Busy:
        keys = _keys(attempt.keys)
        rt = self._rt
        sent_at = time.monotonic()
        reply = await self._client.run(
            ACQUIRE,
            (keys.lock, keys.expiry, keys.claims, keys.wants, keys.limit_key, keys.fence,
             attempt.void),
            (attempt.field, attempt.permits, ms(attempt.lease), keys.limit,
             ms(self.claim_ttl) if attempt.claim else 0, rt.fence_ms, rt.manager_id),
        )  # fmt: skip
        if isinstance(reply, int):  # the common path: granted, this is the token
            self._claimed_at.pop(attempt.field, None)
            return Granted(reply, 1)
        code, value = as_int(reply[0]), reply[1]
        if code == _GRANTED:
            self._claimed_at.pop(attempt.field, None)
            return Granted(as_int(value), 1)
        if code == _BUSY:  # the claim is registered, or its expiry pushed back
            if attempt.claim:
                self._claimed_at[attempt.field] = sent_at
            return busy_for(as_int(value))
        if code == _VOIDED:  # only an attempt resent after its own undo sees this
            return Busy(0.0)
        if code == _BAD_KEY:
            raise key_type_error(keys.lock, value)
        stored = as_int(value)
        if code == _OTHER_LIMIT:
            raise LockError(
                f"semaphore {keys.name!r} has a limit of {stored} in Redis, but this handle "
                f"was made with limit={keys.limit}; make the handle with limit={stored}, or "
                f"call set_limit({keys.limit}) to change the limit for every client"
            )
        raise LockError(
            f"semaphore {keys.name!r}: this request waited for {attempt.permits} permits, "
            f"but the limit was lowered to {stored} meanwhile, so it can never be granted"
        )

    async def undo(self, attempt: Attempt) -> bool:
        keys = _keys(attempt.keys)
        self._claimed_at.pop(attempt.field, None)
        void_ms = attempt.void_ms
        undone = await self._client.run(
            UNDO,
            (keys.lock, keys.expiry, keys.claims, keys.wants, attempt.void),
            (attempt.field, void_ms, self._rt.manager_id),
        )
        return as_int(undone) == 1

    async def refresh_claims(self, keys: LockKeys, fields: Sequence[str]) -> None:
        # The engine asks every claim_ttl / 3 for every waiter; a claim that an attempt
        # registered or pushed back less than that long ago has time enough left, so a
        # round with only such claims sends nothing (a fresh wait costs no refresh).
        sk = _keys(keys)
        sent_at = time.monotonic()
        due_before = sent_at - self.claim_ttl / 3
        due = [f for f in fields if self._claimed_at.get(f, -1.0) <= due_before]
        if not due:
            return
        await self._client.run(
            REFRESH, (sk.claims, sk.wants, sk.limit_key), (ms(self.claim_ttl), *due)
        )
        for field in due:
            if field in self._claimed_at:
                self._claimed_at[field] = sent_at

    async def release(
        self,
        hold: Hold,
        count: int,
        release_id: str,
        successor: Successor | None,
        hand_over_freely: bool,
        listening: bool,
    ) -> Released:
        keys = _keys(hold.keys)
        rt = self._rt
        reply = await self._client.run(
            RELEASE,
            (keys.lock, keys.expiry, keys.fence, keys.tombstone(release_id)),
            (hold.field, rt.manager_id, hold.token, rt.fence_ms, rt.tombstone_ms),
        )
        if isinstance(reply, int):
            # Released. The engine would make this manager's waiters yield to the other
            # listeners for a moment; the claims in Redis already keep the order between
            # clients, so report none and let the local head try at once.
            return Released(ReleaseStatus.RELEASED, 0)
        code, value = as_int(reply[0]), reply[1]
        if code == 2:
            return Released(ReleaseStatus.RELEASED, 0)
        if code == -1:
            raise key_type_error(keys.lock, value)
        return Released(ReleaseStatus.NOT_HELD, 0)

    def renew_keys(self, keys: LockKeys) -> tuple[str, ...]:
        sk = _keys(keys)
        return (sk.lock, sk.expiry, sk.limit_key)

    async def force_release(self, keys: LockKeys) -> bool:
        sk = _keys(keys)
        code, value = await self._client.run(
            FORCE_RELEASE, (sk.lock, sk.expiry), (self._rt.manager_id,)
        )
        if as_int(code) == -1:
            raise key_type_error(keys.lock, value)
        return as_int(code) == 1

    # -- used by the handle only -------------------------------------------------------

    async def set_limit(self, keys: SemaphoreKeys, limit: int) -> int:
        """Store *limit* for every client and wake the waiters; the previous limit (0: none)."""
        old = await self._client.run(
            SET_LIMIT,
            (keys.limit_key, keys.lock, keys.claims),
            (limit, keys.channel, self._rt.manager_id),
        )
        return as_int(old)

    async def state(self, keys: SemaphoreKeys) -> tuple[int, int, int, int]:
        """(limit stored or -1, permits held, holders, claims), on the server's clock."""
        reply = await self._client.run(
            STATE, (keys.lock, keys.expiry, keys.limit_key, keys.wants), ()
        )
        limit, held, holders, claims = (as_int(v) for v in reply)
        return limit, held, holders, claims
