"""The ``async with`` guard shared by every kind's handle.

Entering registers a cancel scope with the hold, so that a loss (noticed by the
watchdog, a lease timer or another call) cancels the body; exiting turns that
cancellation into :class:`~aiolock.LockLostError`, or releases the hold. One handle may
be entered by many tasks, and nested in one task: the guard keeps a stack per task.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import anyio

from ._errors import LockConnectionError, LockError, LockLostError

if TYPE_CHECKING:
    from ._engine import Engine
    from ._kind import Hold

__all__ = ["Body", "BodyGuard", "ManagerLike", "forget_lost"]

logger = logging.getLogger("aiolock")


class ManagerLike(Protocol):
    """What a kind's handle needs from the manager that made it (no import of the manager,
    which imports the handles)."""

    _engine: Engine | None

    @property
    def is_open(self) -> bool: ...

    def _open_engine(self) -> Engine: ...

    def _owner(self) -> str: ...


#: Tasks that a Body has cancelled natively and whose block has not exited yet: one such
#: cancellation per task at a time (nested blocks lost together need only one).
_NATIVELY_CANCELLED: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
_LOST = "aiolock: a lock held by this 'async with' was lost"


class Body:
    """One ``async with`` block: its cancel scope, and its task, cancelled when a hold is lost.

    anyio's scope alone is not enough after a blocked event loop. When the loop runs
    again, the body's awaited future (a sleep, a reply) is often already done in the
    same iteration in which the deadline timer finds the lease over; anyio then defers
    the cancellation to the body's next await, so the body runs one more step, after
    the lease has ended (issue 23: a write 2 s after another process took the lock).
    A native ``Task.cancel()`` replaces that result with a CancelledError, so the step
    the loop resumes into is the cancellation. :meth:`BodyGuard.exit` takes it back.
    """

    __slots__ = ("cancelling_at_enter", "natively", "scope", "task")

    def __init__(self, scope: anyio.CancelScope, task: asyncio.Task[Any]) -> None:
        self.scope = scope
        self.task = task
        #: the task's cancel requests when the block was entered (3.11+): more at its
        #: exit, beyond our own, means a cancellation from outside
        self.cancelling_at_enter = 0
        if sys.version_info >= (3, 11):
            self.cancelling_at_enter = task.cancelling()
        self.natively = False

    def cancel(self) -> None:
        self.scope.cancel()
        task = self.task
        # The task's own call (a failed extend, say) reaches its next await anyway.
        if task is asyncio.current_task() or task.done() or task in _NATIVELY_CANCELLED:
            return
        if sys.version_info < (3, 11) and getattr(task, "_must_cancel", False):
            return  # 3.10: a cancellation already pending would get our message (below)
        _NATIVELY_CANCELLED.add(task)
        self.natively = True
        task.cancel(_LOST)

    def settle(self, exc: BaseException | None) -> bool:
        """At exit: take back our native cancellation; whether *exc* was it."""
        if not self.natively:
            return False
        _NATIVELY_CANCELLED.discard(self.task)
        if not isinstance(exc, asyncio.CancelledError):
            if sys.version_info >= (3, 11):
                self.task.uncancel()
            return False
        if sys.version_info >= (3, 11):
            # Ours unless another cancellation is pending (then that one goes on).
            return self.task.uncancel() <= self.cancelling_at_enter
        # 3.10 has no count: the message tells (a Task.cancel() after ours replaces it).
        return bool(exc.args) and exc.args[0] == _LOST


class BodyGuard:
    """Cancels ``async with`` bodies whose holds are lost, and releases them on exit.

    A block guards one hold, or several acquired together (a multi-lock): the loss of
    any of them cancels the body.
    """

    __slots__ = ("_entered",)

    def __init__(self) -> None:
        # Per task, the holds and cancel scope of each ``async with`` block it is in.
        self._entered: dict[asyncio.Task[Any], list[tuple[tuple[Hold, ...], Body]]] = {}

    def enter(self, engine: Engine, *holds: Hold) -> bool:
        """Guard a body with *holds*, which the current task has just acquired.

        False, entering nothing, if one of them is lost already (its lease ended while
        the acquire waited, or before its reply arrived): a scope registered now would
        never be cancelled, and the body would run without the lock. The caller then
        awaits :meth:`refuse`.
        """
        registry = engine.registry
        for hold in holds:
            if not registry.alive(hold):
                return False
        scope = anyio.CancelScope()
        scope.__enter__()
        task = asyncio.current_task()
        assert task is not None  # the acquire that made the holds checked
        body = Body(scope, task)
        for hold in holds:
            hold.scopes.append(body)
        self._entered.setdefault(task, []).append((holds, body))
        return True

    async def refuse(self, engine: Engine, *holds: Hold) -> NoReturn:
        """Give back *holds*, one of which is lost, and raise :class:`LockLostError`.

        What ``async with`` would have done at exit, before the body ran: the holds still
        held are released (a re-entered one back to its outer count), the lost ones are
        freed in Redis in the background in case Redis still has them.
        """
        lost = [hold for hold in holds if not engine.registry.alive(hold)]
        for hold in lost:
            forget_lost(engine, hold)
        await _release_all(engine, [h for h in holds if h not in lost], quiet=True)
        first = lost[0]
        raise LockLostError(
            f"lock {first.keys.name!r} was lost before the 'async with' body began "
            f"({first.lost_reason}); the body did not run, and nothing is held for it"
        )

    async def exit(
        self,
        handle: object,
        engine: Engine | None,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leave the innermost block of the current task; *engine* is None once closed."""
        task = asyncio.current_task()
        stack = self._entered.get(task) if task is not None else None
        if not stack:
            raise RuntimeError(f"{handle!r} exited in a task that did not enter it")
        holds, body = stack.pop()
        if not stack:
            del self._entered[task]  # type: ignore[arg-type]
        for hold in holds:
            if body in hold.scopes:
                hold.scopes.remove(body)
        swallowed = bool(body.scope.__exit__(exc_type, exc, tb))
        # After the scope's exit, which takes back anyio's own cancellations first.
        swallowed = body.settle(exc) or swallowed
        cancelled_from_outside = (
            exc_type is not None and not swallowed and issubclass(exc_type, asyncio.CancelledError)
        )
        lost = [hold for hold in holds if hold.lost]
        if lost and not cancelled_from_outside:
            if engine is not None:
                for hold in lost:
                    engine.registry.pop_lost(hold.resource, hold.owner)
                    engine.release_lost(hold)  # Redis may still have it if renewal was cut off
                await _release_all(engine, [h for h in holds if not h.lost], quiet=True)
            first = lost[0]
            raise LockLostError(
                f"lock {first.keys.name!r} was lost inside 'async with' ({first.lost_reason}); "
                "the body was cancelled because another owner may have entered"
            ) from (None if swallowed else exc)
        if engine is None:
            return  # the manager closed meanwhile and released them
        # Cancelled from outside with a hold lost: that cancellation goes on, and the
        # holds still held are released. A hold the body released itself (a semaphore
        # Permit's release()) is no longer registered: releasing it again would find it
        # gone in Redis and report it lost.
        live = [h for h in holds if not h.lost and engine.registry.holds(h)]
        await _release_all(engine, live, quiet=bool(lost))


