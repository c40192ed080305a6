"""Hand-off: detach a held lock into a token that another task or process adopts.

Ownership in aiolock is per asyncio task (the hold is the field
``<manager id>:<serial>:<number>``), so a lock taken in a request handler cannot simply
be released by a background task or another process. A hand-off moves it explicitly:

* :func:`detach` renames the owner's field, in one script, to a fresh field
  ``detached:<128 random bits>`` and sets the lock's lease to the detach lease; the
  local hold leaves the registry (no renewal, no loss reports, no release when its task
  ends). The token names that field; whoever holds the token may adopt the lock. An
  abandoned token is bounded by the detach lease: nobody renews a detached field.
* :func:`adopt` renames the detached field, in one script, to a field of the adopting
  task iff it is still there, so a token is adopted once; the hold is then registered
  like a fresh acquisition (renewed, loss-checked, released when its task ends). An
  adoption cancelled or cut off in flight is given back (renamed back, if it ran) by a
  script that also leaves the adoption's void marker, so an adoption that lands after
  its give-back does nothing: the token stays adoptable.

The fencing token travels in the token: the hold keeps the token it was granted, and
the fence rule of the next acquisition is unchanged.

What happens here around the scripts is the engine's (the registry, the observers, the
give-back retried in the background); the scripts are the kind's, through the seam: a
kind that is ``detachable`` (:mod:`aiolock._engine.kind`) runs them. Only the plain
reentrant lock of aiolock's own wire format is (one field per owner, so a rename moves the
whole ownership: ``aiolock/_kinds/lock/``); :class:`~aiolock.Lock` refuses the hand-off for
every other kind (:func:`refused`, or a WireFormatError for a plain Lock of another format),
once it has checked the arguments, the token with :class:`HandoffToken`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import secrets
import time
from typing import TYPE_CHECKING, NamedTuple

from aiolock._engine.cleanup import finish_despite_cancel, send_or
from aiolock._engine.kind import Hold, void_ttl_ms
from aiolock._errors import (
    LockConnectionError,
    LockError,
    LockHandoffError,
    LockKeyTypeError,
    LockLostError,
)

if TYPE_CHECKING:
    from aiolock._engine.engine import Engine
    from aiolock._engine.kind import LockKind
    from aiolock._keys import LockKeys

__all__ = ["DETACHED", "SUPPORTED", "HandoffToken", "adopt", "detach", "refused"]

#: The start of a detached hold's field (and of nothing else: owner fields start with a
#: manager id, 32 hex digits).
DETACHED = "detached:"
#: The start of every token: the format's name and version.
_MAGIC = "aiolock-hold-1."

#: What supports a hand-off, for the errors of the handles that do not.
SUPPORTED = (
    "only a plain Lock of aiolock's own wire format can be detached and adopted "
    "(LockManager.lock(name), wire='aiolock')"
)


def refused(what: str) -> LockError:
    """*what* (``FairLock 'x'``) is a handle that cannot be handed off."""
    return LockError(f"{what} cannot be handed off: {SUPPORTED}")


class HandoffToken(NamedTuple):
    """What a token carries: the lock's key, the detached field and the fencing token."""

    key: str
    field: str
    fence: int

    def encode(self) -> str:
        """Text safe in argv, environment variables, URLs and HTTP headers."""
        raw = json.dumps([self.key, self.field, self.fence], separators=(",", ":"))
        return _MAGIC + base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, token: object) -> HandoffToken:
        """The token *token*, or a ValueError/TypeError saying what is wrong with it."""
        if not isinstance(token, str):
            kind = type(token).__name__
            raise TypeError(f"a hand-off token is a str (from Lock.detach()), not {kind}")
        bad = ValueError(
            f"not a hand-off token made by Lock.detach(): {token[:40]!r}"
            + ("…" if len(token) > 40 else "")
        )
        if not token.startswith(_MAGIC):
            raise bad
        body = token[len(_MAGIC) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            key, field, fence = json.loads(raw.decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError, TypeError):
            raise bad from None
        if not (
            isinstance(key, str)
            and isinstance(field, str)
            and field.startswith(DETACHED)
            and isinstance(fence, int)
            and not isinstance(fence, bool)
        ):
            raise bad
        return cls(key, field, fence)


# -- detach ------------------------------------------------------------------------------


async def detach(engine: Engine, hold: Hold, lease: float) -> str:
    """Detach *hold* (the current task's, counted once; its kind is ``detachable``) for
    *lease* s; the token."""
    kind = hold.kind
    registry = engine.registry
    name = hold.keys.name
    if hold.count > 1:
        raise LockError(
            f"lock {name!r} is held {hold.count} times by this task (re-entered); only a "
            "hold counted once can be detached. Release the inner holds first (leave the "
            "inner 'async with' blocks)"
        )
    if not registry.alive(hold):
        registry.forget_lost(hold)  # reported right here
        raise LockLostError(
            f"lock {name!r} was lost before it could be detached ({hold.lost_reason}); "
            "there is nothing to hand over"
        )
    field = DETACHED + secrets.token_hex(16)
    # From here the hold is not this task's: the watchdog neither renews it nor reports
    # its field gone (which the rename makes it), and the task's end does not release it.
    registry.remove(hold)
    outcome: list[bool] = []

    async def send() -> None:
        outcome.append(await kind.detach(hold, field, lease))

    try:
        await finish_despite_cancel(send)  # a detach that ran must not be left unknown
    except asyncio.CancelledError:
        _cancelled_detach(engine, kind, hold, field, lease, outcome)
        raise
    except LockConnectionError as exc:
        registry.add(hold)  # unknown: the watchdog tells (renewed, or reported lost)
        raise LockConnectionError(
            f"the detach of lock {name!r} was not confirmed ({exc}); the task still counts "
            "as holding it. If the detach did run, the hold is reported lost and the lock "
            "is freed by its lease"
        ) from exc
    except LockKeyTypeError:
        registry.add(hold)
        registry.lose_reported(hold, "its key was replaced by a value of another type")
        raise
    except LockError:  # refused (an ACL): it did not run
        registry.add(hold)
        raise
    if not outcome[0]:
        registry.add(hold)
        registry.lose_reported(hold, "Redis no longer had it when it was detached")
        raise LockLostError(
            f"lock {name!r} could not be detached: its lease had already ended or it was "
            "force-released, so another owner may have entered the critical section"
        )
    engine.ended(hold)  # for the observers, this task's hold ends here
    # A local waiter sleeps while this task holds (its release would wake it): the hold
    # is not this manager's any more, so it tries now, and its attempt marks the lock as
    # waited for, so that the adopter's release publishes (robustness finding R1).
    engine.hub.wake(hold.keys.channel)
    return HandoffToken(hold.keys.lock, field, hold.token).encode()


def _cancelled_detach(
    engine: Engine,
    kind: LockKind,
    hold: Hold,
    field: str,
    lease: float,
    outcome: list[bool],
) -> None:
    """The detaching task was cancelled: nobody will get the token, so give the lock back.

    Detached: the detached field is released in the background. Not held: nothing to do.
    Unknown (the command failed): the hold is registered again, and its task's end
    releases it (or the watchdog reports it gone).
    """
    if not outcome:
        engine.registry.add(hold)
    elif outcome[0]:
        engine.ended(hold)
        stray = Hold(kind, hold.keys, "", field, hold.token, lease, False, time.monotonic())
        engine.release_lost(stray)


# -- adopt -------------------------------------------------------------------------------


async def adopt(
    engine: Engine,
    kind: LockKind,
    keys: LockKeys,
    owner: str,
    token: HandoffToken,
    lease: float | None,
) -> Hold:
    """Make the detached hold *token* names the hold of *owner* (the current task)."""
    if engine.hub.closed:
        raise engine.manager_closed()
    if engine.registry.get(kind.resource(keys), owner) is not None:
        raise LockError(
            f"this task already holds lock {keys.name!r}, so the token cannot name a hold "
            "of it that is still adoptable; a task adopts a lock it does not hold"
        )
    rt = engine.rt
    lease_s = rt.lease if lease is None else lease
    number = rt.next_id()
    field = kind.hold_field(owner, number)
    # The adoption's void marker, as an acquire attempt's: its id is unique across clients.
    void = keys.void(f"{rt.manager_id}:{number}")
    sent_at = time.monotonic()
    try:
        adopted, pttl = await kind.adopt(keys, token.field, field, lease_s, void)
    except (LockConnectionError, asyncio.CancelledError):
        await _give_back(engine, kind, keys, token, field, void, lease_s)  # it may have run
        raise
    if not adopted:
        raise LockHandoffError(_not_adoptable(keys.name, pttl))
    hold = Hold(kind, keys, owner, field, token.fence, lease_s, lease is None, sent_at)
    if engine.hub.closed:  # the manager closed while the script was in flight
        await engine.release_quietly(hold)
        raise engine.manager_closed()
    engine.adopt(hold)  # registered like a fresh acquisition: renewed, loss-checked
    if engine.observers.active:
        hold.observed_at = time.monotonic()
        engine.observers.acquired(kind.name, keys.name, 0.0, hold.token)
    return hold


def _not_adoptable(name: str, pttl: int) -> str:
    if pttl == -2:
        now = "the lock is free now: the detached lease ran out, or it was adopted and released"
    else:
        now = "another owner holds it now: it was adopted already, or it expired and was taken"
    return (
        f"the hand-off token of lock {name!r} cannot be adopted: {now}. A token is adopted "
        "once, and only before the lease given to detach() runs out"
    )


async def _give_back(
    engine: Engine,
    kind: LockKind,
    keys: LockKeys,
    token: HandoffToken,
    field: str,
    void: str,
    lease: float,
) -> None:
    """An adoption cancelled or failed in flight: if it ran, rename the field back, so
    the token stays adoptable (lease untouched).

    The give-back goes out on another connection than the adoption (whose connection a
    cancellation closes), so Redis may run it while the adoption is still on its way:
    it leaves the adoption's void marker *void*, and the adoption does nothing when it
    lands (the rule of every compensation: docs/reliability.md).
    """
    void_ms = void_ttl_ms(lease)

    async def send() -> None:
        await kind.give_back(keys, field, token.field, void, void_ms)

    def retry_later() -> None:
        give_up_at = time.monotonic() + lease
        engine.cleanup.add(f"give-back of an adoption of {keys.name!r}", send, give_up_at)

    engine.cleanup.begin()  # closing waits for it
    try:
        await finish_despite_cancel(lambda: send_or(send, retry_later))
    finally:
        engine.cleanup.end()
