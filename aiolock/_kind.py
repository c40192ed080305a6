"""The seam between the engine and the lock kinds: what a kind provides, and what it grants.

The engine (:mod:`aiolock._engine`) owns everything generic: local queues, waiting on
pub/sub, undoing attempts cancelled in flight, shielded and retried releases, the hold
registry, the watchdog, loss reporting. A lock *kind* (:mod:`aiolock._kinds`) owns its
wire format: it runs its own scripts and decodes their replies into the small outcome
types below. Adding a kind is one module implementing :class:`LockKind`, its scripts, a
factory method on the manager and an export.

A kind answers:

* :meth:`~LockKind.attempt`: one try at acquiring (or re-entering) -> :class:`Granted`
  or :class:`Busy`;
* :meth:`~LockKind.undo`: revert an attempt whose outcome is unknown, or void it before
  it runs;
* :meth:`~LockKind.release`: release one hold, or hand the resource to a local successor
  -> :class:`Released`;
* :meth:`~LockKind.renew`: renew (or, for fixed leases, only check) a batch of holds that
  share one Redis Cluster slot;
* :attr:`~LockKind.reentrant` and :attr:`~LockKind.shared`: whether a task's second
  acquire re-enters its hold, and whether one grant lets the next local waiter try at
  once (read locks and semaphores) instead of waiting for a release.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from anyio import CancelScope

    from ._keys import LockKeys

__all__ = [
    "Attempt",
    "Busy",
    "Granted",
    "Hold",
    "LockKind",
    "ReleaseStatus",
    "Released",
    "Successor",
]


class Hold:
    """One grant of one kind to one owner task: the registry's unit."""

    __slots__ = (
        "count",
        "field",
        "keys",
        "kind",
        "lease",
        "lost",
        "lost_reason",
        "next_check",
        "owner",
        "release_id",
        "release_sent_at",
        "renew",
        "scopes",
        "slot",
        "timer",
        "token",
        "valid_until",
    )

    def __init__(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        field: str,
        token: int,
        lease: float,
        renew: bool,
        sent_at: float,
    ) -> None:
        #: the kind that granted it: its scripts release and renew it
        self.kind = kind
        self.keys = keys
        #: the owner id of the task that holds it
        self.owner = owner
        #: the hash field in Redis: unique to this acquisition, so a late or resent
        #: command about an earlier hold can never touch this one
        self.field = field
        self.token = token
        self.count = 1
        self.lease = lease
        self.renew = renew
        #: monotonic time by which the lease has surely ended unless renewed: measured
        #: from before the command was sent, so it errs early, never late
        self.valid_until = sent_at + lease
        #: when the watchdog next asks Redis whether a fixed-lease hold still exists
        self.next_check = sent_at + lease / 3
        #: the Redis Cluster slot of the hold's keys: renewal batches never mix slots
        self.slot = keys.slot
        self.timer: asyncio.TimerHandle | None = None
        self.lost = False
        self.lost_reason = ""
        #: cancel scopes of the ``async with`` bodies running under this hold
        self.scopes: list[CancelScope] = []
        #: the id of a final release sent but not confirmed (reused when it is sent
        #: again), and when it was first sent: Redis remembers it for a while only
        self.release_id: str | None = None
        self.release_sent_at = 0.0

    @property
    def resource(self) -> str:
        """What the hold is a hold on: the key of the kind's main structure."""
        return self.keys.lock

    def __repr__(self) -> str:
        state = "lost" if self.lost else ("renewed" if self.renew else "fixed")
        return f"<Hold {self.keys.name!r} count={self.count} token={self.token} {state}>"


class Attempt(NamedTuple):
    """One try at acquiring: everything a kind's attempt and undo scripts need.

    The outcome types here are named tuples: they are made on every acquisition and
    release, and a tuple is the cheapest immutable record to make."""

    keys: LockKeys
    owner: str
    #: the hash field the grant is recorded under (unique per acquisition)
    field: str
    #: the hold count the owner already has (0 for a new acquisition, n to re-enter)
    before: int
    lease: float
    #: the key that, once set by an undo, makes this attempt a no-op if it runs late
    void: str


class Granted(NamedTuple):
    token: int
    #: the hold count after the attempt (1 for a new acquisition)
    held: int


class Busy(NamedTuple):
    #: seconds the current holder's lease has left (0 if unknown): the longest a waiter
    #: sleeps before trying again, in case the holder crashed
    ttl: float


class Successor(NamedTuple):
    """A local waiter that a final release may hand the resource to in the same script."""

    field: str
    lease: float


class ReleaseStatus(enum.Enum):
    STILL_HELD = "still held"  # a nested release: value = holds left
    RELEASED = "released"  # value = other clients that heard the release message
    HANDED_OVER = "handed over"  # value = the successor's fencing token
    NOT_HELD = "not held"  # Redis no longer had the hold


class Released(NamedTuple):
    status: ReleaseStatus
    value: int


class LockKind(Protocol):
    """What the engine needs from a lock kind (one instance per manager and kind)."""

    #: a short name for messages and statistics ("lock", "semaphore", ...)
    name: str
    #: a task's second acquire re-enters its hold instead of waiting
    reentrant: bool
    #: one grant lets the next local waiter try at once (shared holds)
    shared: bool

    async def attempt(self, attempt: Attempt) -> Granted | Busy: ...

    async def undo(self, attempt: Attempt) -> bool:
        """Revert *attempt* if it ran (True), or make sure it never does (False)."""
        ...

    async def release(
        self,
        hold: Hold,
        count: int,
        release_id: str,
        successor: Successor | None,
        hand_over_freely: bool,
        listening: bool,
    ) -> Released:
        """Release one of *count* holds; the last frees the resource or hands it over.

        *hand_over_freely* allows the hand-over to *successor* even while other clients
        wait; otherwise it happens only if nobody else listens. *listening* says whether
        this manager itself is subscribed to the release channel.
        """
        ...

    async def renew(self, holds: Sequence[Hold], lease: float) -> list[bool]:
        """Renew auto-renewed holds to *lease* and check fixed ones; True where Redis has it.

        The holds share one Redis Cluster slot.
        """
        ...

    async def extend(self, hold: Hold, lease: float) -> bool: ...

    async def force_release(self, keys: LockKeys) -> bool: ...

    def channel(self, keys: LockKeys) -> str:
        """The pub/sub channel on which releases of *keys* are announced."""
        ...
