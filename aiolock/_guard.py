"""The ``async with`` guard shared by every kind's handle.

Entering registers a cancel scope with the hold, so that a loss (noticed by the
watchdog, a lease timer or another call) cancels the body; exiting turns that
cancellation into :class:`~aiolock.LockLostError`, or releases the hold. One handle may
be entered by many tasks, and nested in one task: the guard keeps a stack per task.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ._errors import LockConnectionError, LockLostError

if TYPE_CHECKING:
    from ._engine import Engine
    from ._kind import Hold

__all__ = ["BodyGuard", "ManagerLike"]

logger = logging.getLogger("aiolock")


class ManagerLike(Protocol):
    """What a kind's handle needs from the manager that made it (no import of the manager,
    which imports the handles)."""

    _engine: Engine | None

    @property
    def is_open(self) -> bool: ...

    def _open_engine(self) -> Engine: ...

    def _owner(self) -> str: ...


class BodyGuard:
    __slots__ = ("_entered",)

    def __init__(self) -> None:
        # Per task, the holds and cancel scopes of the ``async with`` blocks it is in.
        self._entered: dict[asyncio.Task[Any], list[tuple[Hold, anyio.CancelScope]]] = {}

    def enter(self, hold: Hold) -> None:
        scope = anyio.CancelScope()
        scope.__enter__()
        hold.scopes.append(scope)
        task = asyncio.current_task()
        assert task is not None  # the acquire that made *hold* checked
        self._entered.setdefault(task, []).append((hold, scope))

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
        hold, scope = stack.pop()
        if not stack:
            del self._entered[task]  # type: ignore[arg-type]
        if scope in hold.scopes:
            hold.scopes.remove(scope)
        swallowed = bool(scope.__exit__(exc_type, exc, tb))
        cancelled_from_outside = (
            exc_type is not None and not swallowed and issubclass(exc_type, asyncio.CancelledError)
        )
        if hold.lost and not cancelled_from_outside:
            if engine is not None:
                engine.registry.pop_lost(hold.resource, hold.owner)
                engine.release_lost(hold)  # Redis may still have it if renewal was cut off
            raise LockLostError(
                f"lock {hold.keys.name!r} was lost inside 'async with' ({hold.lost_reason}); "
                "the body was cancelled because another owner may have entered"
            ) from (None if swallowed else exc)
        if hold.lost:
            return  # cancelled from outside: that cancellation goes on
        if engine is None:
            return  # the manager closed meanwhile and released it
        try:
            await engine.release(hold)
        except LockConnectionError as exc_release:
            # The body's work is done and the release is retried in the background,
            # bounded by the lease: raising here would turn finished work into an error
            # (a 503 in a web handler). An explicit release() still raises.
            logger.warning(
                "lock %r: the release after 'async with' could not reach Redis (%s); it "
                "is retried in the background and the lease bounds it meanwhile",
                hold.keys.name,
                exc_release,
            )
