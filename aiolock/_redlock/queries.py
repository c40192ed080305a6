"""What a Redlock handle asks the masters beyond acquire and release: who holds it, how
long it has left, whether the task still owns it; and the two changes an owner or an
administrator makes: extending a fixed lease, force-releasing.

Each answer is a majority's. A Redlock is held when a majority of the masters (the
quorum) have the key for one token, so every question here asks every master and groups
their answers by token (:class:`Look`). When too few masters answer to tell (a majority
could still hold it among the silent ones), the question raises
:class:`~aiolock.LockConnectionError` instead of guessing.

:class:`RedlockQueries` is a mixin of :class:`~aiolock.RedlockManager`, like
:class:`~aiolock._redlock.acquire.RedlockAcquire` and for the same reason: an extension
or a force release changes the manager's own records of its holds (their validity,
their timers, a loss), which the acquire, renewal and release paths share.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiolock._engine.handle import extend_seconds
from aiolock._errors import LockConnectionError, LockError, LockLostError, LockNotOwnedError
from aiolock._keys import LockKeys, ms
from aiolock._redis.client import as_int, as_text, key_type_error
from aiolock._redis.scripts import Script
from aiolock._redlock.lock import RedlockHold
from aiolock._redlock.nodes import Node, Signals, fan_out

__all__ = ["RENEW", "Look", "RedlockQueries"]

RENEW = Script("_redlock/renew")
LOOK = Script("_redlock/look")
EXTEND = Script("_redlock/extend")
FORCE_RELEASE = Script("_redlock/force_release")


@dataclass
class Look:
    """Every master's answer about one Redlock key, grouped by token."""

    #: masters asked, and how many answered
    masters: int
    answered: int = 0
    #: token -> the remaining lease (ms; -1 for no expiry) on each master that has it
    tokens: dict[str, list[int]] = field(default_factory=dict)
    #: the Redis type of a key that is not a string, on some master (None if none)
    bad_type: str | None = None

    @classmethod
    def of(cls, replies: Sequence[Any]) -> Look:
        look = cls(len(replies))
        for reply in replies:
            if isinstance(reply, BaseException) or reply is None:
                continue  # no answer in time
            look.answered += 1
            code = as_int(reply[0])
            if code == 1:  # (force_release.lua answers no lease: -1, as for none)
                left = as_int(reply[2]) if len(reply) > 2 else -1
                look.tokens.setdefault(as_text(reply[1]), []).append(left)
            elif code == -1:
                look.bad_type = as_text(reply[1])
        return look

    def holder(self, quorum: int, what: str) -> str | None:
        """The token a majority of masters have; None if no token can have a majority.

        Raises :class:`LockConnectionError` if the masters that did not answer could
        make either answer true.
        """
        best = max((len(found) for found in self.tokens.values()), default=0)
        for token, found in self.tokens.items():
            if len(found) >= quorum:
                return token
        silent = self.masters - self.answered
        if best + silent >= quorum:
            raise LockConnectionError(
                f"cannot tell whether {what} is held: {self.answered} of {self.masters} "
                f"masters answered within node_timeout, and a majority ({quorum}) could "
                "still hold it among the others; ask again when more masters answer"
            )
        return None

    def lease_left(self, token: str, quorum: int) -> int:
        """Milliseconds until fewer than a majority of masters have *token* (-1: never):
        the quorum-th longest of their remaining leases."""
        leases = self.tokens[token]
        if sum(1 for left in leases if left < 0) >= quorum:
            return -1
        return sorted((left for left in leases if left >= 0), reverse=True)[
            quorum - 1 - sum(1 for left in leases if left < 0)
        ]


