"""The reentrant lock kind: the whole state of a name in one string, one owner at a time.

The lock's structure ``P:lock:{N}`` (see :mod:`aiolock._keys` for all the keys of a name) is
one string (``state.lua`` has the layout, :mod:`aiolock._kinds.lock.state` reads it in
Python): while held, the owner field
``<manager id>:<task serial>:<acquisition number>`` (unique per acquisition, so a late or
resent command about an earlier hold can never touch a later one), the hold count, the
fencing token, the epoch and the waiter flag, with the lease as its expiry; while free,
the epoch and the last token, kept ``max(fence_ttl, 10 s)``. A resent release is answered
from the epoch (the inverted tombstone), not from a key per release. A final release
publishes the releasing manager's id on ``P:lock:{N}:released`` only if a waiter was seen
(the flag), and never when it hands the lock over. A hold detached for another task or
process to adopt (the kind is ``detachable``: :mod:`aiolock._engine.handoff` runs its
detach, adopt and give-back scripts for ``Lock.detach()``/``adopt()``) has the owner field
``detached:<128 random bits, hex>`` until it is adopted or its lease runs out.

The scripts' reply codes are named in ``codes.lua`` and, in Python, in
:mod:`aiolock._engine.kind` (``AttemptReply``, ``ReleaseReply``, ``ChangeReply``).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiolock._engine.kind import (
    Attempt,
    Busy,
    ChangeReply,
    Granted,
    Hold,
    Released,
    Successor,
    decode_attempt,
    decode_release,
)
from aiolock._engine.kindbase import KindBase
from aiolock._engine.runtime import Runtime
from aiolock._errors import LockKeyTypeError
from aiolock._keys import LockKeys, ms
from aiolock._kinds.lock.state import DEFAULT_KEEP_MS, parse_state
from aiolock._redis.client import as_int, key_type_error
from aiolock._redis.scripts import Script

__all__ = ["DEFAULT_KEEP_MS", "ReentrantLockKind"]

ACQUIRE = Script("_kinds/lock/acquire")
RELEASE = Script("_kinds/lock/release")
RENEW = Script("_kinds/lock/renew")
EXTEND_BY = Script("_kinds/lock/extend_by")
UNDO = Script("_kinds/lock/undo")
PROBE = Script("_kinds/lock/probe")
LEASE_LEFT = Script("_kinds/lock/lease_left", writes=False)
FORCE_RELEASE = Script("_kinds/lock/force_release")
DETACH = Script("_kinds/lock/detach")
ADOPT = Script("_kinds/lock/adopt")
GIVE_BACK = Script("_kinds/lock/give_back")
KEEP_TURN = Script("_kinds/lock/keep_turn")
LISTEN = Script("_kinds/lock/listen")

#: Seconds a manager's turn lasts in Redis unrefreshed (refreshed every third of it while
#: the manager waits): see turns.lua
TURN_TTL = 1.5


class ReentrantLockKind(KindBase):
    """Scripts and reply decoding of the reentrant lock; everything else is the engine's."""

    name = "lock"
    renew_script = RENEW
    extend_by_script = EXTEND_BY
    reentrant = True
    hand_over = True
    registers_listeners = True
    #: its holds can be handed to another task or process: one owner field per hold, so
    #: renaming the field moves the whole ownership (detach, adopt, give_back below)
    detachable = True
    #: a resent release is answered from the state's epoch (module docstring): no id
    release_tombstones = False
    #: starving managers take turns (turns.lua); an entry lasts this long unrefreshed: the
    #: longest a manager that died waiting can keep a free lock from the others
    turns = True
    claim_ttl = TURN_TTL

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._client = runtime.client
        #: how long a free state (the epoch and the last token) is kept: the fence state's
        #: lifetime, and at least the 10 s a resent release is answered for
        self._keep_ms = (
            "-1"
            if runtime.fence_ms == "-1"
            else str(max(int(runtime.fence_ms), runtime.tombstone_ms))
        )
        #: how this manager's owner fields begin: the scripts read a manager id argument left
        #: out as the field's part before its first ':' (one argument less each)
        self._own = f"{runtime.manager_id}:"
        #: the last lease an attempt sent and its ms (the manager's, nearly always): ms()
        #: is a Python call, not worth making per attempt
        self._lease_ms = (runtime.lease, ms(runtime.lease))

    async def attempt(self, attempt: Attempt) -> Granted | Busy:
        keys = attempt.keys
        field = attempt.field
        lease, lease_ms = self._lease_ms
        if attempt.lease != lease:
            lease, lease_ms = self._lease_ms = (attempt.lease, ms(attempt.lease))
        args: tuple[str | int, ...] = (field, lease_ms)
        # ARGV[3..4] (the hold count before, the manager id) only when the script cannot
        # take them as 0 and the field's beginning: every argument costs the server a Lua
        # string
        if attempt.turn:
            args += (attempt.before, self._rt.manager_id, attempt.turn)
        elif attempt.before or not field.startswith(self._own):
            args += (attempt.before, self._rt.manager_id)
        reply = await self._client.run(ACQUIRE, (keys.lock, attempt.void, keys.turns), args)
        return decode_attempt(reply, keys.lock)

    async def refresh_claims(self, keys: LockKeys, fields: Sequence[str]) -> None:
        # The fields are manager ids: this manager's own, once per name
        for manager in fields:
            await self._client.run(KEEP_TURN, (keys.turns,), (ms(self.claim_ttl), manager))

    async def leave_turn(self, keys: LockKeys) -> None:
        await self._client.run(KEEP_TURN, (keys.turns,), (0, self._rt.manager_id))

    async def register_listeners(self, writes: Sequence[tuple[LockKeys, float]]) -> None:
        await self._client.run(
            LISTEN,
            [keys.part("listeners") for keys, _ in writes],
            [self._rt.manager_id, *(ms(ttl) if ttl > 0 else 0 for _, ttl in writes)],
        )

    async def still_held(self, keys: LockKeys) -> float | None:
        # The state is held exactly while someone holds it, and every release, undo and
        # force release that frees it publishes if a waiter was seen (the flag the probe
        # sets, as a busy attempt does): only an ended lease (or an outside deletion)
        # frees it without a message, and then the probe answers -2. While a hold exists
        # with a TTL, an attempt would answer Busy with this very PTTL (a waiter's field
        # is new for each acquisition, so it is never the holder's): the probe skips only
        # the attempt's work, never a grant. It also sets the waiter flag on the hold it
        # finds, which may be a new holder's after a lease ran out (the flag went with the
        # old hold): else that holder's release would not publish.
        pttl = as_int(await self._client.run(PROBE, (keys.lock,), (self._rt.manager_id,)))
        return pttl / 1000 if pttl > 0 else None

    async def hold_count(self, keys: LockKeys, hold: Hold | None) -> int | None:
        state = await self.state(keys)
        if hold is None or state is None or state[0] != hold.field:
            return 0
        return state[1]

    async def locked(self, keys: LockKeys) -> bool:
        """Whether anyone holds the lock: a held state, or a key aiolock did not write
        (someone else's value, of any type, occupies the name)."""
        try:
            raw = await self._client.call("GET", keys.lock, key=keys.lock)
        except LockKeyTypeError:
            return True
        if raw is None:
            return False
        state = parse_state(raw)
        return state is None or not state.free

    async def lease_left(self, keys: LockKeys) -> int:
        """The holder's lease left in ms (-1: no expiry; -2: nobody holds the lock): the
        state outlives its holds (it keeps the epoch and the last token), so not its PTTL."""
        return as_int(await self._client.run(LEASE_LEFT, (keys.lock,), ()))

    async def state(self, keys: LockKeys) -> tuple[str, int] | None:
        """``(owner field, hold count)`` of the current hold, or None if the lock is free;
        a key of another type, or a string aiolock did not write, raises
        :class:`~aiolock.LockKeyTypeError`."""
        raw = await self._client.call("GET", keys.lock, key=keys.lock)
        if raw is None:
            return None
        state = parse_state(raw)
        if state is None:
            raise key_type_error(keys.lock, "string")  # a value aiolock did not write
        return None if state.free else (state.field, state.holds)

    async def undo(self, attempt: Attempt) -> bool:
        keys = attempt.keys
        void_ms = attempt.void_ms
        undone = await self._client.run(
            UNDO,
            (keys.lock, attempt.void),
            (
                attempt.field,
                attempt.before,
                void_ms,
                keys.channel,
                self._rt.manager_id,
                self._keep_ms,
            ),
        )
        return as_int(undone) == 1

    async def release(
        self,
        hold: Hold,
        count: int,
        release_id: str,
        successor: Successor | None,
        hand_over_freely: bool,
        listening: bool,
    ) -> Released:
        keys = hold.keys
        field, token = hold.field, hold.token
        # ARGV[1]: how the held state begins (field, one hold, token; the layout of
        # aiolock._kinds.lock.state, spelled out here: it is on every release's path), so
        # that the script's common path compares it as sent instead of building it
        args: tuple[str | int, ...] = (f"{field}|1|{token}|", token)
        # ARGV[3..9] only when they say something (the script reads them missing as
        # DEFAULT_KEEP_MS, 1, the field's beginning, '', '0', '0', '0'): every argument costs
        # the server a Lua string, and a final release with nobody to hand over to sends 2,
        # or 3 with a fence_ttl other than the default
        keep = self._keep_ms
        if successor is not None:
            args += (keep, count, self._rt.manager_id, successor.field, ms(successor.lease),
                     1 if hand_over_freely else 0, 1 if listening else 0)  # fmt: skip
        elif listening:
            args += (keep, count, self._rt.manager_id, "", 0, 0, 1)
        elif count != 1 or not field.startswith(self._own):
            args += (keep, count, self._rt.manager_id)
        elif keep != DEFAULT_KEEP_MS:
            args += (keep,)
        # The turns only where the lock could be handed over (release.lua reads them then)
        reply = await self._client.run(
            RELEASE, (keys.lock,) if successor is None else (keys.lock, keys.turns), args
        )
        return decode_release(reply, keys.lock)

    async def force_release(self, keys: LockKeys) -> bool:
        code, value = await self._client.run(
            FORCE_RELEASE, (keys.lock,), (keys.channel, self._rt.manager_id, self._keep_ms)
        )
        if as_int(code) == ChangeReply.BAD_KEY:
            raise key_type_error(keys.lock, value)
        return as_int(code) == ChangeReply.DONE

    async def detach(self, hold: Hold, detached: str, lease: float) -> bool:
        """Move *hold* to the field *detached* for *lease* s; False if Redis no longer had it."""
        keys = hold.keys
        code, value = await self._client.run(
            DETACH, (keys.lock,), (hold.field, detached, ms(lease))
        )
        if as_int(code) == ChangeReply.BAD_KEY:
            raise key_type_error(keys.lock, value)
        return as_int(code) == ChangeReply.DONE

    async def adopt(
        self, keys: LockKeys, detached: str, field: str, lease: float, void: str
    ) -> tuple[bool, int]:
        """Move the hold of field *detached* to *field* with a lease of *lease* s, unless
        the adoption's void marker *void* is set: (True, 0), or (False, the lock's PTTL
        in ms; -2 free, or voided: only a resend after the give-back sees that)."""
        code, value = await self._client.run(ADOPT, (keys.lock, void), (detached, field, ms(lease)))
        if as_int(code) == ChangeReply.BAD_KEY:
            raise key_type_error(keys.lock, value)
        if as_int(code) == ChangeReply.VOIDED:
            return False, -2
        return as_int(code) == ChangeReply.DONE, as_int(value)

    async def give_back(
        self, keys: LockKeys, field: str, detached: str, void: str, void_ms: int
    ) -> bool:
        """Undo an adoption into *field*: set its void marker *void* for *void_ms* ms,
        and move the hold back to *detached* if the adoption ran; whether it had."""
        code, value = await self._client.run(
            GIVE_BACK, (keys.lock, void), (field, detached, void_ms)
        )
        if as_int(code) == ChangeReply.BAD_KEY:
            raise key_type_error(keys.lock, value)
        return as_int(code) == ChangeReply.DONE
