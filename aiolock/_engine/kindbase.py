"""KindBase: the defaults of a lock kind (the seam it implements: :mod:`aiolock._engine.kind`).

An exclusive, non-reentrant kind with no queue, no turns, no listeners and no hand-off,
whose structure is the name's key: a kind sets its flags and scripts and overrides what
differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from aiolock._engine.kind import Hold, ScriptRunner
from aiolock._errors import LockError, LockTimeoutError
from aiolock._keys import ms
from aiolock._redis.reply import as_int

if TYPE_CHECKING:
    from aiolock._keys import LockKeys
    from aiolock._redis.scripts import Script

__all__ = ["KindBase"]


class KindBase:
    """Defaults for a :class:`LockKind`: an exclusive, non-reentrant kind with no queue.

    Subclasses set the flags and implement the script calls (attempt, undo, release,
    renew, extend, force_release).
    """

    name = "lock"
    reentrant = False
    shared = False
    hand_over = False
    claims = False
    queued = False
    registers_listeners = False
    detachable = False
    release_tombstones = True
    claim_ttl = 10.0
    turns = False
    #: 350 holds of one key each: about 0.75 ms of Redis time per call, and 10,000 holds
    #: renewed in 87 calls a lease period, within W5's 100 (benchmarks/NOTES.md). Kinds
    #: with more work per hold set a smaller batch.
    renew_batch = 350
    #: whether :meth:`resource` is the lock's key (a kind that overrides it is not, see
    #: __init_subclass__): then the hot path reads ``keys.lock`` instead of calling it
    resource_is_key = True
    fencing_unavailable = ""
    anonymous_messages = False
    #: the script that renews holds (lease in ms) or only checks them (0), many per call:
    #: per hold, the keys :meth:`renew_keys` names and the arguments (:meth:`renew_value`,
    #: lease ms); it answers 1 per hold Redis still has. Set by each kind.
    renew_script: ClassVar[Script]
    #: the script that adds to one hold's lease (``extend(additional=)``), with the keys
    #: and arguments of :attr:`renew_script` plus the ms to add; None: the kind cannot
    extend_by_script: ClassVar[Script | None] = None
    _client: ScriptRunner

    def renew_keys(self, keys: LockKeys) -> tuple[str, ...]:
        """The keys the renew script takes for one hold."""
        return (keys.lock,)

    def renew_value(self, hold: Hold) -> str:
        """What names the hold to the renew script (its hash field, by default)."""
        return hold.field

    async def renew(self, holds: Sequence[Hold], lease: float) -> list[bool]:
        lease_ms = ms(lease)
        keys: list[str] = []
        args: list[Any] = []
        for hold in holds:
            keys += self.renew_keys(hold.keys)
            args += (self.renew_value(hold), lease_ms if hold.renew else 0)
        replies = await self._client.run(self.renew_script, keys, args)
        return [as_int(reply) == 1 for reply in replies]

    async def extend(self, hold: Hold, lease: float) -> bool:
        (held,) = await self._client.run(
            self.renew_script, self.renew_keys(hold.keys), (self.renew_value(hold), ms(lease))
        )
        return as_int(held) == 1

    async def extend_by(self, hold: Hold, additional: float) -> float | None:
        if self.extend_by_script is None:
            raise LockError(
                f"the {self.name} {hold.keys.name!r} cannot add to its lease "
                "(extend(additional=...) is for locks, fair locks and semaphore permits of "
                "the default wire format and locks of the 'redisson' one); set the time "
                "left with extend(lease) instead"
            )
        left = await self._client.run(
            self.extend_by_script,
            self.renew_keys(hold.keys),
            (self.renew_value(hold), ms(additional)),
        )
        return as_int(left) / 1000 if as_int(left) > 0 else None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.resource_is_key = cls.resource is KindBase.resource

    def hold_field(self, owner: str, number: int) -> str:
        return f"{owner}:{number}"

    def resource(self, keys: LockKeys) -> str:
        return keys.lock

    def timeout_error(self, keys: LockKeys, timeout: float | None, permits: int) -> Exception:
        return LockTimeoutError(
            f"{self.name} {keys.name!r} is held by another owner and was not released "
            f"within {timeout} s; pass a longer timeout, or timeout=None to wait as long "
            "as it takes"
        )

    async def refresh_claims(self, keys: LockKeys, fields: Sequence[str]) -> None:
        raise NotImplementedError(f"the {self.name} kind keeps no queue in Redis")

    async def leave_turn(self, keys: LockKeys) -> None:
        raise NotImplementedError(f"the {self.name} kind has no turns")

    async def register_listeners(self, writes: Sequence[tuple[LockKeys, float]]) -> None:
        raise NotImplementedError(f"the {self.name} kind registers no listeners")

    async def hold_count(self, keys: LockKeys, hold: Hold | None) -> int | None:
        return None  # the count is the hold's field in the hash (see Lock.hold_count)

    async def locked(self, keys: LockKeys) -> bool:
        # the kind's structure exists exactly while something is held (any type counts)
        return as_int(await self._client.call("EXISTS", keys.lock, key=keys.lock)) == 1

    async def still_held(self, keys: LockKeys) -> float | None:
        return None  # a waiter attempts whenever its wait ends

    async def lease_left(self, keys: LockKeys) -> int:
        # the kind's structure exists exactly while something is held: its key's PTTL
        return as_int(await self._client.call("PTTL", keys.lock, key=keys.lock))

    async def detach(self, hold: Hold, detached: str, lease: float) -> bool:
        raise NotImplementedError(f"the {self.name} kind cannot detach a hold")

    async def adopt(
        self, keys: LockKeys, detached: str, field: str, lease: float, void: str
    ) -> tuple[bool, int]:
        raise NotImplementedError(f"the {self.name} kind cannot detach a hold")

    async def give_back(
        self, keys: LockKeys, field: str, detached: str, void: str, void_ms: int
    ) -> bool:
        raise NotImplementedError(f"the {self.name} kind cannot detach a hold")
