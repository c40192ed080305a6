"""Wire formats: which Redis structures a manager's locks use, chosen per manager or per lock.

A wire format maps each kind of handle the manager makes (lock, fair lock, read-write lock,
semaphore) to the :class:`~aiolock._engine.kind.LockKind` that runs it and the keys it uses.
``"aiolock"`` is aiolock's own layout (``docs/wire-formats.md``); the other formats let
aiolock share lock names with other clients, and refuse a kind they cannot express
faithfully with :class:`~aiolock.WireFormatError`, at the call that asked for it.

The manager keeps one instance of each kind (see ``LockManager._kind``): a format asks it
for the kinds it needs through *make*, so kinds of several formats can coexist in one
manager (``wire=`` per lock).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from aiolock._errors import WireFormatError
from aiolock._keys import FAIR_TAG, RW_TAG
from aiolock._kinds.fair.kind import FairLockKind
from aiolock._kinds.lock.kind import ReentrantLockKind
from aiolock._kinds.rw.kind import ReadLockKind, WriteLockKind
from aiolock._kinds.semaphore.kind import SemaphoreKeys, SemaphoreKind

if TYPE_CHECKING:
    from aiolock._engine.kind import LockKind
    from aiolock._engine.runtime import Runtime
    from aiolock._keys import KeySpace, LockKeys

__all__ = ["KindMaker", "WireFormat", "WireName"]

_K = TypeVar("_K")


class KindMaker(Protocol):
    """The manager's instance of a kind, made on first use: ``make(KindClass)``."""

    def __call__(self, factory: Callable[[Runtime], _K], /) -> _K: ...


#: The names ``wire=`` accepts (each a key of ``aiolock._formats._FORMATS``).
WireName = Literal["aiolock", "redisson", "token", "timestamp"]


class WireFormat:
    """aiolock's own layout; other formats subclass it and override what differs.

    Each method returns the kind(s) and keys for one handle, or raises
    :class:`WireFormatError` (via :meth:`unsupported`) if the format cannot express it.
    """

    name = "aiolock"
    #: why this format is refused on a Redis Cluster ("" if it works there)
    cluster_unsupported = ""

    def lock(self, make: KindMaker, keyspace: KeySpace, name: str) -> tuple[LockKind, LockKeys]:
        """The kind and keys of ``lock(name)`` (and of each name of a multi-lock)."""
        return make(ReentrantLockKind), keyspace.keys(name)

    def fair_lock(
        self, make: KindMaker, keyspace: KeySpace, name: str
    ) -> tuple[LockKind, LockKeys]:
        return make(FairLockKind), keyspace.keys(name, FAIR_TAG)

    def rw_lock(
        self, make: KindMaker, keyspace: KeySpace, name: str
    ) -> tuple[LockKind, LockKind, LockKeys]:
        """The read kind, the write kind, and the keys they share."""
        read, write = make(ReadLockKind), make(WriteLockKind)
        return read, write, keyspace.keys(name, RW_TAG)

    def semaphore(
        self, make: KindMaker, keyspace: KeySpace, name: str, limit: int
    ) -> tuple[SemaphoreKind, SemaphoreKeys]:
        return make(SemaphoreKind), SemaphoreKeys(keyspace.prefix, name, limit)

    def unsupported(self, what: str, why: str) -> WireFormatError:
        """The error for a handle this format cannot make: what, why, and what to do."""
        return WireFormatError(
            f"the {self.name!r} wire format has no {what}: {why}. Use aiolock's own format "
            f"for this one (pass wire='aiolock' when making it), or another kind"
        )

    def __repr__(self) -> str:
        return f"<WireFormat {self.name!r}>"
