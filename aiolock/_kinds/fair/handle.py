"""FairLock: the fair lock's handle, the lock API over its kind.

Everything but its repr is the lock API of :mod:`aiolock._engine.lockhandle`, which
this kind shares with the plain lock and the read-write lock's sides; what makes it fair
is its kind (:mod:`aiolock._kinds.fair.kind`) and its scripts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiolock._engine.lockhandle import LockHandle

if TYPE_CHECKING:
    from aiolock._engine.kind import Hold

__all__ = ["FairLock"]


class FairLock(LockHandle["FairLock"]):
    """A reentrant distributed lock granted first come, first served, across processes.

    Made by :meth:`aiolock.LockManager.fair_lock`; the API is :class:`~aiolock.Lock`'s.
    A waiting task's first attempt puts it in a queue kept in Redis; each release grants
    the lock to the first waiter still alive and wakes that waiter alone. A waiter that
    gives up (timeout, cancellation) leaves the queue at once; one whose process died
    leaves it within the claim lifetime (10 s). ``try_acquire()`` (one attempt) succeeds
    only if nobody holds the lock and nobody waits for it. See ``docs/fair-lock.md``.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<FairLock {self.name!r} timeout={self._timeout} lease={self._lease}>"

    def _entered(self, holds: Sequence[Hold]) -> FairLock:
        return self
