"""Semaphore and Permit: the handles of the semaphore kind.

A :class:`Semaphore` is a handle on one name, like :class:`~aiolock.Lock`; what it
grants is a :class:`Permit` object (one acquisition of one or more permits), which is
released, extended and asked for its fencing token on its own. The policy and the wire
format are described in ``docs/semaphore.md`` and :mod:`aiolock._kinds.semaphore.kind`.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, cast

from aiolock._engine.engine import ORPHAN
from aiolock._engine.handle import _DEFAULT, Handle, extend_seconds, resolve
from aiolock._errors import (
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    WireFormatError,
)
from aiolock._kinds.semaphore.kind import SemaphoreKeys, SemaphoreKind, check_limit, check_permits

if TYPE_CHECKING:
    from aiolock._engine.guard import ManagerLike
    from aiolock._engine.kind import Hold

__all__ = ["Permit", "Semaphore"]


class Permit:
    """Permits granted by one acquisition of a :class:`Semaphore`.

    It belongs to the task that acquired it: if that task ends without releasing it,
    the manager releases it (with a warning). While held, its lease is renewed in the
    background, unless it was acquired with a fixed ``lease=``.
    """

    __slots__ = ("_hold", "_manager", "_unconfirmed")

    def __init__(self, manager: ManagerLike, hold: Hold) -> None:
        self._manager = manager
        self._hold = hold
        #: this Permit's release() raised before Redis confirmed it (retried meanwhile)
        self._unconfirmed = False

    @property
    def name(self) -> str:
        """The name given to the factory (the key is derived from it)."""
        return self._hold.keys.name

    @property
    def permits(self) -> int:
        """How many permits this acquisition holds."""
        return self._hold.permits

    @property
    def fencing_token(self) -> int:
        """This acquisition's fencing token: larger than every token issued before it."""
        if self._hold.kind.fencing_unavailable:
            raise WireFormatError(self._hold.kind.fencing_unavailable)
        return self._hold.token

    @property
    def held(self) -> bool:
        """Whether this client still counts the permits as held (no I/O)."""
        engine = self._manager._engine
        return engine is not None and engine.registry.holds(self._hold)

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self._hold.lost else "released")
        return f"<Permit {self.name!r} permits={self.permits} token={self._hold.token} {state}>"

    async def release(self) -> None:
        """Give the permits back (and wake waiters).

        Raises :class:`LockNotOwnedError` if they were already released, and
        :class:`LockLostError` (a subclass) if they were lost (lease ended, force
        release). Interrupted by a cancellation, the release still completes (shielded,
        bounded in time); if Redis cannot be reached it is retried in the background and
        this raises :class:`LockConnectionError`; calling release() again then resends
        it or finds it done.
        """
        engine = self._manager._open_engine()
        hold = self._hold
        if hold.lost:
            raise self._lost_error()
        # Judged by the hold itself, never by the registry's (resource, owner) indexes:
        # one task may hold several Permits of one semaphore, and two of them parked
        # would share one entry there.
        unconfirmed = hold.release_id is not None and hold.owner != ORPHAN
        if engine.registry.holds(hold) or unconfirmed:
            # Held, or its release raised LockConnectionError and is still retried in
            # the background: send it (again; a resend is harmless).
            try:
                await engine.release(hold)
            finally:
                self._unconfirmed = hold.release_id is not None
            return
        if self._unconfirmed and hold.count == 0:
            self._unconfirmed = False  # the release that raised has since gone through
            return
        if hold.owner == ORPHAN:
            raise LockNotOwnedError(
                f"this permit of semaphore {self.name!r} is no longer held: the task that "
                "acquired it ended, and it was released"
            )
        # Released by this Permit, or by the 'async with' block that made it.
        raise LockNotOwnedError(f"this permit of semaphore {self.name!r} was already released")

    async def extend(self, lease: float | None = None, *, additional: float | None = None) -> None:
        """Set the remaining lease of a permit acquired with a fixed ``lease=`` to *lease*
        s, or add *additional* s to what is left of it (one atomic step on the server, as
        :meth:`aiolock.Lock.extend`); give exactly one of the two."""
        seconds = extend_seconds(lease, additional)
        engine = self._manager._open_engine()
        hold = self._hold
        if hold.lost:
            raise self._lost_error()
        if not engine.registry.holds(hold):
            raise LockNotOwnedError(f"this permit of semaphore {self.name!r} is not held")
        if hold.renew:
            raise LockError(
                f"this permit of semaphore {self.name!r} is renewed automatically, so there "
                "is nothing to extend; extend() is for permits acquired with an explicit lease="
            )
        if additional is None:
            await engine.extend(hold, seconds)
        else:
            await engine.extend_by(hold, seconds)

    def _lost_error(self) -> LockLostError:
        # Reported here: the registry need not remember it for a later call any more
        # (this Permit tells by its hold's own state).
        engine = self._manager._engine
        if engine is not None:
            engine.registry.forget_lost(self._hold)
        return LockLostError(
            f"this permit of semaphore {self.name!r} was lost ({self._hold.lost_reason}); "
            "its permits may have been granted to others"
        )


