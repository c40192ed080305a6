"""Leader election: one process at a time leads a name, on top of an ordinary lock.

Leading *name* is holding the lock *name* with the manager's lease, renewed by the
manager's watchdog while the process lives. A process that dies stops renewing, so its
leadership ends with its lease; a hold found lost (a renewal refused, the lease run out
on this client's clock, a forced release) cancels the leader's body at once, as in any
``async with`` of a lock, and :meth:`LeaderElection.run` campaigns again. Each term gets
the lock's fencing token, which is larger than the token of every earlier term of the
name: a resource that records the largest token it has seen refuses a deposed leader.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from aiolock._engine.guard import ManagerLike
from aiolock._errors import LockLostError, ManagerNotOpenError

if TYPE_CHECKING:
    from aiolock._engine.kind import Hold
    from aiolock._kinds.lock.handle import Lock

__all__ = ["LeaderElection", "LeaderTerm"]

logger = logging.getLogger("aiolock")


class _Manager(ManagerLike, Protocol):
    """What an election needs of the manager that made it (no import of the manager,
    which imports this module)."""

    _state: str


@dataclass(frozen=True)
class LeaderTerm:
    """One term of leadership of a name by this process.

    Attributes:
        name: the name led (the name of the lock that carries the election).
        number: this election object's count of terms, from 1.
        fencing_token: the lock's fencing token for this term; every later term of the
            name, in any process, has a larger one.
    """

    name: str
    number: int
    fencing_token: int


class LeaderElection:
    """Campaigns for a name and runs code while this process leads it.

    Made by :meth:`aiolock.LockManager.leader`. Use :meth:`run` for a job that should
    run on exactly one process (it campaigns again after a loss), or ``async with
    election.lead() as term:`` for one term. The election is the lock *name* of the
    manager: ``aiolock show NAME`` shows the leader.
    """

    __slots__ = ("_active", "_hold", "_lock", "_lost", "_manager", "_term", "_terms")

    def __init__(self, manager: _Manager, lock: Lock) -> None:
        self._manager = manager
        self._lock = lock
        #: the hold of the current term (None between terms)
        self._hold: Hold | None = None
        self._term: LeaderTerm | None = None
        self._terms = 0
        #: whether the last term ended by a loss of its hold (not an error of the body)
        self._lost = False
        #: whether a task is campaigning or leading with this object
        self._active = False

    @property
    def name(self) -> str:
        """The name campaigned for."""
        return self._lock.name

    @property
    def is_leader(self) -> bool:
        """Whether this process leads now, per the lease as this client knows it.

        False from the moment the hold is known lost (a refused renewal, or the lease
        run out on this client's clock), even before the body has been cancelled.
        """
        hold, engine = self._hold, self._manager._engine
        if hold is None or engine is None or not self._manager.is_open:
            return False
        return engine.registry.alive(hold)

    @property
    def term(self) -> LeaderTerm | None:
        """The current term, or None when this process does not lead."""
        return self._term if self.is_leader else None

    def __repr__(self) -> str:
        term = self.term
        state = f"leading term {term.number}" if term else "not leading"
        return f"<LeaderElection {self.name!r} {state}>"

    @asynccontextmanager
    async def lead(self) -> AsyncIterator[LeaderTerm]:
        """Wait until this process leads, and hold the leadership for the block's body.

        If the leadership is lost meanwhile, the body is cancelled and
        :class:`LockLostError` is raised at the end of the block, as for a lock. Leaving
        the block (also by a cancellation) ends the term and releases the name.
        """
        if self._active:
            raise RuntimeError(
                f"the election {self.name!r} is already campaigning or leading in another "
                "task; make one election object per campaigning task"
            )
        self._active = True
        try:
            async with self._lock:  # waits as long as it takes: the lock's timeout is None
                self._terms += 1
                hold = self._hold = self._lock._current_hold()
                assert hold is not None  # the block holds it
                term = self._term = LeaderTerm(self.name, self._terms, hold.token)
                logger.info(
                    "leading %r (term %d, fencing token %d)", self.name, term.number, hold.token
                )
                try:
                    yield term
                finally:
                    self._lost = hold.lost
                    self._hold = self._term = None
        finally:
            self._active = False

    async def run(self, body: Callable[[LeaderTerm], Awaitable[object]]) -> None:
        """Campaign, and run ``await body(term)`` in every term this process leads.

        A lost leadership cancels *body* and campaigns again. Returns when *body* returns
        (the leadership is released then), or when the manager stops: it was closed, or
        :meth:`~aiolock.LockManager.stop_acquiring` was called. Cancelling the task that
        awaits it releases the leadership. An error of *body* is raised, after release. A
        campaign rides out a Redis outage: it waits until Redis answers again.
        """
        while True:
            term: LeaderTerm | None = None
            try:
                async with self.lead() as term:
                    await body(term)
                return
            except LockLostError as exc:
                if term is not None and not self._lost:
                    raise  # the body's own error, about another lock
                if not self._manager.is_open:
                    return  # lost by the manager's close: the process is stopping
                # (term None: the lease ran out before the term began; the body never ran)
                logger.warning(
                    "lost the leadership of %r (%s): %s; campaigning again",
                    self.name,
                    "before the term began" if term is None else f"term {term.number}",
                    exc,
                )
            except ManagerNotOpenError:
                if self._manager._state in ("new", "failed"):
                    raise  # never opened, or broken: not a stop the caller asked for
                return