class RedlockQueries:
    """The queries and owner's changes of :class:`~aiolock.RedlockManager` (a mixin; see
    the module docstring). It keeps no state of its own."""

    # What it uses of the manager (set by RedlockManager.__init__).
    quorum: int
    drift_factor: float
    _nodes: list[Node]
    _signals: Signals
    _holds: dict[tuple[str, str], RedlockHold]
    _lost: dict[tuple[str, str], RedlockHold]

    if TYPE_CHECKING:  # the manager's own steps

        def _check_open(self) -> None: ...

        def _owner(self) -> str: ...

        def _drift(self, lease: float) -> float: ...

        def _arm(self, hold: RedlockHold) -> None: ...

        def _check_fixed_lease(self, lease: object) -> float: ...

        def _lose(self, hold: RedlockHold, reason: str, *, release: bool = True) -> None: ...

    # -- the current task's hold -------------------------------------------------------

    def current(self, keys: LockKeys) -> RedlockHold | None:
        if asyncio.current_task() is None:
            return None
        return self._holds.get((keys.lock, self._owner()))

    def pop_lost(self, keys: LockKeys) -> RedlockHold | None:
        return self._lost.pop((keys.lock, self._owner()), None)

    def forget_lost(self, hold: RedlockHold) -> None:
        """*hold*'s loss was reported (by its ``async with``): not again at release()."""
        if self._lost.get((hold.keys.lock, hold.owner)) is hold:
            del self._lost[(hold.keys.lock, hold.owner)]

    def owned_hold(self, keys: LockKeys, verb: str) -> RedlockHold:
        """The current task's hold of *keys*, or the error that says why there is none."""
        self._check_open()
        hold = self._holds.get((keys.lock, self._owner()))
        if hold is not None:
            return hold
        lost = self._lost.pop((keys.lock, self._owner()), None)
        if lost is not None:
            raise LockLostError(
                f"redlock {keys.name!r} was lost while this task held it "
                f"({lost.lost_reason}); another owner may have entered the critical section"
            )
        raise LockNotOwnedError(
            f"cannot {verb} redlock {keys.name!r}: the current task does not hold it; "
            "locks belong to the task that acquired them"
        )

    async def votes(self, keys: LockKeys) -> int:
        """How many masters hold the current task's token for *keys* (0 if no hold)."""
        self._check_open()
        hold = self._holds.get((keys.lock, self._owner()))
        if hold is None:
            return 0
        token = hold.token
        calls = [
            (lambda node=node: node.run(RENEW, (keys.lock,), (token, 0))) for node in self._nodes
        ]
        results = await fan_out(calls, lambda _: False)
        return sum(1 for r in results if isinstance(r, list) and as_int(r[0]) == 1)

    def bound(self, hold: RedlockHold, max_hold: float) -> None:
        """End *hold* as lost once it has been held for *max_hold* s (from now: it was
        just granted). A re-entry keeps the deadline of the task's first acquisition."""
        if hold.limit is None and hold.count == 1 and not hold.lost:
            loop = asyncio.get_running_loop()
            hold.limit = loop.call_at(loop.time() + max_hold, self._held_too_long, hold, max_hold)

    def _held_too_long(self, hold: RedlockHold, max_hold: float) -> None:
        hold.limit = None
        if not hold.lost and self._holds.get((hold.keys.lock, hold.owner)) is hold:
            self._lose(
                hold,
                f"it was held for max_hold={max_hold:g} s, so aiolock released it: renewal "
                "stops there, however long the body runs",
            )

    # -- anyone's hold ---------------------------------------------------------------------

    async def look(self, keys: LockKeys) -> tuple[Look, float]:
        """Every master's answer for *keys*, and the monotonic time the question left."""
        self._check_open()
        start = time.monotonic()
        # Every master is asked, a skipped one too (each bounded by node_timeout): a
        # question is no hot path, and a master skipped a moment ago may answer now.
        calls = [
            (lambda node=node: node.run(LOOK, (keys.lock,), (), force=True)) for node in self._nodes
        ]
        look = Look.of(await fan_out(calls, lambda _: False))
        if look.bad_type is not None and not look.tokens:
            raise key_type_error(keys.lock, look.bad_type)
        return look, start

    async def is_locked(self, keys: LockKeys) -> bool:
        look, _ = await self.look(keys)
        return look.holder(self.quorum, f"redlock {keys.name!r}") is not None

    async def ttl(self, keys: LockKeys) -> float | None:
        look, start = await self.look(keys)
        token = look.holder(self.quorum, f"redlock {keys.name!r}")
        if token is None:
            return None
        left_ms = look.lease_left(token, self.quorum)
        if left_ms < 0:
            return float("inf")
        # As a hold's validity: counted from before the question left, less the drift.
        left = left_ms / 1000
        return max(0.0, left - self._drift(left) - (time.monotonic() - start))

    # -- changes ---------------------------------------------------------------------------

    async def extend(self, keys: LockKeys, lease: float | None, additional: float | None) -> None:
        """Set (*lease*) or lengthen (*additional*) the current task's fixed lease on a
        majority of masters within its validity; else the hold is lost."""
        seconds = extend_seconds(lease, additional)
        if additional is None:
            seconds = self._check_fixed_lease(seconds)
        hold = self.owned_hold(keys, "extend")
        if hold.renew:
            raise LockError(
                f"redlock {keys.name!r} is renewed automatically, so there is nothing to "
                "extend; extend() is for holds acquired with an explicit lease="
            )
        mode = "set" if additional is None else "add"
        args = (hold.token, mode, ms(seconds))
        targets = [node for node in self._nodes if node.index in hold.sent]
        n, quorum = len(targets), self.quorum
        before = hold.valid_until
        start = time.monotonic()

        def decided(results: list[Any]) -> bool:
            yes = sum(1 for r in results if _extended(r))
            return yes >= quorum or sum(1 for r in results if r == 0) > n - quorum

        calls = [(lambda node=node: node.run(EXTEND, (keys.lock,), args)) for node in targets]
        results = await fan_out(calls, decided)
        yes = sum(1 for r in results if _extended(r))
        if hold.lost:
            raise self._lost_by(hold, "extend")
        if yes < quorum or time.monotonic() >= before:
            answered = sum(1 for r in results if r is not None and not isinstance(r, Exception))
            self._lose(
                hold,
                f"extend() was confirmed by {yes} of {len(self._nodes)} masters within its "
                f"validity ({answered} answered), fewer than a majority ({quorum})",
            )
            raise self._lost_by(hold, "extend")
        if mode == "add":
            # Every master that confirmed added the time to what it had left, which was at
            # least the old validity; only the added time's own drift is taken off.
            hold.valid_until = before + seconds - seconds * self.drift_factor
        else:
            hold.valid_until = start + seconds - self._drift(seconds)
            hold.lease = seconds
        self._arm(hold)

    def _lost_by(self, hold: RedlockHold, verb: str) -> LockLostError:
        self.forget_lost(hold)
        return LockLostError(
            f"redlock {hold.keys.name!r} was lost while this task held it "
            f"({hold.lost_reason}); {verb}() came too late, and another owner may have "
            "entered the critical section"
        )

    async def force_release(self, keys: LockKeys) -> bool:
        """Delete *keys* on every master whoever holds it; True if a majority held it."""
        self._check_open()
        calls = [
            (lambda node=node: node.run(FORCE_RELEASE, (keys.lock,), (), force=True))
            for node in self._nodes
        ]
        deleted = Look.of(await fan_out(calls, lambda _: False))
        for hold in [hold for key, hold in self._holds.items() if key[0] == keys.lock]:
            self._lose(hold, "it was force-released", release=False)
        self._signals.wake(keys.channel)
        if deleted.bad_type is not None and not deleted.tokens:
            raise key_type_error(keys.lock, deleted.bad_type)
        try:
            return deleted.holder(self.quorum, f"redlock {keys.name!r}") is not None
        except LockConnectionError:
            # Deleted where it answered; the silent masters may keep theirs.
            raise LockConnectionError(
                f"force_release() of redlock {keys.name!r} reached {deleted.answered} of "
                f"{deleted.masters} masters within node_timeout; the others may still have its "
                "key: call it again when they answer"
            ) from None


def _extended(reply: object) -> bool:
    return isinstance(reply, int) and not isinstance(reply, bool) and reply > 0
