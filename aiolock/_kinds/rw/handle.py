"""ReadWriteLock: the read and write sides of one name, each a :class:`~aiolock.Lock`.

A side is the engine's Lock (:mod:`aiolock._engine.lockhandle`) over its own kind
(:mod:`aiolock._kinds.rw.kind`); both kinds work on one structure in Redis. What the sides
add to the Lock API is what a task may do with both: take the read side while it holds
the write side (a downgrade, granted at once, never queued behind waiters that wait for
this very task), and never ask for the write side while it holds only the read side
(refused at once: two readers doing that would wait for each other forever). Their
kinds are not ``detachable``, so their ``detach()`` and ``adopt()`` refuse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiolock._engine.handle import _DEFAULT, resolve
from aiolock._engine.lockhandle import Lock
from aiolock._errors import LockError, LockTimeoutError
from aiolock._keys import LockKeys
from aiolock._redis.replicas import INHERIT, HandlePolicy

if TYPE_CHECKING:
    from aiolock._engine.guard import ManagerLike
    from aiolock._engine.kind import Hold, LockKind

__all__ = ["ReadWriteLock"]


class _ReadSide(Lock):
    """The read side: shared; a task that holds the write side downgrades at once."""

    __slots__ = ("_write_resource",)

    def __init__(
        self,
        manager: ManagerLike,
        kind: LockKind,
        write_kind: LockKind,
        keys: LockKeys,
        *,
        timeout: float | None,
        lease: float | None,
    ) -> None:
        super().__init__(manager, kind, keys, timeout, lease)
        self._write_resource = write_kind.resource(keys)

    def __repr__(self) -> str:
        return (
            f"<ReadWriteLock {self.name!r} read side timeout={self._timeout} lease={self._lease}>"
        )

    async def _acquire(self, timeout: float | None, lease: float | None) -> Hold:
        engine = self._manager._open_engine()
        owner = self._manager._owner()
        registry = engine.registry
        if (
            registry.get(self._resource, owner) is None
            and registry.get(self._write_resource, owner) is not None
        ):
            # A downgrade: Redis grants it whoever waits, so it takes one attempt outside
            # the local queue (whose readers may be waiting for this very task's write).
            try:
                return await super()._acquire(0, lease)
            except LockTimeoutError:
                pass  # the write hold has ended in Redis: wait like any other reader
        return await super()._acquire(timeout, lease)


class _WriteSide(Lock):
    """The write side: exclusive; refused at once to a task that holds only the read side."""

    __slots__ = ("_read_resource",)

    def __init__(
        self,
        manager: ManagerLike,
        kind: LockKind,
        read_kind: LockKind,
        keys: LockKeys,
        *,
        timeout: float | None,
        lease: float | None,
    ) -> None:
        super().__init__(manager, kind, keys, timeout, lease)
        self._read_resource = read_kind.resource(keys)

    def __repr__(self) -> str:
        return (
            f"<ReadWriteLock {self.name!r} write side timeout={self._timeout} lease={self._lease}>"
        )

    async def _acquire(self, timeout: float | None, lease: float | None) -> Hold:
        engine = self._manager._open_engine()
        owner = self._manager._owner()
        registry = engine.registry
        if (
            registry.get(self._read_resource, owner) is not None
            and registry.get(self._resource, owner) is None
        ):
            raise LockError(
                f"read-write lock {self.name!r}: this task holds the read side and asked "
                "for the write side; upgrading is not supported, since two readers "
                "upgrading at once would wait for each other forever. Release the read "
                "side first and then acquire the write side (re-checking what you read), "
                "or take the write side from the start and acquire the read side before "
                "releasing it (a downgrade)"
            )
        return await super()._acquire(timeout, lease)


class ReadWriteLock:
    """Many readers or one writer on one name, across processes.

    Made by :meth:`aiolock.LockManager.rw_lock`. :meth:`read` and :meth:`write` give the
    two sides, each with the full :class:`~aiolock.Lock` API (``async with``, acquire,
    release, extend, fencing tokens, ...). Both sides are reentrant per task; a task that
    holds the write side may take the read side too and then release the write side
    (a downgrade, with no gap for another writer); a task that holds only the read side
    cannot take the write side (:class:`~aiolock.LockError`, at once). A waiting writer
    makes new readers wait, so readers cannot starve it.
    """

    __slots__ = ("_keys", "_lease", "_manager", "_max_hold", "_read", "_read_kind", "_replicas",
                 "_timeout", "_write", "_write_kind")  # fmt: skip

    def __init__(
        self,
        manager: ManagerLike,
        read_kind: LockKind,
        write_kind: LockKind,
        keys: LockKeys,
        *,
        timeout: float | None,
        lease: float | None,
    ) -> None:
        self._manager = manager
        self._read_kind = read_kind
        self._write_kind = write_kind
        self._keys = keys
        self._timeout = timeout
        self._lease = lease
        #: the factory's replicas= (see aiolock._redis.replicas), given to both sides
        self._replicas: HandlePolicy = INHERIT
        #: the factory's max_hold=, given to both sides (_DEFAULT: the manager's)
        self._max_hold: float | None = _DEFAULT
        # The handles with the lock's defaults, made once: ``rw.read()`` is the usual call.
        self._read = self._read_side(timeout, lease)
        self._write = self._write_side(timeout, lease)

    @property
    def name(self) -> str:
        """The name given to the factory (the key is derived from it)."""
        return self._keys.name

    @property
    def key(self) -> str:
        """The Redis key of the lock's hash (the other keys share its prefix)."""
        return self._keys.lock

    def read(self, *, timeout: float | None = _DEFAULT, lease: float | None = _DEFAULT) -> Lock:
        """The read side, with these defaults for acquire and ``async with``.

        *timeout* and *lease* default to the values given to
        :meth:`aiolock.LockManager.rw_lock`.
        """
        if timeout is _DEFAULT and lease is _DEFAULT:
            return self._read
        return self._read_side(*resolve(timeout, lease, self._timeout, self._lease))

    def write(self, *, timeout: float | None = _DEFAULT, lease: float | None = _DEFAULT) -> Lock:
        """The write side, with these defaults for acquire and ``async with``.

        *timeout* and *lease* default to the values given to
        :meth:`aiolock.LockManager.rw_lock`.
        """
        if timeout is _DEFAULT and lease is _DEFAULT:
            return self._write
        return self._write_side(*resolve(timeout, lease, self._timeout, self._lease))

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self.name!r} timeout={self._timeout} lease={self._lease}>"

    def _read_side(self, timeout: float | None, lease: float | None) -> Lock:
        side = _ReadSide(self._manager, self._read_kind, self._write_kind, self._keys,
                         timeout=timeout, lease=lease)  # fmt: skip
        side._replicas = self._replicas
        side._max_hold = self._max_hold
        return side

    def _write_side(self, timeout: float | None, lease: float | None) -> Lock:
        side = _WriteSide(self._manager, self._write_kind, self._read_kind, self._keys,
                          timeout=timeout, lease=lease)  # fmt: skip
        side._replicas = self._replicas
        side._max_hold = self._max_hold
        return side

    def _set_replicas(self, policy: HandlePolicy) -> None:
        """The factory's replicas=, for both sides (made before it was known)."""
        self._replicas = self._read._replicas = self._write._replicas = policy

    def _set_max_hold(self, max_hold: float | None) -> None:
        """The factory's max_hold=, for both sides (made before it was known)."""
        self._max_hold = self._read._max_hold = self._write._max_hold = max_hold
