"""The token lock kind (``wire="token"``): a lock shared with ``SET NX PX`` token clients.

The lock is a string at the lock name ``N`` itself, holding its holder's token, set with
the equivalent of ``SET N <token> NX PX <lease>`` and deleted by compare-and-delete:
the layout of redis-py's ``Lock`` and of the ``SET NX`` + Lua recipe, so such clients
and aiolock exclude each other on one name. ``docs/wire-token.md`` is the contract.

aiolock's tokens are ``aiolock:{<prefix>}:<owner field>``: unique per acquisition (the
owner field is), unguessable (it starts with the manager's 128 random bits), and
recognisable, which tells a waiter whether the holder will announce its release. An
aiolock holder publishes its manager id on ``P:token:{N}:released`` (see
:func:`~aiolock._formats.foreign.aux_base`); while another client holds the lock, which
never publishes, the waiter polls with a bounded backoff
(:class:`~aiolock._formats.foreign.PollBackoff`).

Re-entry is counted in the process (the string has no count): re-entering and a nested
release only check that the token is still there; the final release deletes it.
"""

from __future__ import annotations

from typing import Any

from aiolock._engine.kind import Attempt, Busy, Granted, Hold
from aiolock._engine.runtime import Runtime
from aiolock._formats.foreign import ForeignKeys, PollBackoff, StringKindBase, string_type_error
from aiolock._keys import TOKEN_TAG, LockKeys, ms
from aiolock._redis.client import as_int, as_text
from aiolock._redis.scripts import Script

__all__ = ["TokenLockKind", "token_keys"]

ACQUIRE = Script("_formats/token/acquire")
RELEASE = Script("_formats/token/release")
RENEW = Script("_formats/token/renew")
UNDO = Script("_formats/token/undo")
FORCE_RELEASE = Script("_formats/token/force_release")


# acquire.lua
_BUSY, _VOIDED, _BAD_KEY = 0, 3, -1
# release.lua: its codes are decoded by StringKindBase.release (see .foreign)


def token_keys(prefix: str, name: str) -> ForeignKeys:
    return ForeignKeys(prefix, name, TOKEN_TAG, "token")


class TokenLockKind(StringKindBase):
    """Scripts and reply decoding of the token lock; everything else is the engine's."""

    name = "token lock"
    renew_script = RENEW
    fencing_unavailable = (
        "locks of the 'token' wire format have no fencing token: the token layout shared "
        "with other clients keeps only a random token per holder, and other clients "
        "would not advance a counter. Use wire='aiolock' for fencing tokens"
    )

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._client = runtime.client
        #: every token of this manager starts with it (its prefix, braces around it,
        #: cannot occur inside a prefix, so one manager's mark never starts another's)
        self.mark = f"aiolock:{{{runtime.keyspace.prefix}}}:"
        self._backoff = PollBackoff()

    def resource(self, keys: LockKeys) -> str:
        # Not the key itself: the registry must never confuse this lock with a lock of
        # another format whose key happens to be spelled like this name.
        return f"\0{TOKEN_TAG}\0{keys.lock}"

    def token(self, field: str) -> str:
        """The token stored in Redis by the hold (or attempt) with owner field *field*."""
        return self.mark + field

    async def attempt(self, attempt: Attempt) -> Granted | Busy:
        keys = attempt.keys
        reply = await self._client.run(
            ACQUIRE,
            (keys.lock, attempt.void),
            (self.token(attempt.field), ms(attempt.lease), attempt.before),
        )
        if isinstance(reply, int):
            self._backoff.forget(keys.lock)
            return Granted(0, attempt.before + 1)
        code = as_int(reply[0])
        if code == _BAD_KEY:
            raise string_type_error(keys.lock, reply[1])
        if code == _VOIDED:  # only an attempt resent after its own undo sees that
            return Busy(0.0)
        holder, pttl = as_text(reply[1]), as_int(reply[2])
        return Busy(self._wait_for(keys, holder, pttl))

    def _wait_for(self, keys: LockKeys, holder: str, pttl: int) -> float:
        """How long the local head may sleep before trying again: until the holder's lease
        ends if the holder announces its release (an aiolock client of this prefix), else
        until the next poll."""
        # 0 ms left is "try again in a moment", not unknown (see busy_for)
        ttl = max(pttl, 1) / 1000 if pttl >= 0 else 0.0
        if holder.startswith(self.mark) or not holder:
            return ttl  # 0: the engine waits the manager's lease, or a release message
        return self._backoff.next(keys.lock, ttl)

    async def undo(self, attempt: Attempt) -> bool:
        if attempt.before:  # a re-entry changes nothing a late run could leave behind
            return False
        keys = attempt.keys
        undone = await self._client.run(
            UNDO,
            (keys.lock, attempt.void),
            (self.token(attempt.field), attempt.void_ms, keys.channel, self._rt.manager_id),
        )
        return as_int(undone) == 1

    async def _final_release(self, hold: Hold, release_id: str, listening: bool) -> Any:
        keys = hold.keys
        rt = self._rt
        return await self._client.run(
            RELEASE,
            (keys.lock, keys.tombstone(release_id)),
            (
                self.token(hold.field),
                keys.channel,
                rt.manager_id,
                1 if listening else 0,
                rt.tombstone_ms,
            ),
        )

    def renew_value(self, hold: Hold) -> str:
        return self.token(hold.field)

    async def force_release(self, keys: LockKeys) -> bool:
        code, value = await self._client.run(
            FORCE_RELEASE, (keys.lock,), (keys.channel, self._rt.manager_id)
        )
        if as_int(code) == -1:
            raise string_type_error(keys.lock, value)
        return as_int(code) == 1
