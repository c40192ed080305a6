"""The ``redisson`` wire format: aiolock's locks kept as Redisson's ``RLock`` keeps them.

Facts from Redisson 3.52.0 (``RedissonLock``, ``RedissonBaseLock``, ``LockPubSub``,
``RedissonFencedLock``, ``renewal/LockTask``); the full contract is ``docs/wire-redisson.md``.

=======================================  ===============================================
``N`` (the raw lock name, no prefix)     hash: ``<client uuid>:<number>`` -> hold count;
                                         PEXPIRE'd to the lease, renewed while held
``redisson_lock__channel:{N}``           channel: ``0`` (Redisson's unlock message) per
                                         release that frees the lock
``redisson_lock_token:{N}``              RFencedLock's token counter (INCR per new
                                         acquisition), only with ``fence_ttl=None``
``P:rs:{N}:void:<attempt id>``           aiolock's void marker of an attempt cancelled
                                         in flight (Redisson never reads it)
``P:rs:{N}:rel:<release id>``            aiolock's tombstone of a final release
=======================================  ===============================================

(In Redisson's keys, ``{N}`` is written without the braces when ``N`` already contains
``{``: Redisson's own ``prefixName`` rule, which keeps those keys in the lock's Cluster
slot, except for a name with a ``}`` but no ``{``, as in Redisson itself; so the names
``x`` and ``{x}`` share Redisson's channel and token counter, in Redisson too. aiolock's
own keys ``P:rs:...`` are :func:`~aiolock._formats.foreign.aux_base`'s, unique per name.)

A Redisson client identifies an owner by ``<its client UUID>:<thread id>``. aiolock's
owner field is ``<the manager's UUID>:<number>``: the manager's 128-bit id printed as a
version-4 UUID, and a number unique per acquisition (stronger than a thread id: a late
command about an ended hold never touches a later one of the same task). Redisson only
compares fields for equality, so each side sees the other as one more owner.

The reply codes of each script are named here, next to their decoding.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from redis.crc import key_slot

from aiolock._engine.kind import (
    Attempt,
    Busy,
    Granted,
    Hold,
    Released,
    ReleaseStatus,
    Successor,
)
from aiolock._engine.kindbase import KindBase
from aiolock._engine.runtime import Runtime
from aiolock._formats.foreign import aux_base
from aiolock._keys import REDISSON_TAG, LockKeys, check_foreign_key, ms
from aiolock._redis.client import as_int, key_type_error
from aiolock._redis.scripts import Script

if TYPE_CHECKING:
    pass

__all__ = ["RedissonKeys", "RedissonLockKind", "redisson_field_id"]

ACQUIRE = Script("_formats/redisson/acquire")
RELEASE = Script("_formats/redisson/release")
UNDO = Script("_formats/redisson/undo")
FORCE_RELEASE = Script("_formats/redisson/force_release")
#: Redisson's watchdog renews exactly this way (HEXISTS the field, then PEXPIRE), so the
#: lock's own batched renewal script serves unchanged.
RENEW = Script("_formats/redisson/renew")
EXTEND_BY = Script("_formats/redisson/extend_by")

#: Redisson's ``LockPubSub.UNLOCK_MESSAGE``: the message its waiters wake on.
UNLOCK_MESSAGE = "0"

# acquire.lua
_ACQUIRED, _REENTERED, _BUSY, _VOIDED, _BAD_KEY = 1, 2, 0, 3, -1
# release.lua
_RELEASE_CODES = {
    1: ReleaseStatus.STILL_HELD,
    2: ReleaseStatus.RELEASED,
    4: ReleaseStatus.HANDED_OVER,
    0: ReleaseStatus.NOT_HELD,
}


def prefix_name(prefix: str, name: str) -> str:
    """Redisson's ``prefixName``: ``prefix:{name}``, or ``prefix:name`` if *name* has a ``{``."""
    return f"{prefix}:{name}" if "{" in name else f"{prefix}:{{{name}}}"


def redisson_field_id(manager_id: str) -> str:
    """The client UUID of a manager's owner fields: its 128-bit hex id as a UUID string."""
    return str(uuid.UUID(hex=manager_id, version=4))