class Semaphore(Handle[SemaphoreKeys, Permit]):
    """A distributed semaphore: at most ``limit`` permits held at once, across clients.

    Made by :meth:`aiolock.LockManager.semaphore`. ``async with sem:`` holds one permit
    for the body (the body is cancelled and :class:`LockLostError` raised if it is
    lost); :meth:`acquire` returns a :class:`Permit` for several, released on its own.
    """

    __slots__ = ()

    @property
    def name(self) -> str:
        """The name given to the factory (the key is derived from it)."""
        return self._keys.name

    @property
    def key(self) -> str:
        """The Redis key of the holders' hash."""
        return self._keys.lock

    @property
    def _semaphore(self) -> SemaphoreKind:
        """The kind, as its own class (the base knows it as a LockKind)."""
        return cast("SemaphoreKind", self._kind)

    @property
    def limit(self) -> int:
        """The limit this handle was made with (or last set with :meth:`set_limit`)."""
        return self._keys.limit

    def __repr__(self) -> str:
        return (
            f"<Semaphore {self.name!r} limit={self.limit} timeout={self._timeout} "
            f"lease={self._lease}>"
        )

    # -- acquire -----------------------------------------------------------------------

    async def acquire(
        self,
        permits: int = 1,
        timeout: float | None = _DEFAULT,
        lease: float | None = _DEFAULT,
    ) -> Permit:
        """Acquire *permits* permits, waiting up to *timeout* seconds.

        Raises :class:`LockTimeoutError` when the wait runs out, and :class:`LockError`
        if the limit stored in Redis differs from this handle's. *timeout* and *lease*
        default to the values given to :meth:`aiolock.LockManager.semaphore`.
        """
        return Permit(self._manager, await self._acquire(permits, timeout, lease))

    async def try_acquire(
        self, permits: int = 1, timeout: float | None = 0, lease: float | None = _DEFAULT
    ) -> Permit | None:
        """Like :meth:`acquire`, but return None instead of raising on timeout.

        The default ``timeout=0`` makes one attempt.
        """
        try:
            return await self.acquire(permits, timeout, lease)
        except LockTimeoutError:
            return None

    def _acquire(
        self, permits: int, timeout: float | None, lease: float | None
    ) -> Coroutine[Any, Any, Hold]:
        permits = check_permits(permits, self._keys.limit)
        wait, fixed = resolve(timeout, lease, self._timeout, self._lease)
        return self._take(self._keys, wait, fixed, permits)

    # -- async with (Handle's __aenter__ and __aexit__): one permit for the body ----------

    def _acquire_block(self) -> Coroutine[Any, Any, Hold]:
        return self._acquire(1, _DEFAULT, _DEFAULT)

    def _entered(self, holds: Sequence[Hold]) -> Permit:
        return Permit(self._manager, holds[0])

    # -- state and administration -------------------------------------------------------

    async def available(self) -> int:
        """Permits free now: the limit minus the permits held (never below 0).

        Permits that waiting requests have claimed are counted as free.
        """
        limit, held, _, _ = await self._state()
        return max(0, limit - held)

    async def holders(self) -> int:
        """How many acquisitions (Permits, of any client) hold permits now."""
        _, _, holders, _ = await self._state()
        return holders

    async def _state(self) -> tuple[int, int, int, int]:
        self._manager._open_engine()  # refuses a manager that is not open
        limit, held, holders, claims = await self._semaphore.state(self._keys)
        return (self._keys.limit if limit < 0 else limit), held, holders, claims

    async def set_limit(self, limit: int) -> None:
        """Change the limit for every client (an administrator's tool).

        This handle takes the new limit; other handles made with another limit get a
        :class:`LockError` at their next acquire (requests already waiting go on under
        the new limit). The stored limit lasts while the semaphore is in use and goes
        with its last lease or claim (on an idle semaphore: until its next acquire, which
        ties it to that use); then the next acquire's handle sets it. Lowering it takes
        nothing away: holders keep their permits, and new requests wait until the total
        held drops enough. Raising it wakes waiters.
        """
        limit = check_limit(limit)
        engine = self._manager._open_engine()
        await self._semaphore.set_limit(self._keys, limit)
        self._keys.limit = limit
        engine.hub.wake(self._keys.channel)  # our own message does not wake our waiters

    async def force_release(self) -> bool:
        """Free every permit whoever holds it and wake waiters; True if any was held.

        An administrator's tool: the holders are not asked, and learn of it as a loss.
        """
        return await self._manager._open_engine().force_release(self._kind, self._keys)
