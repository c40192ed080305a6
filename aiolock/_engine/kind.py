"""The seam between the engine and the lock kinds: what a kind provides, and what it grants.

The engine (:mod:`aiolock._engine.engine`) owns everything generic: local queues, waiting on
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
* :meth:`~LockKind.register_listeners` (kinds with ``registers_listeners``): register
  this manager as a listener of a batch of locks that share one slot, for ``aiolock show``;
* its flags: :attr:`~LockKind.reentrant` (a task's second acquire re-enters its
  hold), :attr:`~LockKind.shared` (one grant lets the next local waiter try at once),
  :attr:`~LockKind.hand_over` (its release can hand the resource to a local successor
  in the same call), :attr:`~LockKind.claims` (a waiter registers in Redis under one
  field for its whole wait, kept alive by :meth:`~LockKind.refresh_claims`, withdrawn
  by undo), :attr:`~LockKind.queued` (Redis keeps the waiters' order: every local
  waiter tries at once, and a release message names the one it was granted to),
  :attr:`~LockKind.detachable` (a hold can be handed to another task or process:
  :meth:`~LockKind.detach`, :meth:`~LockKind.adopt` and :meth:`~LockKind.give_back`,
  which :mod:`aiolock._engine.handoff` drives for ``Lock.detach()`` and ``Lock.adopt()``);
* :meth:`~LockKind.lease_left`: the lease left of a name's structure, for ``ttl()``.

A kind announces its releases on its keys' :attr:`~aiolock._keys.LockKeys.channel`
(Redisson's format gives its keys its own name for it).
:class:`~aiolock._engine.kindbase.KindBase` gives the defaults; a kind overrides what
differs.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from aiolock._keys import ms
from aiolock._redis.reply import as_int
from aiolock._redis.translate import key_type_error

if TYPE_CHECKING:
    from aiolock._keys import LockKeys
    from aiolock._redis.scripts import Script

__all__ = [
    "Attempt",
    "AttemptReply",
    "Busy",
    "ChangeReply",
    "Granted",
    "Hold",
    "LockKind",
    "ReleaseReply",
    "ReleaseStatus",
    "Released",
    "Successor",
    "busy_for",
    "decode_attempt",
    "decode_release",
    "new_tuple",
    "void_ttl_ms",
]


class Hold:
    """One grant of one kind to one owner task: the registry's unit."""

    __slots__ = (
        "count",
        "field",
        "granted_at",
        "heeded",
        "keys",
        "kind",
        "lease",
        "limit",
        "lost",
        "lost_reason",
        "next_check",
        "observed_at",
        "owner",
        "permits",
        "release_id",
        "release_sent_at",
        "renew",
        "resource",
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
        permits: int = 1,
    ) -> None:
        #: the kind that granted it: its scripts release and renew it
        self.kind = kind
        self.keys = keys
        #: what the hold is a hold on, for the registry: the key of the kind's structure
        #: (two kinds on one structure, such as the read and write sides of a read-write
        #: lock, give distinct resources)
        self.resource = keys.lock if kind.resource_is_key else kind.resource(keys)
        #: how much of the resource it holds (a semaphore's permits; 1 otherwise)
        self.permits = permits
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
        #: when its attempt was sent: the start of the hold, for its length
        self.granted_at = sent_at
        #: when the watchdog next asks Redis whether a fixed-lease hold still exists
        self.next_check = sent_at + lease / 3
        #: the Redis Cluster slot of the hold's keys: renewal batches never mix slots
        self.slot = keys.slot
        self.timer: asyncio.TimerHandle | None = None
        #: the timer that ends it when it has been held for its max_hold (None if none)
        self.limit: asyncio.TimerHandle | None = None
        #: whether the manager listens on its lock's release channel for it (see
        #: aiolock._engine.heed): the registry tells when it ends
        self.heeded = False
        self.lost = False
        self.lost_reason = ""
        #: the ``async with`` blocks running under this hold: a loss cancels each
        #: (aiolock._engine.guard's blocks; anything with a cancel() method)
        self.scopes: list[Cancellable] = []
        #: the id of a final release sent but not confirmed (reused when it is sent
        #: again), and when it was first sent: Redis remembers it for a while only
        self.release_id: str | None = None
        self.release_sent_at = 0.0
        #: when the observers were told it was acquired; None once they were told it
        #: ended, or if they never heard of it (see aiolock._observe)
        self.observed_at: float | None = None

    def __repr__(self) -> str:
        state = "lost" if self.lost else ("renewed" if self.renew else "fixed")
        return f"<Hold {self.keys.name!r} count={self.count} token={self.token} {state}>"


