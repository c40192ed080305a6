"""The handle base: what every engine-backed handle (Lock, Semaphore, MultiLock) shares.

(Lock, :mod:`aiolock._engine.lockhandle`, is on this base, and the other lock-like kinds'
handles, FairLock and the read-write lock's sides, derive from Lock.)

A handle has no state of its own beyond its name(s) and defaults: which task holds what,
how often, and with which fencing token is kept by the manager's engine, per task. One
handle may be shared by many tasks; each task is a separate owner. The base holds the
plumbing between the user's call and the engine: the defaults and their argument checks
(:func:`resolve`), the acquisition under the handle's ``replicas=`` policy
(:meth:`Handle._take`), the ``async with`` block and its body guard, and the errors of a
hold that is lost or not held. A kind's handle adds its own API on top.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aiolock._engine.guard import BodyGuard, ManagerLike
from aiolock._errors import LockLostError, LockNotOwnedError
from aiolock._keys import check_lease, check_timeout
from aiolock._redis.replicas import INHERIT, HandlePolicy, under_policy

if TYPE_CHECKING:
    from aiolock._engine.engine import Engine
    from aiolock._engine.kind import Hold, LockKind
    from aiolock._keys import LockKeys

__all__ = ["_DEFAULT", "Handle", "extend_seconds", "lost_error", "not_owned_error", "resolve"]


class _Default:
    """The marker of an argument left out: the handle's default applies."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<default>"


#: Typed as Any so that public signatures read ``timeout: float | None = <default>``.
_DEFAULT: Any = _Default()


def resolve(
    timeout: float | None,
    lease: float | None,
    default_timeout: float | None,
    default_lease: float | None,
) -> tuple[float | None, float | None]:
    """The wait and fixed lease of one acquire: the handle's defaults, or the given ones
    (checked here, at the call that received them)."""
    wait = default_timeout if timeout is _DEFAULT else check_timeout(timeout)
    if lease is _DEFAULT:
        return wait, default_lease
    return wait, None if lease is None else check_lease(lease)


def extend_seconds(lease: float | None, additional: float | None) -> float:
    """The checked seconds of an ``extend(lease)`` or ``extend(additional=...)`` call
    (locks and permits alike): exactly one of the two, a valid number of seconds."""
    if (lease is None) == (additional is None):
        raise TypeError(
            "extend() takes either lease (the time left to set) or additional= (the "
            f"time to add to what is left), exactly one; got lease={lease!r}, "
            f"additional={additional!r}"
        )
    if additional is None:
        assert lease is not None
        return check_lease(lease, "lease")
    return check_lease(additional, "additional")


def lost_error(what: str, reasons: str, tail: str = "") -> LockLostError:
    """*what* (``lock 'x'``) was lost while the current task held it."""
    return LockLostError(
        f"{what} was lost while this task held it ({reasons}); another owner may have entered{tail}"
    )


def not_owned_error(what: str) -> LockNotOwnedError:
    """*what* (``lock 'x'``) is not held by the current task."""
    return LockNotOwnedError(
        f"{what} is not held by the current task; locks belong to the task that acquired "
        "them (a child task is a different owner)"
    )


#: What the handle is made on: one name's keys, or a list of them (a multi-lock).
K = TypeVar("K")
#: What ``async with handle as x`` gives: the handle itself, or a semaphore's Permit.
E = TypeVar("E")


class Handle(Generic[K, E]):
    """The base of the handles over the manager's engine.

    A subclass gives :meth:`_acquire_block` (the acquisition of ``async with``, with the
    handle's defaults) and :meth:`_entered` (what the block's ``as`` receives).
    """

    __slots__ = (
        "_body_guard",
        "_keys",
        "_kind",
        "_lease",
        "_manager",
        "_max_hold",
        "_replicas",
        "_timeout",
    )

    def __init__(
        self,
        manager: ManagerLike,
        kind: LockKind,
        keys: K,
        *,
        timeout: float | None,
        lease: float | None,
    ) -> None:
        # (Lock.__init__, in lockhandle.py, sets these fields itself: keep the two in step)
        self._manager = manager
        self._kind = kind
        self._keys = keys
        self._timeout = timeout
        self._lease = lease
        self._body_guard: BodyGuard | None = None
        #: the factory's replicas= (see aiolock._redis.replicas), set by the manager
        self._replicas: HandlePolicy = INHERIT
        #: the factory's max_hold= (None: no bound), set by the manager; _DEFAULT: the
        #: manager's
        self._max_hold: float | None = _DEFAULT

    @property
    def _guard(self) -> BodyGuard:
        """The handle's body guard, made when a block first enters: a handle whose task
        still waits carries none, two objects fewer per waiter for the cyclic GC to walk."""
        guard = self._body_guard
        if guard is None:
            guard = self._body_guard = BodyGuard()
        return guard

    def _take(
        self,
        keys: LockKeys,
        wait: float | None,
        fixed: float | None,
        permits: int = 1,
        engine: Engine | None = None,
    ) -> Coroutine[Any, Any, Hold]:
        """The engine's acquisition of *keys* for the current task, under the handle's
        replicas= policy (awaitable; no coroutine layer of its own in the common case).
        *engine*: the one a multi-lock's acquire opened for all its names."""
        if engine is None:
            engine = self._manager._open_engine()
        acquire = engine.acquire(self._kind, keys, self._manager._owner(), wait, fixed, permits)
        max_hold = engine.rt.max_hold if self._max_hold is _DEFAULT else self._max_hold
        if self._replicas is INHERIT and max_hold is None:
            return acquire  # the common case: no coroutine layer for a policy or a bound
        if self._replicas is not INHERIT:
            acquire = under_policy(self._replicas, acquire)
        return acquire if max_hold is None else _bounded(engine, acquire, max_hold)

    # -- async with ----------------------------------------------------------------------

    def _acquire_block(self) -> Coroutine[Any, Any, Hold | list[Hold]]:
        """The acquisition that ``async with`` makes (the handle's defaults)."""
        raise NotImplementedError

    def _entered(self, holds: Sequence[Hold]) -> E:
        """What ``async with handle as x`` binds to x, once *holds* are guarded."""
        raise NotImplementedError

    # __aenter__ and __aexit__ call the guard directly: it finds the block's owner from
    # its caller's caller, the 'async with' or what wraps the handle (aiolock._engine.guard).
    async def __aenter__(self) -> E:
        got = await self._acquire_block()
        holds = got if isinstance(got, list) else (got,)
        engine = self._manager._open_engine()
        if not self._guard.enter(engine, *holds):
            await self._guard.refuse(engine, *holds)
        return self._entered(holds)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        engine = self._manager._engine if self._manager.is_open else None
        await self._guard.exit(self, engine, exc_type, exc, tb)


async def _bounded(engine: Engine, acquire: Coroutine[Any, Any, Hold], max_hold: float) -> Hold:
    """*acquire*, then the hold's max_hold timer (see :meth:`Engine.bound`)."""
    return engine.bound(await acquire, max_hold)
