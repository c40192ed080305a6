"""The lifecycle shared by LockManager and RedlockManager: open once, supervise, close once.

A manager is ``new`` until it opens, ``open`` until closing starts, then ``closing`` and
``closed``; ``failed`` if its background tasks crashed while it was open (:class:`Life`).
Opening starts one supervisor task that owns a task group with the manager's background
tasks; closing drains what the manager holds (bounded in time, shielded from
cancellation), stops the supervisor and closes the connections.

:class:`ManagerLifecycle` is a base class, not a composed object: the handles, the
recipes and the tests read the lifecycle through the manager itself (``manager.is_open``,
``manager._state``), and the steps that differ between the managers (what opening checks,
which tasks run, what closing drains, what a crash stops) are the manager's own methods
over its own state. A base class with those steps as hooks keeps one ``self``, with no
forwarding properties and no back-reference from a lifecycle object to its manager.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from types import TracebackType
from typing import ClassVar, TypeVar

import anyio
from anyio.abc import TaskGroup

from aiolock._engine.cleanup import finish_despite_cancel
from aiolock._errors import ManagerNotOpenError

__all__ = ["Life", "ManagerLifecycle"]

logger = logging.getLogger("aiolock")

_M = TypeVar("_M", bound="ManagerLifecycle")


class Life(str, enum.Enum):
    """Where a manager is in its life. A ``str`` enum whose text is its value, so that
    messages read "this LockManager is closed"; it moves only forward:

    ``NEW`` -> ``OPEN`` (opened) -> ``CLOSING`` -> ``CLOSED``, with ``OPEN`` ->
    ``FAILED`` (its background tasks crashed) -> ``CLOSING`` on the way.
    """

    NEW = "new"
    OPEN = "open"
    FAILED = "failed"
    CLOSING = "closing"
    CLOSED = "closed"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class ManagerLifecycle:
    """Opening, supervising and closing a manager; the manager supplies the steps.

    Subclasses set the class attributes (the words of the errors and of the log) and
    implement :meth:`_start_tasks`, :meth:`_drain` and :meth:`_failed`; the other hooks
    do nothing unless overridden. A manager redefines a public method here (``open``,
    ``aclose``) where it documents it in its own words, or adds to it (LockManager's
    ``aclose`` re-raises a crash of the background tasks; RedlockManager's does not).
    """

    #: the manager's class name in messages ("LockManager")
    _WHAT: ClassVar[str]
    #: how to open it, in the error of a manager used before it was opened
    _HOW_TO_OPEN: ClassVar[str]
    #: the end of the error of a second open, and of the error of a closed manager
    _OPENS_ONCE_HINT: ClassVar[str] = ""
    _GONE_HINT: ClassVar[str]
    #: the log line of a crash of the background tasks
    _FAILED_LOG: ClassVar[str]
    #: the name of the supervisor task
    _TASK_NAME: ClassVar[str]

    def __init__(self) -> None:
        self._state = Life.NEW
        self._stop = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        """True from the end of opening until closing starts."""
        return self._state is Life.OPEN

    async def open(self: _M) -> _M:
        """Open the manager without ``async with``; pair it with :meth:`aclose`."""
        return await self.__aenter__()

    async def __aenter__(self: _M) -> _M:
        if self._state is not Life.NEW:
            raise ManagerNotOpenError(
                f"this {self._WHAT} is {self._state}; a manager can be opened once"
                f"{self._OPENS_ONCE_HINT}"
            )
        await self._before_open()
        if self._state is not Life.NEW:  # opened by another task meanwhile
            raise ManagerNotOpenError(f"this {self._WHAT} is {self._state}; it opens once")
        self._opening()
        # The background tasks run in a task group owned by a supervisor task, not by
        # the task that opens the manager: opening and closing may then happen in
        # different tasks (pytest fixtures, lifespan hooks), and a crash of a background
        # task is logged and fails the manager instead of cancelling an unrelated caller.
        self._stop = asyncio.Event()
        self._supervisor = asyncio.create_task(self._supervise(), name=self._TASK_NAME)
        self._supervisor.add_done_callback(self._supervisor_done)
        self._state = Life.OPEN
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the manager (idempotent)."""
        await self._close()

    async def _close(self) -> BaseException | None:
        """Close once (later calls return at once); the error of the background tasks if
        they had failed, for the manager to report or not."""
        supervisor = self._supervisor
        if self._state not in (Life.OPEN, Life.FAILED) or supervisor is None:
            return None
        failed = self._state is Life.FAILED
        self._state = Life.CLOSING
        try:
            # In a task of its own, which a cancelled caller waits for: an anyio shield
            # alone lets a plain task.cancel() (asyncio.wait_for's timeout) cut the drain
            # short, and the background tasks then ran on in a "closed" manager.
            await finish_despite_cancel(lambda: self._shut_down(supervisor))
        finally:
            self._state = Life.CLOSED
            await self._after_close()
        if failed and not supervisor.cancelled():
            return supervisor.exception()
        return None

    async def _shut_down(self, supervisor: asyncio.Task[None]) -> None:
        """Drain, then stop the background tasks and close the connections, even if the
        drain failed."""
        try:
            await self._drain()
        finally:
            self._stop.set()
            await asyncio.wait((supervisor,))
            await self._after_stop()

    async def _supervise(self) -> None:
        async with anyio.create_task_group() as tg:
            self._start_tasks(tg)
            await self._stop.wait()
            tg.cancel_scope.cancel()

    def _supervisor_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None or self._state is not Life.OPEN:
            return
        logger.error(self._FAILED_LOG, exc_info=task.exception())
        self._state = Life.FAILED
        self._failed()

    def _check_open(self) -> None:
        """Raise :class:`ManagerNotOpenError` unless the manager is open, saying why."""
        if self._state is Life.OPEN:
            return
        if self._state is Life.NEW:
            raise ManagerNotOpenError(
                f"the {self._WHAT} is not open: {self._HOW_TO_OPEN} before acquiring locks"
            )
        raise ManagerNotOpenError(f"the {self._WHAT} is {self._state}{self._GONE_HINT}")

    # -- the manager's steps -------------------------------------------------------------

    async def _before_open(self) -> None:
        """Checks before anything starts; an error leaves the manager new (not open)."""

    def _opening(self) -> None:
        """Make what the background tasks and the handles share (once, when opening)."""

    def _start_tasks(self, tg: TaskGroup) -> None:
        """Start the background tasks in the supervisor's task group."""
        raise NotImplementedError

    def _failed(self) -> None:
        """The background tasks crashed: fail the waiters (and the holds) at once."""
        raise NotImplementedError

    async def _drain(self) -> None:
        """Closing, before the tasks stop: fail the waiters, release the holds (bounded in
        time; shielded from cancellation)."""
        raise NotImplementedError

    async def _after_stop(self) -> None:
        """Closing, after the tasks stopped: close the connections the manager made."""

    async def _after_close(self) -> None:
        """Closing, last, even if a step above failed."""