class RedissonKeys(LockKeys):
    """The keys and channel of one name in Redisson's layout (see the module docstring)."""

    __slots__ = ("_own",)

    def __init__(self, prefix: str, name: str) -> None:
        # Not LockKeys.__init__: every key here is computed differently.
        self.name = name
        self.kind = "redisson"
        # Redisson's keys are outside every prefix: none may have the shape of a key of
        # aiolock's own layout, which could be another manager's object.
        self.lock = check_foreign_key(name, name, "redisson")
        self.channel = check_foreign_key(
            prefix_name("redisson_lock__channel", name), name, "redisson"
        )
        #: RFencedLock's token counter
        self.fence = check_foreign_key(prefix_name("redisson_lock_token", name), name, "redisson")
        # aiolock's own keys beside the lock live under the manager's prefix, in the
        # lock's slot, where no Redisson object is: P:rs:{...}, unique per (prefix, name)
        # (prefix_name would not be: "P:rs:a:{b}" is also lock "b" under prefix "P:rs:a").
        self._own = aux_base(prefix, REDISSON_TAG, name)
        self.void_prefix = f"{self._own}:void:"
        self.slot = key_slot(name.encode())

    def tombstone(self, release_id: str) -> str:
        return f"{self._own}:rel:{release_id}"

    def part(self, suffix: str) -> str:
        return f"{self._own}:{suffix}"


class RedissonLockKind(KindBase):
    """A reentrant lock whose every command is one Redisson's RLock understands."""

    name = "lock"
    renew_script = RENEW
    extend_by_script = EXTEND_BY
    reentrant = True
    hand_over = True
    # Redisson publishes the same "0" for every release, ours included.
    anonymous_messages = True

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._client = runtime.client
        self._uuid = redisson_field_id(runtime.manager_id)
        # RFencedLock's counter must never go back, so it is only ever written when the
        # manager keeps fencing state forever (fence_ttl=None), which is what it costs:
        # one key per name, never expiring.
        self._fenced = runtime.fence_ms == "-1"
        if not self._fenced:
            self.fencing_unavailable = (
                "the 'redisson' wire format takes fencing tokens from RFencedLock's counter "
                "(redisson_lock_token:{name}), which must be kept forever; this manager "
                "keeps fencing state for a limited time (fence_ttl), so its redisson locks "
                "have no tokens. Open the manager with fence_ttl=None to draw them"
            )

    def hold_field(self, owner: str, number: int) -> str:
        return f"{self._uuid}:{number}"

    async def attempt(self, attempt: Attempt) -> Granted | Busy:
        keys = attempt.keys
        code, value = await self._client.run(
            ACQUIRE,
            (keys.lock, attempt.void, keys.fence),
            (attempt.field, ms(attempt.lease), attempt.before, 1 if self._fenced else 0),
        )
        code = as_int(code)
        if code == _ACQUIRED:
            return Granted(as_int(value), 1)
        if code == _REENTERED:
            return Granted(0, as_int(value))
        if code == _BAD_KEY:
            raise key_type_error(keys.lock, value)
        if code == _BUSY:
            # PTTL 0 means under a millisecond left, not "unknown" (-1, no expiry): a
            # waiter that treated it as unknown would sleep a whole lease past a crashed
            # holder's expiry, since nobody publishes when a lease runs out.
            ttl = as_int(value)
            return Busy(max(ttl, 1) / 1000 if ttl >= 0 else 0.0)
        return Busy(0.0)  # _VOIDED: only an attempt resent after its own undo sees that

    async def undo(self, attempt: Attempt) -> bool:
        keys = attempt.keys
        undone = await self._client.run(
            UNDO,
            (keys.lock, attempt.void),
            (attempt.field, attempt.before, attempt.void_ms, keys.channel),
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
        # hand_over_freely is not used: a hand-over publishes nothing, and a Redisson
        # waiter has no other way to hear of a release; so the script hands over only
        # while nobody else listens on the channel.
        keys = hold.keys
        code, value = await self._client.run(
            RELEASE,
            (keys.lock, keys.tombstone(release_id), keys.fence),
            (
                hold.field,
                count,
                self._rt.tombstone_ms,
                successor.field if successor else "",
                ms(successor.lease) if successor else 0,
                1 if self._fenced else 0,
                1 if listening else 0,
                keys.channel,
            ),
        )
        status = _RELEASE_CODES.get(as_int(code))
        if status is None:  # -1: the key holds another type
            raise key_type_error(keys.lock, value)
        return Released(status, as_int(value))

    async def force_release(self, keys: LockKeys) -> bool:
        code, value = await self._client.run(FORCE_RELEASE, (keys.lock,), (keys.channel,))
        if as_int(code) == -1:
            raise key_type_error(keys.lock, value)
        return as_int(code) == 1
