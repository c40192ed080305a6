"""The reentrant lock kind: a hash of owner field to hold count, one owner at a time.

The lock's structure ``P:lock:{N}`` (see :mod:`aiolock._keys` for all the keys of a name) is a
hash with one field per acquisition, ``<manager id>:<task serial>:<acquisition number>``,
whose value is the hold count: re-entering increments it, and a late or resent command
about an earlier hold can never touch a later one. A final release publishes the
releasing manager's id on ``P:lock:{N}:released`` unless it hands the lock over.
A hold detached for another task or process to adopt (:mod:`aiolock._kinds.lock.handoff`) is the
field ``detached:<128 random bits, hex>`` until it is adopted or its lease runs out.

The reply codes of each script are named here, next to their decoding.
"""

from __future__ import annotations

from aiolock._engine.kind import (
    Attempt,
    Busy,
    Granted,
    Hold,
    KindBase,
    Released,
    Successor,
    decode_attempt,
    decode_release,
    wrong_type,
)
from aiolock._engine.runtime import Runtime
from aiolock._keys import LockKeys, ms
from aiolock._redis.client import as_int, key_type_error
from aiolock._redis.scripts import Script

__all__ = ["ReentrantLockKind"]

ACQUIRE = Script("_kinds/lock/acquire")
RELEASE = Script("_kinds/lock/release")
RENEW = Script("_kinds/lock/renew")
EXTEND_BY = Script("_kinds/lock/extend_by")
UNDO = Script("_kinds/lock/undo")
FORCE_RELEASE = Script("_kinds/lock/force_release")
DETACH = Script("_kinds/lock/detach")
ADOPT = Script("_kinds/lock/adopt")
LISTEN = Script("_kinds/lock/listen")


class ReentrantLockKind(KindBase):
    """Scripts and reply decoding of the reentrant lock; everything else is the engine's."""

    name = "lock"
    renew_script = RENEW
    extend_by_script = EXTEND_BY
    reentrant = True
    hand_over = True
    registers_listeners = True

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._client = runtime.client

    async def attempt(self, attempt: Attempt) -> Granted | Busy:
        keys = attempt.keys
        reply = await self._client.run(
            ACQUIRE,
            (keys.lock, keys.fence, attempt.void),
            (attempt.field, ms(attempt.lease), attempt.before),
        )
        return decode_attempt(reply, wrong_type(keys.lock))

    async def register_listener(self, keys: LockKeys, ttl: float) -> None:
        key = keys.part("listeners")
        await self._client.run(LISTEN, (key,), (self._rt.manager_id, ms(ttl) if ttl > 0 else 0))

    async def still_held(self, keys: LockKeys) -> float | None:
        # The lock hash exists exactly while someone holds it, and every release, undo
        # and force release publishes on the channel: only an ended lease (or an outside
        # deletion) frees it without a message, and then PTTL answers -2. While the key
        # exists with a TTL, an attempt would answer Busy with this very PTTL (a waiter's
        # field is new for each acquisition, so it is never in the hash): the probe
        # skips only the attempt's work, never a grant.
        pttl = as_int(await self._client.call("PTTL", keys.lock, key=keys.lock))
        return pttl / 1000 if pttl > 0 else None

    async def undo(self, attempt: Attempt) -> bool:
        keys = attempt.keys
        void_ms = attempt.void_ms
        undone = await self._client.run(
            UNDO,
            (keys.lock, attempt.void),
            (attempt.field, attempt.before, void_ms, keys.channel, self._rt.manager_id),
        )
        return as_int(undone) == 1

    async def release(
        self,
        hold: Hold,
        count: int,
        release_id: str,
        successor: Successor | None,
        hand_over_freely: bool,
        listening: bool,
    ) -> Released:
        keys = hold.keys
        rt = self._rt
        reply = await self._client.run(
            RELEASE,
            (keys.lock, keys.fence, keys.tombstone(release_id)),
            (
                hold.field,
                count,
                rt.manager_id,
                hold.token,
                rt.fence_ms,
                rt.tombstone_ms,
                successor.field if successor else "",
                ms(successor.lease) if successor else 0,
                1 if hand_over_freely else 0,
                1 if listening else 0,
            ),
        )
        return decode_release(reply, wrong_type(keys.lock))

    async def force_release(self, keys: LockKeys) -> bool:
        code, value = await self._client.run(
            FORCE_RELEASE, (keys.lock,), (keys.channel, self._rt.manager_id)
        )
        if as_int(code) == -1:
            raise key_type_error(keys.lock, value)
        return as_int(code) == 1

    async def detach(self, hold: Hold, detached: str, lease: float) -> bool:
        """Move *hold* to the field *detached* for *lease* s; False if Redis no longer had it."""
        keys = hold.keys
        code, value = await self._client.run(
            DETACH, (keys.lock,), (hold.field, detached, ms(lease))
        )
        if as_int(code) == -1:
            raise key_type_error(keys.lock, value)
        return as_int(code) == 1

    async def adopt(
        self, keys: LockKeys, detached: str, field: str, lease: float | None
    ) -> tuple[bool, int]:
        """Move the hold of field *detached* to *field* with a lease of *lease* s (None:
        leave the lease as it is): (True, 0), or (False, the lock's PTTL in ms)."""
        code, value = await self._client.run(
            ADOPT, (keys.lock,), (detached, field, 0 if lease is None else ms(lease))
        )
        if as_int(code) == -1:
            raise key_type_error(keys.lock, value)
        return as_int(code) == 1, as_int(value)
