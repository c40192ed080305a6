"""The Redlock handle and the records the manager keeps for it.

:class:`RedlockLock` is what a user holds: the :class:`~aiolock.Lock` API (acquire,
try_acquire, release, extend, owned, locked, ttl, hold_count, force_release, ``async
with`` whose body a loss cancels) over
:class:`~aiolock._redlock.manager.RedlockManager`, which it reaches through the small
:class:`RedlockOps` protocol (no import of the manager, which imports this module).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple, Protocol

from aiolock._engine.guard import Blocks, take_back, unmatched_exit
from aiolock._engine.handle import _DEFAULT, resolve
from aiolock._errors import LockError, LockLostError, LockTimeoutError

if TYPE_CHECKING:
    from aiolock._engine.kind import Cancellable
    from aiolock._keys import LockKeys

__all__ = [
    "FENCING_MESSAGE",
    "Busy",
    "Gate",
    "RedlockHold",
    "RedlockLock",
    "RedlockOps",
    "RedlockStatistics",
]

FENCING_MESSAGE = (
    "fencing tokens are not available with Redlock: its masters are independent, so no "
    "single counter orders the acquisitions, and a token from one master says nothing "
    "about the others. If the protected resource must refuse stale writers, use "
    "LockManager(redis).lock(), whose tokens come from one server, or a store with its "
    "own compare-and-set"
)


class Busy(NamedTuple):
    """A round that did not win a majority."""

    #: seconds until the holder's lease would end (the longest a waiter sleeps)
    ttl: float
    #: this round won some votes but not a majority: contenders split the votes
    split: bool


class Gate:
    """This manager's tasks that want one Redlock name: one of them contends at a time.

    First come, first served (an asyncio.Lock); the task that wins keeps the gate until
    its hold ends. The gate listens for releases of the name while any task uses it.
    """

    __slots__ = ("channel", "listening", "lock", "users")

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.lock = asyncio.Lock()
        #: tasks waiting at the gate, contending, or holding through it
        self.users = 0
        self.listening = False


class RedlockHold:
    """One task's hold of one Redlock name (re-entries count up locally)."""

    __slots__ = (
        "count",
        "gate",
        "keys",
        "lease",
        "limit",
        "lost",
        "lost_reason",
        "next_check",
        "owner",
        "renew",
        "scopes",
        "sent",
        "timer",
        "token",
        "valid_until",
    )

    def __init__(
        self,
        keys: LockKeys,
        owner: str,
        token: str,
        lease: float,
        renew: bool,
        valid: float,
        sent: frozenset[int],
    ) -> None:
        self.keys = keys
        #: the masters the acquire was sent to (the others were skipped): its release's
        self.sent = sent
        self.owner = owner
        #: the value of the key on the masters: unique to this acquisition
        self.token = token
        self.count = 1
        self.lease = lease
        self.renew = renew
        #: monotonic time until which a majority surely still has the key
        self.valid_until = valid
        self.next_check = time.monotonic() + lease / 3
        self.lost = False
        self.lost_reason = ""
        #: the ``async with`` blocks running under it (aiolock._engine.guard's): a loss cancels each
        self.scopes: list[Cancellable] = []
        self.timer: asyncio.TimerHandle | None = None
        #: the timer that ends it when it has been held for its max_hold (None if none)
        self.limit: asyncio.TimerHandle | None = None
        #: the local gate it keeps while held (None for a single-round acquisition)
        self.gate: Gate | None = None

    def __repr__(self) -> str:
        left = self.valid_until - time.monotonic()
        return f"<RedlockHold {self.keys.name!r} count={self.count} valid for {left:.3f} s>"


@dataclass(frozen=True)
class RedlockStatistics:
    """A snapshot of a Redlock manager's state (no I/O)."""

    #: masters, and how many must grant a lock
    masters: int
    quorum: int
    #: holds of this manager's tasks now
    held: int
    #: acquisitions, rounds that did not reach a majority in time, holds lost
    acquired: int
    failed_rounds: int
    lost: int
    #: renewal rounds sent, release messages heard (from any master)
    renewal_rounds: int
    messages: int
    #: undo or release commands waiting to be retried on a master that did not answer
    pending_cleanups: int


