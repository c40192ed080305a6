"""MultiLock: several locks taken as one, all of them or none.

A multi-lock is not a kind of its own: it takes the reentrant locks of its names one
after another through the engine, each with its own script call, so the names may live
in different Redis Cluster slots (no script spans them). What makes it one lock:

* Deadlock-free order. Every multi-lock takes its names in one global order (sorted by
  their Redis keys), so two multi-locks that share names never wait for each other in a
  cycle, whatever order the caller listed them in.
* All or none. If any name cannot be had within the (shared) timeout, or the acquire is
  cancelled or fails, the names already taken are released before the error propagates:
  the caller never holds a subset after ``acquire`` returns or raises.
* Together. ``release`` releases every name (in reverse order); ``async with`` cancels
  the body if any of the holds is lost, and raises :class:`LockLostError`.

Each name is an ordinary lock: a plain ``locks.lock(name)`` elsewhere excludes and is
excluded by the multi-lock, and a task that already holds one of the names re-enters it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from aiolock._engine.guard import forget_lost
from aiolock._engine.handle import _DEFAULT, Handle, lost_error, not_owned_error, resolve
from aiolock._errors import (
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    WireFormatError,
)
from aiolock._keys import LockKeys, check_name

if TYPE_CHECKING:
    from aiolock._engine.engine import Engine
    from aiolock._engine.guard import ManagerLike
    from aiolock._engine.kind import Hold, LockKind

__all__ = ["MultiLock"]

logger = logging.getLogger("aiolock")

#: Seconds a release of the names already taken may take when an acquire fails or is
#: cancelled; past it the engine retries the release in the background (bounded by the
#: lease), so the caller is never held up for long.
UNWIND_TIMEOUT = 5.0


def check_names(names: object) -> list[str]:
    """The names of a multi-lock: a non-empty collection of distinct valid names."""
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise TypeError(
            "names must be a list (or another iterable) of lock names, not "
            f"{type(names).__name__}; for one name use locks.lock(name)"
        )
    checked = [check_name(name) for name in names]
    if not checked:
        raise ValueError("names must not be empty: a multi-lock needs at least one name")
    twice = sorted(name for name, n in Counter(checked).items() if n > 1)
    if twice:
        raise ValueError(
            f"names must be distinct, but {', '.join(map(repr, twice))} appear more than "
            "once; list each name once"
        )
    return checked


class MultiLock(Handle[list[LockKeys], "MultiLock"]):
    """Several locks acquired and released as one, owned by the task that acquires them.

    Made by :meth:`aiolock.LockManager.multi_lock`. Use it as ``async with ml:`` or call
    :meth:`acquire` / :meth:`try_acquire` and :meth:`release`. Reentrant per task, like
    :class:`~aiolock.Lock`.
    """

    __slots__ = ()

    def __init__(
        self,
        manager: ManagerLike,
        kind: LockKind,
        keys: list[LockKeys],
        *,
        timeout: float | None,
        lease: float | None,
    ) -> None:
        # The global order that keeps multi-locks from deadlocking each other.
        ordered = sorted(keys, key=lambda k: k.lock)
        super().__init__(manager, kind, ordered, timeout=timeout, lease=lease)

    @property
    def names(self) -> list[str]:
        """The names, in the order they are acquired."""
        return [keys.name for keys in self._keys]

    @property
    def fencing_tokens(self) -> dict[str, int]:
        """``{name: fencing token}`` of the current task's holds ({} if it holds none)."""
        if self._kind.fencing_unavailable:
            raise WireFormatError(self._kind.fencing_unavailable)
        holds = self._current_holds()
        if holds is None:
            return {}
        return {hold.keys.name: hold.token for hold in holds}

    def __repr__(self) -> str:
        return f"<MultiLock {self.names!r} timeout={self._timeout} lease={self._lease}>"

    # -- acquire and release -------------------------------------------------------------

    async def acquire(
        self, timeout: float | None = _DEFAULT, lease: float | None = _DEFAULT
    ) -> None:
        """Acquire every name for the current task within *timeout* seconds in all.

        Raises :class:`LockTimeoutError` (holding none of the names) if one of them is
        not released in time. *timeout* and *lease* default to the values given to
        :meth:`aiolock.LockManager.multi_lock`.
        """
        await self._acquire(timeout, lease)

    async def try_acquire(self, timeout: float | None = 0, lease: float | None = _DEFAULT) -> bool:
        """Like :meth:`acquire`, but return False (holding nothing) instead of raising."""
        try:
            await self._acquire(timeout, lease)
        except LockTimeoutError:
            return False
        return True

    async def _acquire(self, timeout: float | None, lease: float | None) -> list[Hold]:
        wait, fixed = resolve(timeout, lease, self._timeout, self._lease)
        engine = self._manager._open_engine()
        deadline = None if wait is None else time.monotonic() + wait
        holds: list[Hold] = []
        try:
            for keys in self._keys:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                if wait == 0:
                    remaining = 0  # one attempt per name
                holds.append(await self._take(keys, remaining, fixed, engine=engine))
        except LockTimeoutError as exc:
            await _unwind(engine, holds)
            raise LockTimeoutError(
                f"multi-lock {self.names!r}: {exc}; none of its names is held"
            ) from None
        except BaseException:
            await _unwind(engine, holds)
            raise
        # A name taken early may have been lost while a later one was waited for (a
        # fixed lease shorter than the wait, an outage, a force-release): never return
        # it. Not retried: a lease that ended during this wait would end again during
        # the next, and a lost re-entered hold is the task's own outer hold, gone for good.
        lost = [hold for hold in holds if not engine.registry.alive(hold)]
        if lost:
            await _unwind(engine, holds)
            reasons = "; ".join(f"{hold.keys.name!r}: {hold.lost_reason}" for hold in lost)
            raise LockLostError(
                f"multi-lock {self.names!r}: {reasons}, before all of its names were held; "
                "the acquire holds none of them now. If a fixed lease ended while the "
                "acquire waited for the other names, give a longer lease= or none (renewed)"
            )
        return holds

    async def release(self) -> None:
        """Release every name once (in reverse order); all are tried even if one fails.

        Raises :class:`LockNotOwnedError` if the task holds none of them, and
        :class:`LockLostError` if one was lost (the others are released regardless).
        """
        engine = self._manager._open_engine()
        owner = self._manager._owner()
        holds = [engine.registry.get(self._kind.resource(k), owner) for k in self._keys]
        if all(hold is None for hold in holds):
            lost = [engine.registry.pop_lost(self._kind.resource(k), owner) for k in self._keys]
            reasons = [f"{h.keys.name!r}: {h.lost_reason}" for h in lost if h is not None]
            if reasons:
                raise lost_error(f"multi-lock {self.names!r}", "; ".join(reasons))
            raise not_owned_error(f"multi-lock {self.names!r}")
        error: LockError | None = None
        cancelled: asyncio.CancelledError | None = None
        for keys, hold in reversed(list(zip(self._keys, holds, strict=True))):
            try:
                if hold is None:
                    gone = engine.registry.pop_lost(self._kind.resource(keys), owner)
                    if gone is not None:
                        raise LockLostError(
                            f"lock {keys.name!r} of multi-lock {self.names!r} was lost "
                            f"while this task held it ({gone.lost_reason}); another owner "
                            "may have entered the critical section"
                        )
                    raise LockNotOwnedError(
                        f"lock {keys.name!r} of multi-lock {self.names!r} is not held by "
                        "the current task (it was released on its own)"
                    )
                await engine.release(hold)
            except asyncio.CancelledError as exc_cancel:
                # That release was completed despite the cancellation; go on with the
                # others (an anyio scope cancels every await) and re-raise it after.
                cancelled = exc_cancel
            except LockError as exc:
                if error is None:
                    error = exc
        if cancelled is not None:
            raise cancelled
        if error is not None:
            raise error

    async def locked(self) -> dict[str, bool]:
        """``{name: whether anyone holds it}``, per Redis."""
        self._manager._open_engine()
        return {keys.name: await self._kind.locked(keys) for keys in self._keys}

    # -- async with (Handle's __aenter__ and __aexit__) ----------------------------------

    def _acquire_block(self) -> Coroutine[Any, Any, list[Hold]]:
        return self._acquire(_DEFAULT, _DEFAULT)

    def _entered(self, holds: Sequence[Hold]) -> MultiLock:
        return self

    def _current_holds(self) -> list[Hold] | None:
        engine = self._manager._engine
        if engine is None or asyncio.current_task() is None:
            return None
        owner = self._manager._owner()
        holds = [engine.registry.get(self._kind.resource(k), owner) for k in self._keys]
        if any(hold is None for hold in holds):
            return None
        return [hold for hold in holds if hold is not None]


