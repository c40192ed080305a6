"""Lock: the handle a user holds; validates arguments and delegates to the engine.

The plain lock's handle, and the base of the other lock-like kinds' handles: FairLock
(``aiolock/_kinds/fair/handle.py``) and the read-write lock's sides
(``aiolock/_kinds/rw/handle.py``) derive from it in their kinds' folders and add their repr
and what only they do. It is the engine's because kinds never import each other; so
it reaches what only some kinds do through the kind (:mod:`aiolock._engine.kind`): the
hand-off (:meth:`Lock.detach`, :meth:`Lock.adopt`: a kind that is ``detachable``, whose
scripts :mod:`aiolock._engine.handoff` drives) and the lease left of its structure
(``lease_left``). The plumbing it shares with the other handles (defaults, the
acquisition under the ``replicas=`` policy, ``async with`` and its body guard) is
:mod:`aiolock._engine.handle`'s.

acquire(), try_acquire() and release() are every acquisition's path (the functions an
uncontended cycle enters are counted: ``CYCLE_CALLS`` in
``tests/behaviour/test_fast_path.py``): a subclass inherits them as they are and never
wraps them in a ``super()`` call; what it checks more goes in :meth:`Lock._acquire`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aiolock._engine.handle import (
    _DEFAULT,
    Handle,
    extend_seconds,
    lost_error,
    not_owned_error,
    resolve,
)
from aiolock._engine.handoff import SUPPORTED, HandoffToken, adopt, detach, refused
from aiolock._errors import LockError, WireFormatError
from aiolock._keys import LockKeys, check_lease, check_timeout
from aiolock._redis.client import as_int
from aiolock._redis.replicas import INHERIT

if TYPE_CHECKING:
    from aiolock._engine.guard import ManagerLike
    from aiolock._engine.kind import Hold, LockKind

__all__ = ["Adopted", "Lock"]


class Lock(Handle[LockKeys, "Lock"]):
    """A reentrant distributed lock, owned by the asyncio task that acquires it.

    Made by :meth:`aiolock.LockManager.lock`. Use it as ``async with lock:`` (the body is
    cancelled and :class:`LockLostError` raised if the hold is lost), or call
    :meth:`acquire` / :meth:`try_acquire` and :meth:`release` yourself.
    """

    __slots__ = ("_resource",)

    #: Whether this class acquires by Lock's own :meth:`_acquire`, so that acquire() and
    #: try_acquire() may do its work inline. A subclass that overrides
    #: _acquire (the read-write lock's sides refuse an upgrade and take a downgrade
    #: there) is False, and goes through its override: set by __init_subclass__, so a
    #: new override cannot be skipped by mistake.
    _plain = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._plain = cls._acquire is Lock._acquire

    def __init__(
        self,
        manager: ManagerLike,
        kind: LockKind,
        keys: LockKeys,
        timeout: float | None,
        lease: float | None,
    ) -> None:
        # Handle.__init__'s fields, set here: a handle is made per lock(name) call, nearly
        # always one per acquisition, so super().__init__ would be one more call on that path.
        # (timeout and lease may come by position: keywords made a dict per handle.)
        self._manager = manager
        self._kind = kind
        self._keys = keys
        self._timeout = timeout
        self._lease = lease
        self._body_guard = None
        self._replicas = INHERIT
        self._max_hold = _DEFAULT
        self._resource = keys.lock if kind.resource_is_key else kind.resource(keys)

    @property
    def name(self) -> str:
        """The name given to the factory (the key is derived from it)."""
        return self._keys.name

    @property
    def key(self) -> str:
        """The Redis key of the lock (a hash in aiolock's own wire format; see
        ``docs/wire-formats.md`` for the others)."""
        return self._keys.lock

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current task's hold, or None if it holds none.

        Every new acquisition of a name gets a larger token than the one before it;
        pass it to the resource the lock protects so it can refuse stale writers.
        """
        if self._kind.fencing_unavailable:
            raise WireFormatError(self._kind.fencing_unavailable)
        hold = self._current_hold()
        return None if hold is None else hold.token

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} timeout={self._timeout} lease={self._lease}>"

    # -- acquire and release -------------------------------------------------------------

    async def acquire(
        self,
        timeout: float | None = _DEFAULT,
        lease: float | None = _DEFAULT,
    ) -> None:
        """Acquire the lock for the current task, waiting up to *timeout* seconds.

        Re-entrant: a task that holds the lock acquires it again at once and must
        release it as many times. Raises :class:`LockTimeoutError` when the wait runs
        out. *timeout* and *lease* default to the values given to
        :meth:`aiolock.LockManager.lock`.
        """
        if not self._plain:  # a side of a read-write lock: its _acquire checks more
            await self._acquire(timeout, lease)
            return
        # (self._acquire and resolve(), spelled out: this is every acquisition's path)
        wait = self._timeout if timeout is _DEFAULT else check_timeout(timeout)
        fixed = self._lease if lease is _DEFAULT else None if lease is None else check_lease(lease)
        await self._take(self._keys, wait, fixed)

    async def try_acquire(self, timeout: float | None = 0, lease: float | None = _DEFAULT) -> bool:
        """Like :meth:`acquire`, but return False instead of raising on timeout.

        The default ``timeout=0`` makes exactly one attempt.
        """
        try:
            if not self._plain:  # a side of a read-write lock: its _acquire checks more
                await self._acquire(timeout, lease)
                return True
            # (self._acquire and resolve(), spelled out: this is every acquisition's path)
            wait = self._timeout if timeout is _DEFAULT else check_timeout(timeout)
            fixed = (
                self._lease if lease is _DEFAULT else None if lease is None else check_lease(lease)
            )
            await self._take(self._keys, wait, fixed)
        except TimeoutError:
            return False
        return True

    def _acquire(self, timeout: float | None, lease: float | None) -> Coroutine[Any, Any, Hold]:
        """The engine's acquisition for the current task (awaitable; no layer of its own)."""
        return self._take(self._keys, *resolve(timeout, lease, self._timeout, self._lease))

    async def release(self) -> None:
        """Release one hold of the current task (the lock is free when the count hits 0).

        Raises :class:`LockNotOwnedError` if the task does not hold the lock, and
        :class:`LockLostError` (a subclass) if it held it but the hold was lost. A release
        interrupted by a cancellation still completes (shielded, bounded in time).
        """
        engine = self._manager._open_engine()
        owner = self._manager._owner()
        registry = engine.registry
        hold = registry.get(self._resource, owner)
        if hold is None:
            parked = registry.parked(self._resource, owner)
            if parked is not None:
                await engine.release(parked)  # an unconfirmed release, sent again (idempotent)
                return
            if registry.pop_settled(self._resource, owner) is not None:
                return  # the release that raised LockConnectionError has since gone through
            hold = self._owned_hold()  # raises: lost, or never held
        await engine.release(hold)

    async def extend(self, lease: float | None = None, *, additional: float | None = None) -> None:
        """Set the remaining lease of the current task's fixed-lease hold to *lease* s, or
        add *additional* s to what is left of it (one atomic step on the server, like
        redis-py's ``extend(additional_time)``); give exactly one of the two."""
        seconds = extend_seconds(lease, additional)
        engine = self._manager._open_engine()
        hold = self._owned_hold()
        if hold.renew:
            raise LockError(
                f"lock {self.name!r} is renewed automatically, so there is nothing to extend; "
                "extend() is for holds acquired with an explicit lease="
            )
        if additional is None:
            await engine.extend(hold, seconds)
        else:
            await engine.extend_by(hold, seconds)

    async def force_release(self) -> bool:
        """Delete the lock whoever holds it and wake a waiter; True if it was held.

        An administrator's tool: the holder is not asked, and learns of it as a lost lease.
        """
        return await self._manager._open_engine().force_release(self._kind, self._keys)

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
        if not self._kind.detachable:
            raise self._not_detachable()
        seconds = None if lease is None else check_lease(lease)
        engine = self._manager._open_engine()
        hold = self._owned_hold()
        return await detach(engine, hold, engine.rt.lease if seconds is None else seconds)

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
        if not self._kind.detachable:
            raise self._not_detachable()
        if found.key != self._keys.lock:
            raise ValueError(
                f"the hand-off token is for the lock key {found.key!r}, not this lock's "
                f"{self._keys.lock!r}: adopt it with a handle of the same name, from a "
                "LockManager with the same prefix"
            )
        engine = self._manager._open_engine()
        owner = self._manager._owner()
        await adopt(engine, self._kind, self._keys, owner, found, fixed)
        max_hold = engine.rt.max_hold if self._max_hold is _DEFAULT else self._max_hold
        hold = engine.registry.get(self._resource, owner)
        if max_hold is not None and hold is not None:
            engine.bound(hold, max_hold)  # from the adoption: a new holder, a new bound

    def adopted(self, token: str, *, lease: float | None = _DEFAULT) -> Adopted:
        """``async with lock.adopted(token):`` adopts (see :meth:`adopt`), runs the body
        guarded as ``async with lock:`` does (cancelled if the hold is lost), and releases."""
        return Adopted(self, token, self._adopt_lease(lease))

    def _adopt_lease(self, lease: float | None) -> float | None:
        return resolve(None, lease, None, self._lease)[1]

    def _not_detachable(self) -> LockError:
        """The refusal of a hand-off by a handle whose kind is not ``detachable``: a plain
        Lock's kind is then another wire format's; any other handle's is another kind."""
        what = f"{type(self).__name__} {self.name!r}"
        if type(self) is Lock:
            return WireFormatError(f"{what} uses another wire format: {SUPPORTED}")
        return refused(what)

    # -- queries -------------------------------------------------------------------------

    async def locked(self) -> bool:
        """Whether anyone holds the lock."""
        self._manager._open_engine()
        return await self._kind.locked(self._keys)

    async def owned(self) -> bool:
        """Whether the current task holds the lock (asks Redis)."""
        return await self.hold_count() > 0

    async def hold_count(self) -> int:
        """How many times the current task holds the lock, per Redis (0 if not)."""
        engine = self._manager._open_engine()
        hold = engine.registry.get(self._resource, self._manager._owner())
        counted = await self._kind.hold_count(self._keys, hold)  # formats without a hash
        if counted is not None:
            return counted
        if hold is None:
            # Still ask Redis, so that a key of another type is reported as such.
            await engine.client.call("HEXISTS", self._keys.lock, "-", key=self._keys.lock)
            return 0
        count = await engine.client.call("HGET", self._keys.lock, hold.field, key=self._keys.lock)
        return 0 if count is None else as_int(count)

    async def ttl(self) -> float | None:
        """Seconds left on the lock's lease; None if nobody holds it, inf if it never expires."""
        self._manager._open_engine()
        ms = await self._kind.lease_left(self._keys)  # (a structure may outlive its holds)
        if ms == -2:
            return None
        return math.inf if ms < 0 else ms / 1000

    # -- async with (Handle's __aenter__ and __aexit__) ----------------------------------

    def _acquire_block(self) -> Coroutine[Any, Any, Hold]:
        return self._acquire(_DEFAULT, _DEFAULT)

    def _entered(self, holds: Sequence[Hold]) -> Lock:
        return self

    # -- helpers -------------------------------------------------------------------------

    def _current_hold(self) -> Hold | None:
        engine = self._manager._engine
        if engine is None or asyncio.current_task() is None:
            return None
        return engine.registry.get(self._resource, self._manager._owner())

    def _owned_hold(self) -> Hold:
        engine = self._manager._open_engine()
        owner = self._manager._owner()
        hold = engine.registry.get(self._resource, owner)
        if hold is not None:
            return hold
        lost = engine.registry.pop_lost(self._resource, owner)
        if lost is not None:
            raise lost_error(f"lock {self.name!r}", lost.lost_reason, " the critical section")
        raise not_owned_error(f"lock {self.name!r}")


class Adopted:
    """``async with lock.adopted(token):``: adopt, guard the body as ``async with lock:``
    does, release at the end (see :meth:`Lock.adopted`)."""

    __slots__ = ("_lease", "_lock", "_token")

    def __init__(self, lock: Lock, token: str, lease: float | None) -> None:
        HandoffToken.decode(token)  # a bad token is refused at the call that got it
        self._lock = lock
        self._token = token
        self._lease = lease

    async def __aenter__(self) -> Lock:
        lock = self._lock
        await lock.adopt(self._token, lease=self._lease)
        engine = lock._manager._open_engine()
        hold = lock._current_hold()
        assert hold is not None  # adopt() registered it for this task
        # (enter() finds the block's owner from its caller's caller: this method's caller)
        if not lock._guard.enter(engine, hold):
            await lock._guard.refuse(engine, hold)
        return lock

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lock = self._lock
        engine = lock._manager._engine if lock._manager.is_open else None
        await lock._guard.exit(lock, engine, exc_type, exc, tb)
