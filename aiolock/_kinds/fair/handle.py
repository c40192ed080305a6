"""FairLock: the fair lock's handle, a :class:`~aiolock.Lock` over its kind.

Everything but its repr is the engine's :class:`~aiolock.Lock`
(:mod:`aiolock._engine.lockhandle`); what makes it fair is its kind
(:mod:`aiolock._kinds.fair.kind`) and its scripts. Its kind is not ``detachable``, so
its ``detach()`` and ``adopt()`` refuse.
"""

from __future__ import annotations

from aiolock._engine.lockhandle import Lock

__all__ = ["FairLock"]


class FairLock(Lock):
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
