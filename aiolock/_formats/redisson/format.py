"""The ``redisson`` wire format: locks (and multi-locks) in Redisson's RLock layout.

The kind that runs them is :mod:`aiolock._formats.redisson.kind`; the other kinds are refused
here, each with the reason (``docs/wire-redisson.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from aiolock._formats.base import KindMaker, WireFormat
from aiolock._formats.redisson.kind import RedissonKeys, RedissonLockKind

if TYPE_CHECKING:
    from aiolock._engine.kind import LockKind
    from aiolock._keys import KeySpace, LockKeys

__all__ = ["RedissonFormat"]


class RedissonFormat(WireFormat):
    """Locks (and multi-locks) in Redisson's RLock layout; the other kinds are refused."""

    name = "redisson"
    cluster_unsupported = (
        "on a Cluster, Redisson announces releases with PUBLISH or SPUBLISH depending on "
        "its subscription mode and server version, and this interop was verified on a "
        "single server only"
    )

    def lock(self, make: KindMaker, keyspace: KeySpace, name: str) -> tuple[LockKind, LockKeys]:
        return make(RedissonLockKind), RedissonKeys(keyspace.prefix, name)

    def fair_lock(self, make: KindMaker, keyspace: KeySpace, name: str) -> NoReturn:
        raise self.unsupported(
            "fair lock",
            "Redisson's RFairLock orders its waiters by thread timeouts that each Redisson "
            "client refreshes on its own schedule (redisson_lock_queue and "
            "redisson_lock_timeout), which aiolock does not reproduce faithfully",
        )

    def rw_lock(self, make: KindMaker, keyspace: KeySpace, name: str) -> NoReturn:
        raise self.unsupported(
            "read-write lock",
            "aiolock's read-write lock promises that a waiting writer holds off new readers "
            "(its claim in Redis), and Redisson's RReadWriteLock layout has no place for a "
            "claim that Redisson readers would honour, so a Redisson reader could starve an "
            "aiolock writer; its watchdog also renews every reader's timeout keys, a "
            "crashed reader's included",
        )

    def semaphore(self, make: KindMaker, keyspace: KeySpace, name: str, limit: int) -> NoReturn:
        raise self.unsupported(
            "semaphore",
            "Redisson's RSemaphore is a bare counter of free permits with no lease, so a "
            "holder that crashes never gives its permits back; aiolock's semaphore "
            "promises that a crashed holder's permits return when its lease ends",
        )