async def _unwind(engine: Engine, holds: list[Hold]) -> None:
    """Release what a failed or cancelled multi-acquire took, shielded and bounded.

    A hold lost meanwhile is not released as if held (Redis may have granted its name
    to another owner since): it is freed in the background in case Redis still has it.
    """
    lost = [hold for hold in holds if not engine.registry.alive(hold)]
    for hold in lost:
        forget_lost(engine, hold)
    holds = [hold for hold in holds if hold not in lost]
    if not holds:
        return
    cancelled: asyncio.CancelledError | None = None
    with anyio.CancelScope(shield=True):
        for hold in reversed(holds):
            # Past the bound, the engine's own cancellation handling parks the release
            # and retries it in the background.
            with anyio.move_on_after(UNWIND_TIMEOUT) as bound:
                try:
                    await engine.release(hold)
                except asyncio.CancelledError as exc_cancel:
                    if bound.cancel_called:
                        raise  # the bound ran out: its scope absorbs it
                    # A native task.cancel() passes the anyio shield; the engine still
                    # completed this release. Release the rest, then let it propagate.
                    cancelled = exc_cancel
                except LockError as exc:
                    logger.warning(
                        "multi-lock: releasing %r after a failed acquire: %s", hold.keys.name, exc
                    )
    if cancelled is not None:
        raise cancelled