class RedlockOps(Protocol):
    """What a :class:`RedlockLock` needs from the manager that made it."""

    @property
    def is_open(self) -> bool: ...

    @property
    def quorum(self) -> int: ...

    def _check_fixed_lease(self, lease: object) -> float: ...

    async def acquire(
        self, keys: LockKeys, timeout: float | None, lease: float | None
    ) -> RedlockHold: ...

    async def release(self, keys: LockKeys) -> None: ...

    async def release_hold(self, hold: RedlockHold) -> None: ...

    def forget_lost(self, hold: RedlockHold) -> None: ...

    async def votes(self, keys: LockKeys) -> int: ...

    def current(self, keys: LockKeys) -> RedlockHold | None: ...

    def bound(self, hold: RedlockHold, max_hold: float) -> None: ...

    def pop_lost(self, keys: LockKeys) -> RedlockHold | None: ...

    async def extend(
        self, keys: LockKeys, lease: float | None, additional: float | None
    ) -> None: ...

    async def is_locked(self, keys: LockKeys) -> bool: ...

    async def ttl(self, keys: LockKeys) -> float | None: ...

    async def force_release(self, keys: LockKeys) -> bool: ...


class RedlockLock:
    """A Redlock handle: :class:`~aiolock.Lock`'s API over a majority of masters, but for
    fencing tokens and hand-off.

    Made by :meth:`RedlockManager.lock`. Reentrant per asyncio task. A loss (a majority
    of masters no longer has it, or its validity ended unrenewed) cancels the body of
    ``async with`` and raises :class:`~aiolock.LockLostError`.
    """

    __slots__ = ("_blocks", "_keys", "_lease", "_manager", "_max_hold", "_timeout")

    def __init__(
        self,
        manager: RedlockOps,
        keys: LockKeys,
        timeout: float | None,
        lease: float | None,
        max_hold: float | None = None,
    ) -> None:
        self._manager = manager
        self._keys = keys
        self._timeout = timeout
        self._lease = lease
        #: the longest a hold of this handle lasts (None: no bound)
        self._max_hold = max_hold
        self._blocks: Blocks[RedlockHold] = Blocks()

    @property
    def name(self) -> str:
        return self._keys.name

    @property
    def key(self) -> str:
        """The key on every master."""
        return self._keys.lock

    @property
    def fencing_token(self) -> int | None:
        """Not available with Redlock: raises :class:`~aiolock.LockError` saying why."""
        raise LockError(FENCING_MESSAGE)

    def __repr__(self) -> str:
        return f"<RedlockLock {self.name!r} timeout={self._timeout} lease={self._lease}>"

    async def acquire(
        self, timeout: float | None = _DEFAULT, lease: float | None = _DEFAULT
    ) -> None:
        """Acquire for the current task, waiting up to *timeout* s (``None``: as long as it
        takes). *timeout* and *lease* default to the handle's.

        Raises :class:`~aiolock.LockTimeoutError` when no majority granted it in time.
        """
        await self._acquire(timeout, lease)

    async def try_acquire(self, timeout: float | None = 0, lease: float | None = _DEFAULT) -> bool:
        """Like :meth:`acquire`, but False instead of a timeout; ``timeout=0``: one round."""
        try:
            await self._acquire(timeout, lease)
        except LockTimeoutError:
            return False
        return True

    async def _acquire(self, timeout: float | None, lease: float | None) -> RedlockHold:
        wait, fixed = resolve(timeout, lease, self._timeout, self._lease)
        if fixed is not None and lease is not _DEFAULT:
            fixed = self._manager._check_fixed_lease(fixed)
        hold = await self._manager.acquire(self._keys, wait, fixed)
        if self._max_hold is not None:
            self._manager.bound(hold, self._max_hold)
        return hold

    async def release(self) -> None:
        """Release one hold of the current task, on every master when it is the last.

        Raises :class:`~aiolock.LockNotOwnedError` if the task does not hold it, and
        :class:`~aiolock.LockLostError` if it was lost (or a majority no longer had it).
        """
        await self._manager.release(self._keys)

    async def extend(self, lease: float | None = None, *, additional: float | None = None) -> None:
        """Set the remaining lease of the current task's fixed-lease hold to *lease* s, or
        add *additional* s to what is left of it on each master; give exactly one.

        Extended when a majority of the masters the hold was acquired on confirm it
        within the hold's validity; otherwise the hold is lost (released where it is
        still found) and :class:`~aiolock.LockLostError` raised. A *lease* must be more
        than three times ``node_timeout``, as at acquire. Raises
        :class:`~aiolock.LockError` for a hold that is renewed automatically (acquired
        without ``lease=``), and :class:`~aiolock.LockNotOwnedError` if the task does
        not hold it.
        """
        await self._manager.extend(self._keys, lease, additional)

    async def force_release(self) -> bool:
        """Delete the lock on every master whoever holds it, and wake its waiters; True
        if a majority of masters held it.

        An administrator's tool: the holder is not asked, and learns of it as a loss at
        its next renewal round (at once in this manager). Raises
        :class:`~aiolock.LockConnectionError` if too few masters answered to tell; the
        key is gone from those that did.
        """
        return await self._manager.force_release(self._keys)

    async def locked(self) -> bool:
        """Whether anyone holds the lock: a majority of masters have the key for one
        token. Raises :class:`~aiolock.LockConnectionError` if too few masters answered
        to tell."""
        return await self._manager.is_locked(self._keys)

    async def owned(self) -> bool:
        """Whether a majority of masters hold the current task's token (asks them)."""
        return await self._manager.votes(self._keys) >= self._manager.quorum

    async def hold_count(self) -> int:
        """How many times the current task holds the lock (re-entries count locally), 0
        if it does not or a majority of masters no longer have its token."""
        hold = self._manager.current(self._keys)
        if hold is None or not await self.owned():
            return 0
        return hold.count

    async def ttl(self) -> float | None:
        """Seconds left on the lock's lease, whoever holds it: until fewer than a majority
        of masters would still have it, less the clock drift allowance, as a hold's
        validity is counted. None if nobody holds it; inf if its keys never expire.
        Raises :class:`~aiolock.LockConnectionError` if too few masters answered to tell.
        """
        return await self._manager.ttl(self._keys)

    async def __aenter__(self) -> RedlockLock:
        hold = await self._acquire(_DEFAULT, _DEFAULT)
        # A block, not a cancel scope, so that it may be held across a yield (see
        # aiolock._engine.guard): its owner is what runs the caller, the 'async with'.
        hold.scopes.append(self._blocks.open((hold,), sys._getframe(1)))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        block = self._blocks.take(sys._getframe(1))
        if block is None:
            raise unmatched_exit(self)
        (hold,) = block.holds
        if block in hold.scopes:
            hold.scopes.remove(block)
        here = block.task is asyncio.current_task()
        ours = here and block.requested and await take_back(block, exc)
        outside = exc_type is not None and not ours and issubclass(exc_type, asyncio.CancelledError)
        if hold.lost:
            if self._manager.is_open:
                self._manager.forget_lost(hold)
            if outside or (not here and exc_type is GeneratorExit):
                return  # that cancellation goes on; or nobody awaits a closed generator
            raise LockLostError(
                f"redlock {self.name!r} was lost inside 'async with' ({hold.lost_reason}); "
                "the body was cancelled because another owner may have entered"
            ) from (None if ours else exc)
        if not self._manager.is_open:
            return
        await self._manager.release_hold(hold)  # the block's own, whichever task exits it