#: A void marker outlives any plausible delay of the attempt it voids.
MIN_VOID_TTL = 60.0


def void_ttl_ms(lease: float) -> int:
    """How long a compensation keeps the void marker of an attempt of *lease* s, in ms:
    twice the lease, and at least :data:`MIN_VOID_TTL`, so a delayed attempt never runs
    after the marker expired."""
    return ms(max(2 * lease, MIN_VOID_TTL))


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
    #: how much of the resource is asked for (a semaphore's permits; 1 otherwise)
    permits: int = 1
    #: kinds with claims: register (or keep) the waiter's claim if the attempt finds the
    #: resource busy. False for a single attempt (``timeout=0``), which will not wait.
    claim: bool = True
    #: kinds with turns: ask for this manager's turn for so many ms (0: do not ask); see
    #: :mod:`aiolock._engine.turns`
    turn: int = 0

    @property
    def void_ms(self) -> int:
        """How long an undo keeps this attempt's void marker, in ms: twice the lease, and
        at least :data:`MIN_VOID_TTL`, so a delayed attempt never runs after it expired."""
        return void_ttl_ms(self.lease)


#: Makes a named tuple from a tuple of its fields: ``new_tuple(Granted, (token, 1))`` is
#: ``Granted(token, 1)`` without the named tuple's constructor, a Python function (the
#: hot path makes one outcome and one attempt per acquisition).
new_tuple = tuple.__new__


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


class AttemptReply(enum.IntEnum):
    """The codes of an acquire script's ``{code, value}`` reply, shared by the lock, the
    fair lock and the read-write lock (the lock and the fair lock answer their common
    path with a bare token instead). Lua names them in ``aiolock/_kinds/lock/codes.lua``;
    a test checks that the names and numbers match."""

    ACQUIRED = 1  # value: the new fencing token
    REENTERED = 2  # value: the new hold count
    BUSY = 0  # value: the holder's lease left in ms
    VOIDED = 3  # an undo came first: nothing done
    BAD_KEY = -1  # value: the type of the key that holds another type


class ReleaseReply(enum.IntEnum):
    """A release script's codes (the same kinds; a bare listener count on the common path)."""

    STILL_HELD = 1  # value: holds left
    RELEASED = 2  # a resend of a final release: value 0
    HANDED_OVER = 4  # value: the successor's fencing token
    NOT_HELD = 0
    BAD_KEY = -1


class ChangeReply(enum.IntEnum):
    """The codes of the lock's detach, adopt, give back and force release (``codes.lua``)."""

    DONE = 1
    NOT_DONE = 0
    VOIDED = 3
    BAD_KEY = -1


#: The codes as plain ints for the decoders below, which run on every attempt and release
ACQUIRED, REENTERED, BUSY, VOIDED, BAD_KEY = (int(code) for code in AttemptReply)
_RELEASE_CODES = {
    int(ReleaseReply.STILL_HELD): ReleaseStatus.STILL_HELD,
    int(ReleaseReply.RELEASED): ReleaseStatus.RELEASED,
    int(ReleaseReply.HANDED_OVER): ReleaseStatus.HANDED_OVER,
    int(ReleaseReply.NOT_HELD): ReleaseStatus.NOT_HELD,
}

#: Makes the error for a ``{-1, ...}`` reply: a key of the structure holds another type.
#: Or the key itself (a str), whose :func:`~aiolock._redis.translate.key_type_error` names
#: the type in the reply: what most kinds pass, with no function made per call (a
#: closure per attempt and release was one more object and call on every cycle).
BadKey = Callable[[Sequence[Any]], Exception] | str


def _bad_key(bad_key: BadKey, reply: Sequence[Any]) -> Exception:
    """The error of a ``{-1, type}`` reply, as *bad_key* says."""
    if isinstance(bad_key, str):
        return key_type_error(bad_key, reply[1])
    return bad_key(reply)


