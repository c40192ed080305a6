"""The Redlock handle and the records the manager keeps for it.

:class:`RedlockLock` is what a user holds: the :class:`~aiolock.Lock` API (acquire,
try_acquire, release, owned, ``async with`` whose body a loss cancels) over
:class:`~aiolock._redlock.manager.RedlockManager`, which it reaches through the small
:class:`RedlockOps` protocol (no import of the manager, which imports this module).
"""

from __future__ import annotations

import asyncio
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple, Protocol

from aiolock._engine.guard import Blocks, take_back
from aiolock._engine.handle import _DEFAULT, resolve
from aiolock._errors import LockError, LockLostError, LockTimeoutError

if TYPE_CHECKING:
    from aiolock._engine.kind import Cancellable
    from aiolock._keys import LockKeys

__all__ = ["FENCING_MESSAGE", "Busy", "Gate", "RedlockHold", "RedlockLock", "RedlockOps"]

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
        #: the local gate it keeps while held (None for a single-round acquisition)
        self.gate: Gate | None = None

    def __repr__(self) -> str:
        left = self.valid_until - time.monotonic()
        return f"<RedlockHold {self.keys.name!r} count={self.count} valid for {left:.3f} s>"


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

    def pop_lost(self, keys: LockKeys) -> RedlockHold | None: ...


class RedlockLock:
    """A Redlock handle: :class:`~aiolock.Lock`'s API over a majority of masters.

    Made by :meth:`RedlockManager.lock`. Reentrant per asyncio task. A loss (a majority
    of masters no longer has it, or its validity ended unrenewed) cancels the body of
    ``async with`` and raises :class:`~aiolock.LockLostError`.
    """

    __slots__ = ("_blocks", "_keys", "_lease", "_manager", "_timeout")

    def __init__(
        self, manager: RedlockOps, keys: LockKeys, timeout: float | None, lease: float | None
    ) -> None:
        self._manager = manager
        self._keys = keys
        self._timeout = timeout
        self._lease = lease
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
        return await self._manager.acquire(self._keys, wait, fixed)

    async def release(self) -> None:
        """Release one hold of the current task, on every master when it is the last.

        Raises :class:`~aiolock.LockNotOwnedError` if the task does not hold it, and
        :class:`~aiolock.LockLostError` if it was lost (or a majority no longer had it).
        """
        await self._manager.release(self._keys)

    async def owned(self) -> bool:
        """Whether a majority of masters hold the current task's token (asks them)."""
        return await self._manager.votes(self._keys) >= self._manager.quorum

    async def __aenter__(self) -> RedlockLock:
        hold = await self._acquire(_DEFAULT, _DEFAULT)
        # A block, not a cancel scope, so that it may be held across a yield (see
        # aiolock._engine.guard): recorded under the frame of the 'async with'.
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
            raise RuntimeError(
                f"{self!r} was exited by a frame and a task that did not enter it: call "
                "__aenter__ and __aexit__ from the same function (an 'async with' does)"
            )
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
