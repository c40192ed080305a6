"""The timestamp lock kind (``wire="timestamp"``): the legacy SETNX/GETSET expiry lock.

The lock is a string at the lock name ``N`` itself holding its holder's expiry time, in
milliseconds since the Unix epoch: a client takes it with ``SETNX N <expiry>``, or, if
the stored expiry has passed, with ``GETSET N <new expiry>`` when the value it swapped
out is the stale one it saw; it renews by writing a later expiry and releases with
``DEL``. aiolock does each step in one script (atomic, so its check cannot fail) and
leaves the same value behind, so legacy clients and aiolock exclude each other on one
name. ``docs/wire-timestamp.md`` is the contract, with the protocol's hazards.

The protocol has no owner identity: the value is only a time. aiolock records which of
its holds wrote the current value in a key of its own, ``P:ts:{N}:holder`` =
``<value> <owner field>`` (see :func:`~aiolock._formats.foreign.aux_base`), which expires
with that value; a hold is aiolock's while both agree. aiolock compares expiries with
the Redis server's clock (``TIME`` in the scripts); legacy clients use their own.

Legacy clients never publish, so aiolock's waiters poll with a bounded backoff while one
holds the lock, and sleep on pub/sub (``P:ts:{N}:released``) while an aiolock client
of the same prefix does. There are no fencing tokens. Re-entry is counted in the process.
"""

from __future__ import annotations

from typing import Any

from aiolock._engine.kind import Attempt, Busy, Granted, Hold
from aiolock._engine.runtime import Runtime
from aiolock._formats.foreign import ForeignKeys, PollBackoff, StringKindBase, string_type_error
from aiolock._keys import TIMESTAMP_TAG, LockKeys, ms
from aiolock._redis.client import as_int
from aiolock._redis.scripts import Script

__all__ = ["TimestampLockKind", "timestamp_keys"]

ACQUIRE = Script("_formats/timestamp/acquire")
RELEASE = Script("_formats/timestamp/release")
RENEW = Script("_formats/timestamp/renew")
UNDO = Script("_formats/timestamp/undo")
FORCE_RELEASE = Script("_formats/timestamp/force_release")


# acquire.lua
_ACQUIRED, _BUSY, _VOIDED, _BAD_KEY = 1, 0, 3, -1
# release.lua answers with the token lock's codes (decoded by StringKindBase.release)


def timestamp_keys(prefix: str, name: str) -> ForeignKeys:
    return ForeignKeys(prefix, name, TIMESTAMP_TAG, "timestamp")


def _record(keys: LockKeys) -> str:
    """aiolock's holder record of the lock (see the module docstring)."""
    return keys.part("holder")


class TimestampLockKind(StringKindBase):
    """Scripts and reply decoding of the timestamp lock; everything else is the engine's."""

    name = "timestamp lock"
    renew_script = RENEW
    #: two GETs and two writes per hold (the lock's value and its holder record): about
    #: 3x a lock's Redis time per hold, so 100 a call stay under a millisecond on a
    #: loaded server (benchmarks/NOTES.md)
    renew_batch = 100
    fencing_unavailable = (
        "locks of the 'timestamp' wire format have no fencing token: the legacy "
        "SETNX/GETSET protocol stores only an expiry time, and legacy clients would not "
        "advance a counter. Use wire='aiolock' for fencing tokens"
    )

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._client = runtime.client
        self._backoff = PollBackoff()

    def resource(self, keys: LockKeys) -> str:
        # Not the key itself: see TokenLockKind.resource.
        return f"\0{TIMESTAMP_TAG}\0{keys.lock}"

    async def attempt(self, attempt: Attempt) -> Granted | Busy:
        keys = attempt.keys
        reply = await self._client.run(
            ACQUIRE,
            (keys.lock, _record(keys), attempt.void),
            (attempt.field, ms(attempt.lease), attempt.before),
        )
        code = as_int(reply[0])
        if code == _ACQUIRED:
            self._backoff.forget(keys.lock)
            return Granted(0, attempt.before + 1)
        if code == _BAD_KEY:
            raise string_type_error(keys.lock, reply[1])
        if code == _VOIDED:  # only an attempt resent after its own undo sees that
            return Busy(0.0)
        left_ms, announced = as_int(reply[1]), as_int(reply[2]) == 1
        # 0 ms left is "try again in a moment", not unknown (see busy_for)
        ttl = max(left_ms, 1) / 1000 if left_ms >= 0 else 0.0
        if announced:  # an aiolock holder of this prefix: its release message wakes us
            return Busy(ttl)
        return Busy(self._backoff.next(keys.lock, ttl))  # a legacy holder: poll

    async def undo(self, attempt: Attempt) -> bool:
        if attempt.before:  # a re-entry only rewrote the expiry of a hold we keep
            return False
        keys = attempt.keys
        undone = await self._client.run(
            UNDO,
            (keys.lock, _record(keys), attempt.void),
            (attempt.field, attempt.void_ms, keys.channel, self._rt.manager_id),
        )
        return as_int(undone) == 1

    async def _final_release(self, hold: Hold, release_id: str, listening: bool) -> Any:
        keys = hold.keys
        rt = self._rt
        return await self._client.run(
            RELEASE,
            (keys.lock, _record(keys), keys.tombstone(release_id)),
            (hold.field, keys.channel, rt.manager_id, 1 if listening else 0, rt.tombstone_ms),
        )

    def renew_keys(self, keys: LockKeys) -> tuple[str, ...]:
        return (keys.lock, _record(keys))

    async def force_release(self, keys: LockKeys) -> bool:
        code, value = await self._client.run(
            FORCE_RELEASE, (keys.lock, _record(keys)), (keys.channel, self._rt.manager_id)
        )
        if as_int(code) == -1:
            raise string_type_error(keys.lock, value)
        return as_int(code) == 1