def decode_attempt(reply: Any, bad_key: BadKey) -> Granted | Busy:
    """An acquire script's reply as :class:`Granted` or :class:`Busy`.

    ``{ACQUIRED, token}`` (or a bare token), ``{REENTERED, holds}``, ``{BUSY, pttl ms}``,
    ``{VOIDED, _}`` (only an attempt resent after its own undo sees it: busy, no ttl), or
    ``{BAD_KEY, ...}``, which raises what *bad_key* makes of the reply.
    """
    if isinstance(reply, int):  # the common path: acquired, this is the token
        return new_tuple(Granted, (reply, 1))
    code, value = as_int(reply[0]), reply[1]
    if code == ACQUIRED:
        return Granted(as_int(value), 1)
    if code == REENTERED:
        return Granted(0, as_int(value))
    if code == BAD_KEY:
        raise _bad_key(bad_key, reply)
    return busy_for(as_int(value)) if code == BUSY else Busy(0.0)


def busy_for(pttl: int) -> Busy:
    """:class:`Busy` for a holder whose lease ends in *pttl* ms (PTTL's answer).

    PTTL says 0 when under a millisecond is left: that is "try again in a moment", not
    "unknown" (which makes a waiter sleep a whole lease unless woken, and a crashed holder
    never wakes it). Negative answers (no expiry, no key) are unknown.
    """
    if pttl < 0:
        return Busy(0.0)
    return Busy(max(pttl, 1) / 1000)


#: The common release outcomes, made once: released, heard by no one or a few others.
_RELEASED = tuple(Released(ReleaseStatus.RELEASED, heard) for heard in range(8))


def decode_release(reply: Any, bad_key: BadKey) -> Released:
    """A release script's reply (see the codes above; a bare int: released, heard by n)."""
    if isinstance(reply, int):  # the common path: released, heard by this many others
        return _RELEASED[reply] if 0 <= reply < 8 else Released(ReleaseStatus.RELEASED, reply)
    status = _RELEASE_CODES.get(as_int(reply[0]))
    if status is None:  # -1: a key holds another type
        raise _bad_key(bad_key, reply)
    return Released(status, max(as_int(reply[1]), 0))


class Cancellable(Protocol):
    """What a hold cancels when it is lost: the body of an ``async with`` block."""

    def cancel(self) -> object: ...


