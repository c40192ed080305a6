"""Observers: a hook through which tracing and metrics see what the locks do.

An :class:`Observer` is told of each step of a hold's life, by the engine, synchronously
and in the task where the step happens:

* ``acquire_started`` -> ``acquired`` or ``acquire_failed``: one wait for a new hold
  (a re-entry of a hold the task already has is no new hold and reports nothing);
* ``acquired`` -> ``released`` or ``lost``: exactly one of the two ends every hold whose
  ``acquired`` was reported;
* ``renewed``: one successful renewal round trip of the watchdog.

Observers are given to the manager (``LockManager(..., observers=[...])`` or
:meth:`~aiolock.LockManager.add_observer`), which calls ``attached(manager)`` once so that
an observer can also read the manager's :meth:`~aiolock.LockManager.statistics` (gauges
such as the number of waiters). An observer that raises is logged (once per observer and
method) and otherwise ignored: observing never breaks a lock operation. With no observer
the engine skips all of this at the cost of an attribute check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Literal, Protocol

__all__ = ["AcquireFailure", "ObservedManager", "Observer", "ObserverSet", "failure_reason"]

logger = logging.getLogger("aiolock")

#: Why a wait ended without a hold: its timeout ran out, its task was cancelled, or an
#: error ended it (Redis unreachable or refusing, the manager closed, ...).
AcquireFailure = Literal["timeout", "cancelled", "error"]


class ObservedManager(Protocol):
    """What an observer is given of the manager it is attached to: a :class:`LockManager`.

    (A protocol, not an import: the manager imports this module.)
    """

    @property
    def prefix(self) -> str: ...

    @property
    def is_open(self) -> bool: ...

    def statistics(self) -> Any:
        """A :class:`~aiolock.ManagerStatistics`."""
        ...


class Observer:
    """Base class of observers: every method is a no-op; override the ones you need.

    *kind* is the lock kind's name (``"lock"``, ``"fair lock"``, ``"read lock"``,
    ``"write lock"``, ``"semaphore"``), *name* the lock's name; durations are seconds of
    the monotonic clock. Methods are called synchronously from the event loop, so they
    should be quick and must not block.
    """

    def attached(self, manager: ObservedManager) -> None:
        """This observer was added to *manager* (for reading its statistics later)."""

    def acquire_started(self, kind: str, name: str) -> None:
        """The current task starts acquiring a new hold of *name*."""

    def acquired(self, kind: str, name: str, waited_s: float, token: int) -> None:
        """The current task got the hold, after *waited_s*; *token* is its fencing token
        (0 in the wire formats that have none: token, timestamp, redisson by default)."""

    def acquire_failed(self, kind: str, name: str, waited_s: float, reason: AcquireFailure) -> None:
        """The current task's acquire ended without a hold, after *waited_s*."""

    def released(self, kind: str, name: str, held_s: float, token: int) -> None:
        """A hold ended by its release, after *held_s*.

        Also reported when the owner's release could not be confirmed and was handed to
        the background retrier, and when the owning task ended without releasing (aiolock
        then releases it).
        """

    def lost(self, kind: str, name: str, held_s: float, token: int, reason: str) -> None:
        """A hold ended by being lost (lease ran out, force-released, manager closed, ...).

        *reason* says what happened, in words (not a fixed set of values).
        """

    def renewed(self, kind: str, count: int, round_trip_s: float) -> None:
        """The watchdog renewed *count* holds of *kind* in one round trip of *round_trip_s*."""


class ObserverSet:
    """The observers of one manager, called in turn, each failure logged once."""

    __slots__ = ("_failed", "_observers", "active")

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self._observers: list[Observer] = []
        self._failed: set[tuple[int, str]] = set()
        #: whether any observer is set: the engine checks only this on its hot path
        self.active = False
        for observer in observers:
            self.add(observer)

    def __iter__(self) -> Iterator[Observer]:
        return iter(list(self._observers))

    def __contains__(self, observer: object) -> bool:
        return observer in self._observers

    def add(self, observer: Observer) -> None:
        if not isinstance(observer, Observer):
            raise TypeError(
                f"an observer must be an aiolock.Observer (subclass it and override the "
                f"events you need), not {type(observer).__name__}"
            )
        if observer not in self._observers:
            self._observers.append(observer)
        self.active = True

    def remove(self, observer: Observer) -> None:
        if observer in self._observers:
            self._observers.remove(observer)
        self.active = bool(self._observers)

    def _call(self, method: str, *args: Any) -> None:
        for observer in self._observers:
            try:
                getattr(observer, method)(*args)
            except Exception:
                key = (id(observer), method)
                if key not in self._failed:
                    self._failed.add(key)
                    # Once: an observer that fails on every event would flood the log.
                    logger.exception(
                        "aiolock observer %r failed in %s(); the lock operation went on "
                        "(further failures of this observer in %s() are not logged)",
                        observer,
                        method,
                        method,
                    )

    def acquire_started(self, kind: str, name: str) -> None:
        self._call("acquire_started", kind, name)

    def acquired(self, kind: str, name: str, waited_s: float, token: int) -> None:
        self._call("acquired", kind, name, waited_s, token)

    def acquire_failed(self, kind: str, name: str, waited_s: float, reason: AcquireFailure) -> None:
        self._call("acquire_failed", kind, name, waited_s, reason)

    def released(self, kind: str, name: str, held_s: float, token: int) -> None:
        self._call("released", kind, name, held_s, token)

    def lost(self, kind: str, name: str, held_s: float, token: int, reason: str) -> None:
        self._call("lost", kind, name, held_s, token, reason)

    def renewed(self, kind: str, count: int, round_trip_s: float) -> None:
        self._call("renewed", kind, count, round_trip_s)


def failure_reason(exc: BaseException) -> AcquireFailure:
    """The :data:`AcquireFailure` an exception that ended an acquire stands for."""
    if isinstance(exc, asyncio.CancelledError):  # anyio's cancellations included
        return "cancelled"
    if isinstance(exc, TimeoutError):  # LockTimeoutError is a TimeoutError
        return "timeout"
    return "error"
