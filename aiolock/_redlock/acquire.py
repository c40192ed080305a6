"""Redlock's acquire path, as a mixin of RedlockManager: rounds, local gates, waiting.

What :class:`RedlockAcquire` does is the "Acquire" part of the algorithm described in
:mod:`aiolock._redlock.manager`: a round of the acquire script over every master, decided by a
majority within the validity, undone where it may have been granted; the local queue of
this manager's tasks per name (:class:`~._redlock_lock.Gate`); waiting for a release
message, the holder's TTL, or a random pause after a split vote; and the timer that ends
a hold whose validity ran out. It keeps no state of its own: :class:`~aiolock.RedlockManager`
sets what it uses, listed at the top of the class. A mixin rather than a composed object
because the acquire, release and renewal paths share every one of those records (holds,
gates, yield windows, counters) and call each other both ways (a renewal re-arms a hold's
timer, a lost hold frees its gate): one ``self`` keeps them plain attributes.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from aiolock._engine.cleanup import SHIELD_TIMEOUT, Cleanup, finish_despite_cancel
from aiolock._engine.kind import void_ttl_ms
from aiolock._errors import (
    LockError,
    LockKeyTypeError,
    LockLostError,
    LockTimeoutError,
    ManagerNotOpenError,
)
from aiolock._keys import KeySpace, LockKeys, ms
from aiolock._redis.client import as_int, key_type_error
from aiolock._redis.scripts import Script
from aiolock._redlock.lock import Busy, Gate, RedlockHold
from aiolock._redlock.nodes import Node, Signals, fan_out

__all__ = ["RedlockAcquire"]

ACQUIRE = Script("_redlock/acquire")
UNDO = Script("_redlock/undo")

#: A waiter whose subscription is not yet confirmed on a majority of masters retries at
#: least this often (a release published before the subscription would be missed).
READY_WAIT = 0.05
#: Seconds a name's subscription outlives the last local task that wanted it.
LINGER = 1.0
#: A waiter that got no answer from a majority (masters down) retries after this long.
UNREACHABLE_RETRY = 0.25
#: Fixed part of the clock drift allowance, added to ``lease * drift_factor``.
DRIFT_FLOOR = 0.002

_ACQUIRED, _BUSY, _VOIDED, _BAD_KEY = 1, 0, 2, -1


class RedlockAcquire:
    """The acquire path of :class:`~aiolock.RedlockManager` (see the module docstring)."""

    # What the acquire path uses of the manager (set by RedlockManager.__init__).
    lease: float
    retry_delay: float
    drift_factor: float
    quorum: int
    _keyspace: KeySpace
    _signals: Signals
    _nodes: list[Node]
    _cleanup: Cleanup
    _holds: dict[tuple[str, str], RedlockHold]
    _lost: dict[tuple[str, str], RedlockHold]
    _gates: dict[str, Gate]
    _yields: dict[str, float]
    _ids: int
    _counts: Counter[str]
    _watch: asyncio.Event
    _stragglers: set[asyncio.Task[Any]]

    if TYPE_CHECKING:  # the manager's own steps

        def _check_open(self) -> None: ...

        def _owner(self) -> str: ...

        def _lose(self, hold: RedlockHold, reason: str, *, release: bool = True) -> None: ...

    def _drift(self, lease: float) -> float:
        return lease * self.drift_factor + DRIFT_FLOOR

    async def acquire(
        self, keys: LockKeys, timeout: float | None, lease: float | None
    ) -> RedlockHold:
        self._check_open()
        owner = self._owner()
        held = self._holds.get((keys.lock, owner))
        if held is not None:
            held.count += 1  # re-entry: the outer hold decides the lease
            return held
        lost = self._lost.pop((keys.lock, owner), None)
        if lost is not None:
            # Reported once, here, as the single-server lock does: the task believed it
            # held the lock and is about to re-enter it.
            raise LockLostError(
                f"redlock {keys.name!r} was lost before this task acquired it again "
                f"({lost.lost_reason}); another owner may have entered the critical section"
            )
        if timeout == 0:
            outcome = await self._attempt(keys, owner, lease)
            if isinstance(outcome, RedlockHold):
                return outcome
            raise self._timeout_error(keys, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        gate = self._gates.get(keys.lock)
        if gate is None:
            gate = self._gates[keys.lock] = Gate(keys.channel)
        gate.users += 1
        try:
            remaining = None if deadline is None else deadline - time.monotonic()
            with anyio.move_on_after(remaining) as scope:
                await gate.lock.acquire()
            if scope.cancelled_caught:
                raise self._timeout_error(keys, timeout)
            try:
                hold = await self._wait(keys, owner, lease, deadline, timeout, gate)
            except BaseException:
                gate.lock.release()
                raise
        except BaseException:
            self._leave_gate(keys.lock, gate)
            raise
        # The hold keeps the gate until it ends: the next local task starts its rounds
        # once this one released, instead of spending a round on a lock its sibling holds.
        hold.gate = gate
        return hold

    def _leave_gate(self, lock: str, gate: Gate) -> None:
        gate.users -= 1
        if gate.users > 0:
            return
        if not gate.listening:
            self._drop_gate(lock, gate)
            return
        # Keep listening a little longer: a task that releases and asks again (the
        # common loop) must hear the other clients' releases from its first moment.
        loop = asyncio.get_running_loop()
        loop.call_later(LINGER, self._drop_gate, lock, gate)

    def _drop_gate(self, lock: str, gate: Gate) -> None:
        if gate.users > 0 or self._gates.get(lock) is not gate:
            return  # in use again (or already dropped)
        del self._gates[lock]
        if gate.listening:
            gate.listening = False
            self._signals.unlisten(gate.channel)

    async def _wait(
        self,
        keys: LockKeys,
        owner: str,
        lease: float | None,
        deadline: float | None,
        timeout: float | None,
        gate: Gate,
    ) -> RedlockHold:
        signals = self._signals
        channel = keys.channel
        event: asyncio.Event | None = None
        # The gate listens from this manager's first failed round on the name until its
        # last local task is done with it: one subscription for a run of local waiters.
        if gate.listening or channel in self._yields:  # (a yield ends on their release)
            event = self._listen(gate)
        while True:
            if signals.closed:
                raise ManagerNotOpenError(
                    "the RedlockManager was closed while this task waited for a lock"
                )
            if event is not None:
                event.clear()  # a release from here on wakes the wait below
            await self._yield_to_others(channel, event)
            outcome = await self._attempt(keys, owner, lease)
            if isinstance(outcome, RedlockHold):
                return outcome
            if event is None:
                event = self._listen(gate)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise self._timeout_error(keys, timeout)
            if outcome.split:
                # Nobody won a majority (several contenders split the votes, and
                # each undid its round): retry after a random pause, so that the
                # contenders do not collide again.
                pause = random.uniform(0, self.retry_delay)
                await anyio.sleep(pause if remaining is None else min(pause, remaining))
                continue
            # Subscribed on a majority, a release is heard: any majority that holds
            # the lock shares a master with it. Until then, retry soon.
            fallback = outcome.ttl if signals.confirmed_by(channel) >= self.quorum else READY_WAIT
            wait = fallback if remaining is None else min(fallback, remaining)
            with anyio.move_on_after(wait):
                await event.wait()

    def _listen(self, gate: Gate) -> asyncio.Event:
        if not gate.listening:
            gate.listening = True
            self._signals.listen(gate.channel)
        return self._signals.event(gate.channel)

    async def _yield_to_others(self, channel: str, event: asyncio.Event | None) -> None:
        """Wait out the yield window after a release other clients heard: until it ends,
        or until another client's release message shows that they had their turn."""
        until = self._yields.get(channel)
        if until is None:
            return
        heard = self._signals.heard(channel)
        while True:
            left = until - time.monotonic()
            if left <= 0 or self._signals.heard(channel) != heard or self._signals.closed:
                break
            if event is None:
                await anyio.sleep(left)
                break
            event.clear()  # other wakes (a confirmation) do not end the yield
            with anyio.move_on_after(left):
                await event.wait()
        self._yields.pop(channel, None)

    def _timeout_error(self, keys: LockKeys, timeout: float | None) -> LockTimeoutError:
        return LockTimeoutError(
            f"redlock {keys.name!r} was not granted by a majority ({self.quorum} of "
            f"{len(self._nodes)}) of masters within {timeout} s: another owner holds it, or "
            "too few masters answered within node_timeout; pass a longer timeout, and see "
            "statistics().failed_rounds and the log for unreachable masters"
        )

    async def _attempt(self, keys: LockKeys, owner: str, lease: float | None) -> RedlockHold | Busy:
        """One round over every master: a new hold, or how long to wait before the next."""
        renew = lease is None
        lease_s = self.lease if lease is None else lease
        self._ids += 1
        token = f"{self._keyspace.manager_id}:{self._ids}"
        void = keys.void(token)
        lease_ms = ms(lease_s)
        n, quorum = len(self._nodes), self.quorum

        # Masters that just failed to answer are skipped (no vote, nothing to undo there),
        # unless the others are too few for a majority: then every master is asked.
        now = time.monotonic()
        force = sum(1 for node in self._nodes if node.up(now)) < quorum
        sent = frozenset(i for i, node in enumerate(self._nodes) if force or node.up(now))

        def call(node: Node) -> Any:
            if node.index not in sent:
                return _skipped
            return lambda: node.run(ACQUIRE, (keys.lock, void), (token, lease_ms), force=force)

        def decided(results: list[Any]) -> bool:
            yes = sum(1 for r in results if _code(r) == _ACQUIRED)
            no = sum(1 for r in results if r is not None and _code(r) != _ACQUIRED)
            return yes >= quorum or no > n - quorum

        start = time.monotonic()
        try:
            results = await fan_out(
                [call(node) for node in self._nodes], decided, adopt=self._adopt_straggler
            )
        except BaseException:
            await self._undo(keys, token, lease_s, sent)  # any of them may have granted it
            raise
        valid_until = start + lease_s - self._drift(lease_s)
        granted = [i for i, r in enumerate(results) if _code(r) == _ACQUIRED]
        if len(granted) >= quorum and time.monotonic() < valid_until:
            hold = RedlockHold(keys, owner, token, lease_s, renew, valid_until, sent)
            self._adopt(hold)
            return hold
        self._counts["failed_rounds"] += 1
        # Undo where it may have been granted: granted, failed, or unanswered masters.
        maybe = [
            i
            for i, r in enumerate(results)
            if i in sent and _code(r) not in (_BUSY, _VOIDED, _BAD_KEY)
        ]
        await self._undo(keys, token, lease_s, maybe)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, LockError):
                raise r  # not a master's failure to answer: a problem to report
        bad = [r for r in results if isinstance(r, LockKeyTypeError) or _code(r) == _BAD_KEY]
        if len(bad) > n - quorum:  # no majority can ever grant it: say why
            first: Any = bad[0]
            if isinstance(first, LockKeyTypeError):
                raise first
            raise key_type_error(keys.lock, first[1])
        ttls = [as_int(r[1]) / 1000 for r in results if _code(r) == _BUSY]  # type: ignore[index]
        live = [t for t in ttls if t > 0]
        split = bool(granted)
        if live:
            return Busy(max(min(live), 0.005), split)
        return Busy(self.lease if ttls else UNREACHABLE_RETRY, split)

    def _adopt_straggler(self, task: asyncio.Task[Any]) -> None:
        """A call to a master that answered after the round was decided: let it finish
        (bounded by node_timeout; a grant it makes is released or undone with the rest,
        which go to every master the round was sent to, and leave a void marker that
        makes it do nothing if it lands after them), awaited when the manager closes."""
        self._stragglers.add(task)
        task.add_done_callback(self._straggler_done)

    def _straggler_done(self, task: asyncio.Task[Any]) -> None:
        self._stragglers.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failure already marked its master skipped

    def _adopt(self, hold: RedlockHold) -> None:
        self._counts["acquired"] += 1
        self._holds[(hold.keys.lock, hold.owner)] = hold
        self._arm(hold)
        self._watch.set()

    def _arm(self, hold: RedlockHold) -> None:
        """A timer at the end of the hold's validity: unrenewed by then, it is lost."""
        if hold.timer is not None:
            hold.timer.cancel()
        loop = asyncio.get_running_loop()
        hold.timer = loop.call_at(_loop_time(loop, hold.valid_until), self._expire, hold)

    def _expire(self, hold: RedlockHold) -> None:
        hold.timer = None
        if hold.lost or self._holds.get((hold.keys.lock, hold.owner)) is not hold:
            return
        if time.monotonic() < hold.valid_until:
            self._arm(hold)  # renewed meanwhile
            return
        reason = (
            "its validity ended before a majority of masters confirmed a renewal"
            if hold.renew
            else f"its fixed lease of {hold.lease} s ended"
        )
        self._lose(hold, reason)

    async def _undo(self, keys: LockKeys, token: str, lease: float, where: Iterable[int]) -> None:
        """Undo one round on the masters *where*: shielded, bounded, retried if need be."""
        targets = [self._nodes[i] for i in where]
        if not targets:
            return
        void_ms = void_ttl_ms(lease)

        async def on(node: Node) -> None:
            undone = await node.run(UNDO, (keys.lock, keys.void(token)), (token, void_ms))
            if as_int(undone) == 1:
                self._signals.wake(keys.channel)  # our own task may be next

        what = f"undo of a redlock round on {keys.name!r}"
        await self._on_all(targets, on, what, void_ms / 1000)

    async def _on_all(
        self,
        targets: Sequence[Node],
        action: Callable[[Node], Awaitable[None]],
        what: str,
        patience: float,
    ) -> None:
        """Run *action* on every target master, despite cancellation, within SHIELD_TIMEOUT;
        what fails is retried in the background for *patience* s: as long as what it
        compensates may still arrive (an acquire queued at a stopped master runs when it
        resumes, with a lease of its own: only the void marker left first stops it)."""
        give_up_at = time.monotonic() + patience

        async def send_all() -> None:
            async def done(node: Node) -> bool:
                await action(node)
                return True  # (fan_out reports an unfinished call as None)

            calls = [functools.partial(done, node) for node in targets]
            results: list[Any] = [None] * len(targets)
            with anyio.move_on_after(SHIELD_TIMEOUT):
                results = await fan_out(calls, lambda _: False)
            for node, result in zip(targets, results, strict=True):
                if result is None or isinstance(result, BaseException):
                    self._cleanup.add(
                        f"{what} on {node!r}", functools.partial(action, node), give_up_at
                    )

        await finish_despite_cancel(send_all)


async def _skipped() -> str:
    """The outcome of a round on a skipped master: no vote, nothing sent."""
    return "skipped"


def _code(reply: object) -> int | None:
    """The code of an acquire reply, or None for an error or no answer."""
    if isinstance(reply, list) and reply:
        return as_int(reply[0])
    return None


def _loop_time(loop: asyncio.AbstractEventLoop, monotonic: float) -> float:
    """*monotonic* (time.monotonic) on the loop's clock (the same clock on CPython)."""
    return loop.time() + (monotonic - time.monotonic())