class LockKind(Protocol):
    """What the engine needs from a lock kind (one instance per manager and kind)."""

    #: a short name for messages and statistics ("lock", "semaphore", ...)
    name: str
    #: a task's second acquire re-enters its hold instead of waiting
    reentrant: bool
    #: one grant lets the next local waiter try at once (shared holds)
    shared: bool
    #: release() may hand the resource to a local successor in the same script
    hand_over: bool
    #: waiters register in Redis; see the module docstring
    claims: bool
    #: Redis keeps the waiters' order; see the module docstring
    queued: bool
    #: seconds a waiter's registration lasts in Redis unless refreshed
    claim_ttl: float
    #: a manager starving for a lock may ask for a turn (:mod:`aiolock._engine.turns`);
    #: its turn is then refreshed as claims are, under the manager's id as the field
    turns: bool
    #: holds per renewal call: as many as stay under a millisecond of Redis time
    #: (measured per kind; see aiolock._engine.watchdog)
    renew_batch: int
    #: why this kind's holds have no fencing token ("" if they have one): the message of
    #: the WireFormatError that ``fencing_token`` raises
    fencing_unavailable: str
    #: its release messages do not name the releasing client (a foreign client's wire
    #: format): this manager cannot tell its own releases from others', so a message
    #: wakes the local head but never ends a yield to other clients (see aiolock._engine.hub)
    anonymous_messages: bool
    #: a manager whose waiters found the lock busy registers itself as a listener in
    #: Redis (:meth:`register_listeners`), for ``aiolock show``: a plain lock, whose
    #: waiters are otherwise kept nowhere in Redis (see aiolock._engine.listeners)
    registers_listeners: bool
    #: a hold can be detached and adopted by another task or process (``Lock.detach()``,
    #: ``Lock.adopt()``): the kind runs :meth:`detach`, :meth:`adopt` and
    #: :meth:`give_back`; a handle of any other kind refuses the hand-off
    detachable: bool
    #: its final release names a tombstone by the release id it is given (unique across
    #: clients), so that a resent release answers as the first did; a kind that needs no
    #: such key (the reentrant lock answers a resend from its epoch) is given a
    #: placeholder instead of a new id on every release
    release_tombstones: bool

    def hold_field(self, owner: str, number: int) -> str:
        """The field a new hold of *owner* is recorded under; *number* is unique in the
        manager, so the field is unique per acquisition."""
        ...

    #: whether resource(keys) is ``keys.lock`` (read inline on the hot path)
    resource_is_key: bool

    def resource(self, keys: LockKeys) -> str:
        """The registry's name for holds of this kind on *keys* (see :attr:`Hold.resource`)."""
        ...

    def timeout_error(self, keys: LockKeys, timeout: float | None, permits: int) -> Exception:
        """The error for a wait that ran out (a :class:`~aiolock.LockTimeoutError`)."""
        ...

    async def refresh_claims(self, keys: LockKeys, fields: Sequence[str]) -> None:
        """Kinds with claims: extend these live waiters' registrations by ``claim_ttl``."""
        ...

    async def leave_turn(self, keys: LockKeys) -> None:
        """Kinds with turns: give up this manager's turn for *keys* (its waiters left)."""
        ...

    async def register_listeners(self, writes: Sequence[tuple[LockKeys, float]]) -> None:
        """Kinds that register listeners: for each ``(keys, ttl)``, this manager listens
        for *keys* for *ttl* s more (refreshed while it does); ``0`` withdraws the
        registration. One script call for all: the caller keeps the batch small (and, on
        Redis Cluster, of one slot)."""
        ...

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
        wait; otherwise it happens only if nobody else listens (without a successor it
        means nothing and is False). *listening* says whether
        this manager itself is subscribed to the release channel.
        """
        ...

    async def renew(self, holds: Sequence[Hold], lease: float) -> list[bool]:
        """Renew auto-renewed holds to *lease* and check fixed ones; True where Redis has it.

        The holds share one Redis Cluster slot.
        """
        ...

    async def extend(self, hold: Hold, lease: float) -> bool: ...

    async def extend_by(self, hold: Hold, additional: float) -> float | None:
        """Add *additional* s to the hold's lease left on the server, in one step; the
        lease left after it (s), or None if Redis no longer has the hold. Raises
        :class:`LockError` if the kind cannot add to a lease."""
        ...

    async def force_release(self, keys: LockKeys) -> bool: ...

    async def hold_count(self, keys: LockKeys, hold: Hold | None) -> int | None:
        """The current task's hold count per Redis (*hold*: its hold, if any), or None
        if it is the hold's field in the kind's hash, which the handle then reads."""
        ...

    async def locked(self, keys: LockKeys) -> bool:
        """Whether anyone holds *keys* (or a key of another type occupies the name)."""
        ...

    async def still_held(self, keys: LockKeys) -> float | None:
        """Seconds left of the lease of whoever holds *keys*, by one cheap read, or None
        if it may be free (or the kind cannot tell without an attempt).

        Only a kind whose every way of freeing publishes on its channel, except its
        lease ending, may answer (see the engine's quiet waits)."""
        ...

    async def lease_left(self, keys: LockKeys) -> int:
        """The lease left of whoever holds *keys*, in ms, as PTTL answers: -2 if nobody
        holds it, -1 if it never expires."""
        ...

    async def detach(self, hold: Hold, detached: str, lease: float) -> bool:
        """Detachable kinds: move *hold* to the field *detached* for *lease* s; False if
        Redis no longer had it."""
        ...

    async def adopt(
        self, keys: LockKeys, detached: str, field: str, lease: float, void: str
    ) -> tuple[bool, int]:
        """Detachable kinds: move the hold of field *detached* to *field* with a lease of
        *lease* s, unless the adoption's void marker *void* is set: (True, 0), or (False,
        the lock's PTTL in ms; -2 if free, or if voided)."""
        ...

    async def give_back(
        self, keys: LockKeys, field: str, detached: str, void: str, void_ms: int
    ) -> bool:
        """Detachable kinds: undo an adoption into *field* (set its void marker *void* for
        *void_ms* ms, and move the hold back to *detached* if the adoption ran); whether
        it had."""
        ...


class ScriptRunner(Protocol):
    """What a kind sends its scripts through (the manager's client, single node or
    cluster); a protocol, so that a kind works on either without knowing which."""

    def run(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Awaitable[Any]: ...

    def run_in_order(
        self, script: Script, keys: Sequence[str], args: Sequence[Any]
    ) -> Awaitable[Any]: ...

    async def call(self, *args: Any, key: str | None = None) -> Any: ...
