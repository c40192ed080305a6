"""Lock: the handle a user holds; validates arguments and delegates to the lock core.

A handle has no state of its own beyond its name and defaults: which task holds the
lock, how often, and with which fencing token is kept by the manager, per task. One
handle may be shared by many tasks; each task is a separate owner.
"""

from __future__ import annotations

import asyncio
import enum
import math
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from ._client import as_int
from ._errors import LockError, LockLostError, LockNotOwnedError
from ._keys import LockKeys, check_lease, check_timeout

if TYPE_CHECKING:
    from ._hold import Hold
    from ._manager import LockManager

__all__ = ["Lock"]


class _Unset(enum.Enum):
    UNSET = enum.auto()


_UNSET = _Unset.UNSET


class Lock:
    """A reentrant distributed lock, owned by the asyncio task that acquires it.

    Made by :meth:`LockManager.lock`. Use it as ``async with lock:`` (the body is
    cancelled and :class:`LockLostError` raised if the hold is lost), or call
    :meth:`acquire` / :meth:`try_acquire` and :meth:`release` yourself.
    """

    __slots__ = ("_entered", "_keys", "_lease", "_manager", "_timeout")

    def __init__(
        self,
        manager: LockManager,
        keys: LockKeys,
        *,
        timeout: float | None,
        lease: float | None,
    ) -> None:
        self._manager = manager
        self._keys = keys
        self._timeout = timeout
        self._lease = lease
        # Per task, the holds and cancel scopes of the ``async with`` blocks it is in.
        self._entered: dict[asyncio.Task[Any], list[tuple[Hold, anyio.CancelScope]]] = {}

    @property
    def name(self) -> str:
        return self._keys.name

    @property
    def key(self) -> str:
        """The Redis key of the lock's hash."""
        return self._keys.lock

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current task's hold, or None if it holds none.

        Every new acquisition of a name gets a larger token than the one before it;
        pass it to the resource the lock protects so it can refuse stale writers.
        """
        hold = self._current_hold()
        return None if hold is None else hold.token

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} timeout={self._timeout} lease={self._lease}>"

    # -- acquire and release -------------------------------------------------------------

    async def acquire(
        self,
        timeout: float | _Unset | None = _UNSET,
        lease: float | _Unset | None = _UNSET,
    ) -> None:
        """Acquire the lock for the current task, waiting up to *timeout* seconds.

        Re-entrant: a task that holds the lock acquires it again at once and must
        release it as many times. Raises :class:`LockTimeoutError` when the wait runs
        out. *timeout* and *lease* default to the values given to
        :meth:`LockManager.lock`.
        """
        await self._acquire(timeout, lease)

    async def try_acquire(
        self, timeout: float | None = 0, lease: float | _Unset | None = _UNSET
    ) -> bool:
        """Like :meth:`acquire`, but return False instead of raising on timeout.

        The default ``timeout=0`` makes exactly one attempt.
        """
        try:
            await self._acquire(timeout, lease)
        except TimeoutError:
            return False
        return True

    async def _acquire(self, timeout: float | _Unset | None, lease: float | _Unset | None) -> Hold:
        wait = self._timeout if timeout is _UNSET else check_timeout(timeout)
        fixed = self._lease if lease is _UNSET else (None if lease is None else check_lease(lease))
        core = self._manager._open_core()
        return await core.acquire(self._keys, self._manager._owner(), wait, fixed)

    async def release(self) -> None:
        """Release one hold of the current task (the lock is free when the count hits 0).

        Raises :class:`LockNotOwnedError` if the task does not hold the lock, and
        :class:`LockLostError` (a subclass) if it held it but the hold was lost. A release
        interrupted by a cancellation still completes (shielded, bounded in time).
        """
        core = self._manager._open_core()
        owner = self._manager._owner()
        parked = core.registry.parked(self._keys.lock, owner)
        if parked is not None and core.registry.get(self._keys.lock, owner) is None:
            await core.release(parked)  # an unconfirmed release, sent again (idempotent)
            return
        await core.release(self._owned_hold())

    async def extend(self, lease: float) -> None:
        """Set the remaining lease of the current task's fixed-lease hold to *lease* s."""
        seconds = check_lease(lease)
        core = self._manager._open_core()
        hold = self._owned_hold()
        if hold.renew:
            raise LockError(
                f"lock {self.name!r} is renewed automatically, so there is nothing to extend; "
                "extend() is for holds acquired with an explicit lease="
            )
        await core.extend(hold, seconds)

    async def force_release(self) -> bool:
        """Delete the lock whoever holds it and wake a waiter; True if it was held.

        An administrator's tool: the holder is not asked, and learns of it as a lost lease.
        """
        return await self._manager._open_core().force_release(self._keys)

    # -- queries -------------------------------------------------------------------------

    async def locked(self) -> bool:
        """Whether anyone holds the lock."""
        client = self._manager._open_core().client
        return as_int(await client.call("EXISTS", self._keys.lock, key=self._keys.lock)) == 1

    async def owned(self) -> bool:
        """Whether the current task holds the lock (asks Redis)."""
        return await self.hold_count() > 0

    async def hold_count(self) -> int:
        """How many times the current task holds the lock, per Redis (0 if not)."""
        core = self._manager._open_core()
        hold = core.registry.get(self._keys.lock, self._manager._owner())
        if hold is None:
            # Still ask Redis, so that a key of another type is reported as such.
            await core.client.call("HEXISTS", self._keys.lock, "-", key=self._keys.lock)
            return 0
        count = await core.client.call("HGET", self._keys.lock, hold.field, key=self._keys.lock)
        return 0 if count is None else as_int(count)

    async def ttl(self) -> float | None:
        """Seconds left on the lock's lease; None if nobody holds it, inf if it never expires."""
        client = self._manager._open_core().client
        ms = as_int(await client.call("PTTL", self._keys.lock, key=self._keys.lock))
        if ms == -2:
            return None
        return math.inf if ms < 0 else ms / 1000

    # -- async with ----------------------------------------------------------------------

    async def __aenter__(self) -> Lock:
        hold = await self._acquire(_UNSET, _UNSET)
        scope = anyio.CancelScope()
        scope.__enter__()
        hold.scopes.append(scope)
        task = asyncio.current_task()
        assert task is not None  # _acquire checked
        self._entered.setdefault(task, []).append((hold, scope))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        stack = self._entered.get(task) if task is not None else None
        if not stack:
            raise RuntimeError(f"{self!r} exited in a task that did not enter it")
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
            core = self._manager._core
            if core is not None:
                core.registry.pop_lost(hold.keys.lock, hold.owner)
                if self._manager.is_open:
                    core.release_lost(hold)  # Redis may still have it if renewal was cut off
            raise LockLostError(
                f"lock {self.name!r} was lost inside 'async with' ({hold.lost_reason}); the "
                "body was cancelled because another owner may have entered"
            ) from (None if swallowed else exc)
        if hold.lost:
            return  # cancelled from outside: that cancellation goes on
        core = self._manager._open_core()
        await core.release(hold)

    # -- helpers -------------------------------------------------------------------------

    def _current_hold(self) -> Hold | None:
        core = self._manager._core
        if core is None or asyncio.current_task() is None:
            return None
        return core.registry.get(self._keys.lock, self._manager._owner())

    def _owned_hold(self) -> Hold:
        core = self._manager._open_core()
        owner = self._manager._owner()
        hold = core.registry.get(self._keys.lock, owner)
        if hold is not None:
            return hold
        lost = core.registry.pop_lost(self._keys.lock, owner)
        if lost is not None:
            raise LockLostError(
                f"lock {self.name!r} was lost while this task held it ({lost.lost_reason}); "
                "another owner may have entered the critical section"
            )
        raise LockNotOwnedError(
            f"lock {self.name!r} is not held by the current task; locks belong to the task "
            "that acquired them (a child task is a different owner)"
        )
