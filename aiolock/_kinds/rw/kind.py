"""The read-write lock: many readers or one writer, as two kinds on one structure.

Wire format, for a manager prefix ``P`` and a name ``N`` (``P:rw:{N}``, see
:mod:`aiolock._keys` for the tag and the common keys):

=================================  ====================================================
``P:rw:{N}``                       hash: ``<hold field>`` -> hold count, for every hold
                                   of either side; ``writer`` -> the write hold's field,
                                   ``writer_owner`` -> the owner id of its task and
                                   ``writer_attempt`` -> the void key of the attempt it
                                   belongs to (while a writer holds)
``P:rw:{N}:leases``                zset: ``<hold field>`` -> the end of that hold's
                                   lease, in ms of the server's clock
``P:rw:{N}:claims``                zset: a waiting writer's field -> the end of its
                                   claim, in ms of the server's clock
``P:rw:{N}:fence``                 string: the largest fencing token released
``P:rw:{N}:rel:<release id>``      tombstone of a final release
``P:rw:{N}:void:<attempt id>``     void marker of a cancelled attempt
``P:rw:{N}:released``              channel: the releasing manager's id, published when
                                   a release (or undo, or force release) may let a
                                   waiter in
=================================  ====================================================

Every hold has its own lease in ``leases``: the watchdog renews each reader's hold on
its own, and a crashed reader's hold ends when its own lease does (every script first
purges the holds whose lease ended). The hash and ``leases`` expire at the latest lease.
A writer that must wait registers a *claim* under its waiting field; while a live claim
exists, new reads wait (re-entries and a writer's own downgrade do not), so a stream of
readers cannot starve a writer. The engine refreshes the claims of live waiters every
``claim_ttl / 3``; the claim of a crashed waiter ends within ``claim_ttl``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
from aiolock._errors import LockKeyTypeError, LockTimeoutError
from aiolock._keys import LockKeys, ms
from aiolock._redis.client import as_int, as_text
from aiolock._redis.scripts import Script

__all__ = ["ReadLockKind", "WriteLockKind", "leases_key"]

ACQUIRE = Script("_kinds/rw/acquire")
RELEASE = Script("_kinds/rw/release")
RENEW = Script("_kinds/rw/renew")
UNDO = Script("_kinds/rw/undo")
REFRESH = Script("_kinds/rw/refresh")
FORCE_RELEASE = Script("_kinds/rw/force_release")


def leases_key(keys: LockKeys) -> str:
    return keys.part("leases")


def claims_key(keys: LockKeys) -> str:
    return keys.part("claims")


def _type_error(reply: Sequence[Any]) -> LockKeyTypeError:
    """A script's ``{-1, type, key}``: a key of the structure holds another type."""
    kind, key = as_text(reply[1]), as_text(reply[2])
    return LockKeyTypeError(
        f"Redis key {key!r} holds a {kind}, not part of an aiolock read-write lock, so the "
        "lock cannot be used; pick another lock name or prefix, or delete that key."
    )


class _SideKind(KindBase):
    """What both sides share: the structure, its scripts and their replies."""

    reentrant = True
    renew_script = RENEW
    #: ZSCORE, ZADD and two PEXPIREs per hold of its own structure: about 3x a lock's
    #: Redis time per hold, so 100 a call stay under a millisecond on a loaded server
    #: (150 took 0.8-1.1 ms there, 120 0.9-1.1 ms: benchmarks/NOTES.md)
    renew_batch = 100
    #: 'r' or 'w': the side the acquire script is asked for
    _side = ""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._client = runtime.client

    def resource(self, keys: LockKeys) -> str:
        # The two sides of one task are separate holds in the registry.
        return f"{keys.lock}#{self.name}"

    async def attempt(self, attempt: Attempt) -> Granted | Busy:
        keys = attempt.keys
        reply = await self._client.run(
            ACQUIRE,
            (keys.lock, leases_key(keys), claims_key(keys), keys.fence, attempt.void),
            (
                attempt.field,
                ms(attempt.lease),
                attempt.before,
                self._side,
                attempt.owner,
                ms(self.claim_ttl) if attempt.claim else 0,
            ),
        )
        return decode_attempt(reply, _type_error)

    async def undo(self, attempt: Attempt) -> bool:
        keys = attempt.keys
        void_ms = attempt.void_ms
        reply = await self._client.run(
            UNDO,
            (keys.lock, leases_key(keys), claims_key(keys), attempt.void),
            (attempt.field, attempt.before, void_ms, self._rt.manager_id),
        )
        if isinstance(reply, list):
            raise _type_error(reply)
        return as_int(reply) == 1

    async def release(
        self,
        hold: Hold,
        count: int,
        release_id: str,
        successor: Successor | None,
        hand_over_freely: bool,
        listening: bool,
    ) -> Released:
        # No hand-over (hand_over = False): *successor* is always None.
        keys = hold.keys
        rt = self._rt
        reply = await self._client.run(
            RELEASE,
            (keys.lock, leases_key(keys), keys.fence, keys.tombstone(release_id)),
            (
                hold.field,
                count,
                rt.manager_id,
                hold.token,
                rt.fence_ms,
                rt.tombstone_ms,
                1 if listening else 0,
            ),
        )
        return decode_release(reply, _type_error)

    def renew_keys(self, keys: LockKeys) -> tuple[str, ...]:
        return (keys.lock, leases_key(keys))

    async def force_release(self, keys: LockKeys) -> bool:
        reply = await self._client.run(
            FORCE_RELEASE,
            (keys.lock, leases_key(keys), claims_key(keys)),
            (self._rt.manager_id,),
        )
        if as_int(reply[0]) == -1:
            raise _type_error(reply)
        return as_int(reply[0]) == 1


class ReadLockKind(_SideKind):
    """The read side: shared, so one grant lets the next local waiter try at once."""

    name = "read lock"
    shared = True
    _side = "r"

    def timeout_error(self, keys: LockKeys, timeout: float | None, permits: int) -> Exception:
        return LockTimeoutError(
            f"read lock {keys.name!r} was not granted within {timeout} s: a writer held "
            "it or was waiting for it (waiting writers go first); pass a longer timeout, "
            "or timeout=None to wait as long as it takes"
        )


class WriteLockKind(_SideKind):
    """The write side: exclusive; a waiting writer's claim holds off new readers."""

    name = "write lock"
    claims = True
    _side = "w"

    def timeout_error(self, keys: LockKeys, timeout: float | None, permits: int) -> Exception:
        return LockTimeoutError(
            f"write lock {keys.name!r} was not granted within {timeout} s: readers or "
            "another writer held it; pass a longer timeout, or timeout=None to wait as "
            "long as it takes"
        )

    async def refresh_claims(self, keys: LockKeys, fields: Sequence[str]) -> None:
        reply = await self._client.run(REFRESH, (claims_key(keys),), (ms(self.claim_ttl), *fields))
        if isinstance(reply, list):
            raise _type_error(reply)