def forget_lost(engine: Engine, hold: Hold) -> None:
    """*hold* was lost before its acquire returned: the caller is told so by the error
    it gets, and Redis may still have the hold (a lease ended on the client's clock).

    A re-entered hold (count above one) stays remembered as lost, so the task's outer
    release() or ``async with`` reports the loss too; Redis frees it either way.
    """
    if hold.count <= 1:
        engine.registry.pop_lost(hold.resource, hold.owner)
    engine.release_lost(hold)


async def _release_all(engine: Engine, holds: list[Hold], *, quiet: bool) -> None:
    """Release *holds* in reverse order of acquisition; every one is tried.

    A release that cannot reach Redis is logged, not raised: the body's work is done and
    the release is retried in the background, bounded by the lease (raising here would
    turn finished work into an error, a 503 in a web handler). An explicit release()
    still raises. The first other error is raised once all were tried, unless *quiet*.
    """
    error: LockError | None = None
    cancelled: asyncio.CancelledError | None = None
    for hold in reversed(holds):
        try:
            await engine.release(hold)
        except asyncio.CancelledError as exc_cancel:
            # The engine completed this release despite the cancellation (or handed it to
            # the retrier); the others must be released too: an anyio scope re-delivers
            # its cancellation at every await, so it would otherwise skip all but one.
            cancelled = exc_cancel
        except LockConnectionError as exc_release:
            logger.warning(
                "lock %r: the release after 'async with' could not reach Redis (%s); it "
                "is retried in the background and the lease bounds it meanwhile",
                hold.keys.name,
                exc_release,
            )
        except LockError as exc:
            if error is None:
                error = exc
    if cancelled is not None:
        raise cancelled
    if error is not None and not quiet:
        raise error
