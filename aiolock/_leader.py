"""Leader election: one process at a time leads a name, on top of an ordinary lock.

Leading *name* is holding the lock *name* with the manager's lease, renewed by the
manager's watchdog while the process lives. A process that dies stops renewing, so its
leadership ends with its lease; a hold found lost (a renewal refused, the lease run out
on this client's clock, a forced release) cancels the leader's body at once, as in any
``async with`` of a lock, and :meth:`LeaderElection.run` campaigns again.

A term is numbered by the lock's fencing token, which is larger than the token of every
earlier term of the name, in any process: the number a leader logs is the one a resource
that records the largest token it has seen checks, and it refuses a deposed leader. (A
count of terms per election object would say ``term 1`` in every new leader.)

A loss says why (the hold's loss reason, in the log and in :class:`LockLostError`): the
lease ran out while the event loop stood still (code that blocked it, or a stopped
process), or while Redis could not be reached, or Redis no longer had the key.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from aiolock._engine.guard import ManagerLike
from aiolock._engine.lifecycle import Life
from aiolock._errors import LockLostError, ManagerNotOpenError

if TYPE_CHECKING:
    from aiolock._engine.kind import Hold
    from aiolock._engine.lockhandle import Lock

__all__ = ["LeaderElection", "LeaderTerm"]

logger = logging.getLogger("aiolock")


class _Manager(ManagerLike, Protocol):
    """What an election needs of the manager that made it (no import of the manager,
    which imports this module)."""

    _state: Life


@dataclass(frozen=True)
class LeaderTerm:
    """One term of leadership of a name by this process, known by its fencing token.

    ``str(term)`` is ``term <fencing_token> of '<name>'``: the logs and
    ``repr(election)`` number a term by its token too.

    Attributes:
        name: the name led (the name of the lock that carries the election).
        fencing_token: the term's number: the lock's fencing token for this term. Every
            later term of the name, in any process, has a larger one, so it orders the
            terms of all the processes that campaign; they are not consecutive (aiolock's
            own wire format takes them from the server's clock, in microseconds).
    """

    name: str
    fencing_token: int

    def __str__(self) -> str:
        return f"term {self.fencing_token} of {self.name!r}"


class LeaderElection:
    """Campaigns for a name and runs code while this process leads it.

    Made by :meth:`aiolock.LockManager.leader`. Use :meth:`run` for a job that should
    run on exactly one process (it campaigns again after a loss), or ``async with
    election.lead() as term:`` for one term. The election is the lock *name* of the
    manager: ``aiolock show NAME`` shows the leader.
    """

    __slots__ = ("_active", "_hold", "_lock", "_lost", "_manager", "_term")

    def __init__(self, manager: _Manager, lock: Lock) -> None:
        self._manager = manager
        self._lock = lock
        #: the hold of the current term (None between terms)
        self._hold: Hold | None = None
        self._term: LeaderTerm | None = None
        #: why the last term's hold was lost, if it ended by a loss (not an error of the
        #: body, nor a release)
        self._lost: str | None = None
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
        state = f"leading term {term.fencing_token}" if term else "not leading"
        return f"<LeaderElection {self.name!r} {state}>"

    @asynccontextmanager
    async def lead(self) -> AsyncIterator[LeaderTerm]:
        """Wait until this process leads, and hold the leadership for the block's body.

        If the leadership is lost meanwhile, the body is cancelled and
        :class:`LockLostError` is raised at the end of the block, as for a lock; its
        message says why (the lease ran out while the event loop stood still, or while
        Redis could not be reached; or Redis no longer had the key). Leaving the block
        (also by a cancellation) ends the term and releases the name.
        """
        if self._active:
            raise RuntimeError(
                f"the election {self.name!r} is already campaigning or leading in another "
                "task; make one election object per campaigning task"
            )
        self._active = True
        try:
            async with self._lock:  # waits as long as it takes: the lock's timeout is None
                hold = self._hold = self._lock._current_hold()
                assert hold is not None  # the block holds it
                term = self._term = LeaderTerm(self.name, hold.token)
                logger.info("leading %r: term %d (its fencing token)", self.name, hold.token)
                try:
                    yield term
                finally:
                    self._lost = hold.lost_reason if hold.lost else None
                    self._hold = self._term = None
        finally:
            self._active = False

    async def run(self, body: Callable[[LeaderTerm], Awaitable[object]]) -> None:
        """Campaign, and run ``await body(term)`` in every term this process leads.

        A lost leadership cancels *body*, logs a WARNING saying why, and campaigns
        again. Returns when *body* returns
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
                if term is not None and self._lost is None:
                    raise  # the body's own error, about another lock
                if not self._manager.is_open:
                    return  # lost by the manager's close: the process is stopping
                if term is None:  # the lease ran out before the term began: no body ran
                    logger.warning(
                        "lost the leadership of %r before the term began: %s; campaigning again",
                        self.name,
                        exc,
                    )
                else:  # the hold's reason: a stopped loop, an unreachable Redis, a lost key
                    logger.warning(
                        "lost the leadership of %r (term %d): %s; campaigning again",
                        self.name,
                        term.fencing_token,
                        self._lost,
                    )
            except ManagerNotOpenError:
                if self._manager._state in (Life.NEW, Life.FAILED):
                    raise  # never opened, or broken: not a stop the caller asked for
                return
