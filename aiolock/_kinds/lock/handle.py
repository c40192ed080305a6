"""Lock: the handle a user holds; validates arguments and delegates to the engine.

The lock API it shares with the other lock-like kinds' handles (acquire, release,
extend, the queries, ``async with``) is :mod:`aiolock._engine.lockhandle`'s, inherited as
it is (the acquisition's path gains no call); what only the plain lock does is here:
the hand-off between tasks and processes (:mod:`aiolock._kinds.lock.handoff`), and the
lease left of a lock whose key outlives its holds.
"""

from __future__ import annotations

from abc import ABCMeta
from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiolock._engine.handle import _DEFAULT
from aiolock._engine.handoff import HandoffToken
from aiolock._engine.lockhandle import LockHandle
from aiolock._keys import check_lease
from aiolock._kinds.lock.handoff import adopt, detach, handoff_kind
from aiolock._kinds.lock.kind import ReentrantLockKind

if TYPE_CHECKING:
    from aiolock._engine.engine import Engine
    from aiolock._engine.kind import Hold

__all__ = ["Lock"]


class Lock(LockHandle["Lock"], metaclass=ABCMeta):
    """A reentrant distributed lock, owned by the asyncio task that acquires it.

    Made by :meth:`aiolock.LockManager.lock`. Use it as ``async with lock:`` (the body is
    cancelled and :class:`LockLostError` raised if the hold is lost), or call
    :meth:`acquire` / :meth:`try_acquire` and :meth:`release` yourself.
    """

    # (ABCMeta: FairLock and the read-write lock's sides have the Lock API, built on the
    # same base in their own kinds' folders, and are registered as Locks by aiolock's
    # __init__, as they were when they derived from this class.)

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} timeout={self._timeout} lease={self._lease}>"

    # -- hand-off between tasks and processes -------------------------------------------

    async def detach(self, *, lease: float | None = None) -> str:
        """Give up the current task's hold without freeing the lock; a token to adopt it.

        The lock stays held, by nobody, until a task of this or another process passes
        the token to :meth:`adopt` (once), or for *lease* seconds (default: the manager's
        lease), which bounds a token nobody adopts. From here the current task does not
        own it: its :meth:`release` raises :class:`LockNotOwnedError`, and an ``async
        with`` block around the call releases nothing at its end. The token is a short
        str, safe in argv, URLs and headers; it carries the fencing token, which does not
        change. Plain locks of aiolock's own wire format only; a re-entered hold (held
        more than once by the task) is refused. See ``docs/recipes/handoff.md``.
        """
        kind = self._handoff_kind()
        seconds = None if lease is None else check_lease(lease)
        engine = self._manager._open_engine()
        hold = self._owned_hold()
        return await detach(engine, kind, hold, engine.rt.lease if seconds is None else seconds)

    async def adopt(self, token: str, *, lease: float | None = _DEFAULT) -> None:
        """Take over the lock that :meth:`detach` handed off as *token*, for the current task.

        The task then owns it as if it had acquired it: renewed, its loss detected,
        released by :meth:`release` (or when the task ends). *lease* is the hold's lease
        as for :meth:`acquire` (default: the handle's; None renews it automatically).
        Raises :class:`LockHandoffError` if the token was adopted already, or its lease
        ran out, or the lock was force-released; ``ValueError`` if the token is not one
        or names another lock (the name, prefix and wire format must match).
        """
        fixed = self._adopt_lease(lease)
        found = HandoffToken.decode(token)
        kind = self._handoff_kind()
        if found.key != self._keys.lock:
            raise ValueError(
                f"the hand-off token is for the lock key {found.key!r}, not this lock's "
                f"{self._keys.lock!r}: adopt it with a handle of the same name, from a "
                "LockManager with the same prefix"
            )
        engine = self._manager._open_engine()
        owner = self._manager._owner()
        await adopt(engine, kind, self._keys, owner, found, fixed)
        max_hold = engine.rt.max_hold if self._max_hold is _DEFAULT else self._max_hold
        hold = engine.registry.get(self._resource, owner)
        if max_hold is not None and hold is not None:
            engine.bound(hold, max_hold)  # from the adoption: a new holder, a new bound

    def _handoff_kind(self) -> ReentrantLockKind:
        return handoff_kind(self._kind, self._what(), plain=type(self) is Lock)

    # -- queries -------------------------------------------------------------------------

    async def _lease_left(self, engine: Engine) -> int:
        if isinstance(self._kind, ReentrantLockKind):  # a string that outlives its holds
            return await self._kind.lease_left(self._keys)
        return await super()._lease_left(engine)

    # -- async with (Handle's __aenter__ and __aexit__) ----------------------------------

    def _entered(self, holds: Sequence[Hold]) -> Lock:
        return self
