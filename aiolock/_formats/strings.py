"""The formats whose lock is one string at the raw lock name: ``token`` and ``timestamp``.

Both have locks (and multi-locks of them) only: one string holding one holder's value has
no room for a queue of waiters, for readers sharing it, or for several permits, so the
other kinds are refused with :class:`~aiolock.WireFormatError` at the call that asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiolock._formats.base import KindMaker, WireFormat
from aiolock._formats.timestamp.kind import TimestampLockKind, timestamp_keys
from aiolock._formats.token.kind import TokenLockKind, token_keys

if TYPE_CHECKING:
    from aiolock._engine.kind import LockKind
    from aiolock._keys import KeySpace, LockKeys
    from aiolock._kinds.semaphore.kind import SemaphoreKeys, SemaphoreKind

__all__ = ["StringLockFormat", "TimestampFormat", "TokenFormat"]


class StringLockFormat(WireFormat):
    """A format whose lock is a string at the raw name, shared with other clients."""

    #: what the string holds, for the errors of the kinds it cannot express
    why = ""

    def fair_lock(
        self, make: KindMaker, keyspace: KeySpace, name: str
    ) -> tuple[LockKind, LockKeys]:
        raise self.unsupported("fair lock", f"{self.why}: no queue of waiters")

    def rw_lock(
        self, make: KindMaker, keyspace: KeySpace, name: str
    ) -> tuple[LockKind, LockKind, LockKeys]:
        raise self.unsupported("read-write lock", f"{self.why}: no room for readers sharing it")

    def semaphore(
        self, make: KindMaker, keyspace: KeySpace, name: str, limit: int
    ) -> tuple[SemaphoreKind, SemaphoreKeys]:
        raise self.unsupported("semaphore", f"{self.why}: no room for several holders")


class TokenFormat(StringLockFormat):
    """``SET name <token> NX PX`` + compare-and-delete, as redis-py's ``Lock``.

    The contract: ``docs/wire-token.md``."""

    name = "token"
    why = "its lock is one string holding one holder's token"

    def lock(self, make: KindMaker, keyspace: KeySpace, name: str) -> tuple[LockKind, LockKeys]:
        return make(TokenLockKind), token_keys(keyspace.prefix, name)


class TimestampFormat(StringLockFormat):
    """The legacy ``SETNX`` / ``GETSET`` lock whose value is an expiry time.

    The contract: ``docs/wire-timestamp.md``."""

    name = "timestamp"
    why = "its lock is one string holding one holder's expiry time"

    def lock(self, make: KindMaker, keyspace: KeySpace, name: str) -> tuple[LockKind, LockKeys]:
        return make(TimestampLockKind), timestamp_keys(keyspace.prefix, name)
