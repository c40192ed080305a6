"""Redlock: one lock over N independent Redis masters, held while a majority grants it.

The algorithm as implemented (see ``docs/redlock.md`` for its guarantees and limits):

Acquire. A round sends the acquire script to every master at once with a fresh token
(unique across clients) and the lease, measuring from *before* the first request on the
monotonic clock. The round succeeds when a majority (``N // 2 + 1``) granted it and the
*validity* ``lease - elapsed - drift`` is still positive (``drift = lease * drift_factor
+ 2 ms`` for clock-rate differences between the masters and this host); the hold is then
valid until ``start + lease - drift``. Otherwise the round is undone on every master that
granted it or did not answer (the undo leaves a void marker, so a late acquire does
nothing), and the task waits: woken by a release message from any master, or when the
holder's lease would have ended (the TTL-bounded fallback); a round that split the votes
with other contenders is retried after a random delay of up to ``retry_delay``. Within
one manager, one task per name contends at a time (first come, first served), and keeps
its place until its hold's release reached the masters. A master that did not answer
within ``node_timeout`` is skipped for a second (see :class:`~._redlock_nodes.Node`).

Renew. A background loop renews every auto-renewed hold on every master each third of
the lease (one script call per master for all due holds). A majority of confirmations
moves the validity forward; a majority of masters that answer "not held" means the lock
is lost at once; otherwise renewal is retried until the validity ends, and then the hold
is lost. A loss cancels the ``async with`` body and raises :class:`LockLostError`.

Release. The release script goes to every master the acquire was sent to (shielded
against cancellation and bounded in time), and leaves the acquisition's void marker where
it does not find the hold, as the undo does: an acquire still on its way to a master the
round was decided without does nothing when it lands. A master that cannot be reached is
retried in the background until the lease would have ended anyway. After a release that
other clients heard, this manager's tasks yield the name for a moment (YIELD_WINDOW).

The acquire path is in :mod:`aiolock._redlock.acquire` (a mixin of the manager); the
open/close lifecycle is :mod:`aiolock._engine.lifecycle`'s, shared with LockManager.

There are no fencing tokens: the masters are independent, so no single counter orders
the acquisitions (see :attr:`RedlockLock.fencing_token`).

Identity. Like a LockManager, the manager keeps its identity record
(:mod:`aiolock._redis.identity`) while open, on every master: written when it opens
(each master bounded by ``node_timeout``; one that does not answer gets it at the next
round), refreshed every ``lease / 3`` on a loop of its own (the renewal loop's period; a
slow master never holds back a renewal), deleted when it closes. A Redlock hold's token
is ``<manager id>:<number>``, so the ``aiolock`` command pointed at any master resolves
its holder to the record on that master. ``identity=False`` writes none. Opening then
reads the records on every master, and refuses beside a manager of another key layout
(:mod:`aiolock._redis.layout`); a master that cannot be read is left out of the check,
as it is left out of a round.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import anyio
from anyio.abc import TaskGroup
from redis.asyncio import Redis

from aiolock._decorators import OnBusy, decorate
from aiolock._engine.cleanup import Cleanup
from aiolock._engine.handle import _DEFAULT
from aiolock._engine.kind import void_ttl_ms
from aiolock._engine.lifecycle import ManagerLifecycle
from aiolock._errors import LockLostError
from aiolock._keys import (
    REDLOCK_TAG,
    KeySpace,
    LockKeys,
    check_lease,
    check_max_hold,
    check_name,
    check_timeout,
    ms,
    new_manager_id,
)
from aiolock._redis.client import as_int
from aiolock._redis.identity import Identity, check_app_name
from aiolock._redis.layout import refuse_other_layouts
from aiolock._redis.scripts import Script
from aiolock._redlock.acquire import RedlockAcquire
from aiolock._redlock.lock import Gate, RedlockHold, RedlockLock, RedlockStatistics
from aiolock._redlock.nodes import Node, Signals, check_clients, fan_out
from aiolock._redlock.queries import RENEW, RedlockQueries

__all__ = ["RedlockLock", "RedlockManager", "RedlockStatistics"]

logger = logging.getLogger("aiolock")

P = ParamSpec("P")
R = TypeVar("R")

RELEASE = Script("_redlock/release")

#: After a release that other clients heard, this manager's tasks wait this long (or for
#: a release message) before they try for the same lock again.
YIELD_WINDOW = 0.02


def _redlock_maker(
    manager: RedlockManager, name: str, timeout: float | None, lease: float | None
) -> RedlockLock:
    return manager.lock(name, timeout=timeout, lease=lease)


class RedlockManager(ManagerLifecycle, RedlockAcquire, RedlockQueries):
    """Locks held by a majority of N independent Redis masters (the Redlock algorithm).

    Made by :meth:`aiolock.LockManager.redlock`; open it with ``async with``. Its
    :meth:`lock` handles have the :class:`~aiolock.Lock` API except fencing tokens.

    Args:
        clients: one ``redis.asyncio.Redis`` per master, an odd number >= 3, each a
            different server (the manager does not close them).
        prefix: the first part of every key and channel.
        lease: seconds a hold lasts on a master without renewal; holds without an
            explicit lease are renewed on every master each ``lease / 3``.
        drift_factor: clock drift allowance, as a fraction of the lease (plus 2 ms),
            subtracted from the validity of every hold.
        node_timeout: seconds one command to one master may take; a master that does
            not answer in time counts as a vote against, and is skipped for a second.
            Keep it well below the lease.
        retry_delay: the most a waiter sleeps (uniformly at random) before retrying after
            a failed round, so that contenders do not split the votes again.
        close_timeout: seconds closing may spend releasing held locks.
        name: the application's name (``"billing-worker"``), shown by the ``aiolock``
            command next to the host and pid of this manager's holds (as
            ``LockManager(name=...)``); 1 to 64 printable characters, or ``None``.
        identity: whether the manager keeps its identity record on every master while
            open (as a LockManager's: about 200 bytes per master, refreshed every
            ``lease / 3``, no command per acquire). Opening reads the other managers'
            records on each master that answers, and raises
            :class:`~aiolock.IncompatibleLayoutError` if one announces another key
            layout (as a LockManager does). See ``docs/wire-formats.md``.
        max_hold: the longest any hold lasts, in seconds (``None``: no bound), as
            ``LockManager(max_hold=)``: then the body is cancelled,
            :class:`~aiolock.LockLostError` raised and the lock released on every master.
    """

    _WHAT = "RedlockManager"
    _HOW_TO_OPEN = "use 'async with LockManager.redlock([...]) as locks:'"
    _GONE_HINT = "; open a new one"
    _FAILED_LOG = "aiolock's Redlock background tasks failed; the RedlockManager is unusable"
    _TASK_NAME = "aiolock redlock"

    def __init__(
        self,
        clients: Sequence[Redis],
        *,
        prefix: str = "aiolock",
        lease: float = 30.0,
        drift_factor: float = 0.01,
        node_timeout: float = 0.25,
        retry_delay: float = 0.05,
        close_timeout: float = 5.0,
        name: str | None = None,
        identity: bool = True,
        max_hold: float | None = None,
    ) -> None:
        super().__init__()
        redis = check_clients(clients)
        self.max_hold = check_max_hold(max_hold)
        if not isinstance(identity, bool):
            raise TypeError(f"identity must be True or False, not {identity!r}")
        self._name = check_app_name(name)
        self._keyspace = KeySpace(prefix, new_manager_id())
        self.lease = check_lease(lease)
        self.node_timeout = check_lease(node_timeout, "node_timeout")
        if self.node_timeout >= self.lease / 3:
            raise ValueError(
                f"node_timeout ({self.node_timeout} s) must be below a third of the lease "
                f"({self.lease} s): a round of commands to the masters must leave most of "
                "the lease as validity, and renewal runs every third of it"
            )
        if isinstance(drift_factor, bool) or not isinstance(drift_factor, (int, float)):
            raise TypeError(f"drift_factor must be a number, not {type(drift_factor).__name__}")
        if not 0 <= drift_factor < 0.5:
            raise ValueError(
                f"drift_factor must be >= 0 and < 0.5 (a fraction of the lease), got {drift_factor}"
            )
        self.drift_factor = float(drift_factor)
        self.retry_delay = check_timeout(retry_delay, "retry_delay") or 0.0
        self.close_timeout = check_lease(close_timeout, "close_timeout")
        self._signals = Signals(len(redis))
        self._nodes = [
            Node(i, r, self._signals, self.node_timeout, self._keyspace.manager_id)
            for i, r in enumerate(redis)
        ]
        self.quorum = len(self._nodes) // 2 + 1
        #: the identity record on each master (none with identity=False)
        self._identities = (
            [
                Identity(node.client, self._keyspace.identity_key, self._name, self.lease)
                for node in self._nodes
            ]
            if identity
            else []
        )
        self._cleanup = Cleanup()
        self._holds: dict[tuple[str, str], RedlockHold] = {}
        self._lost: dict[tuple[str, str], RedlockHold] = {}
        #: lock key -> the local queue of its tasks (see Gate)
        self._gates: dict[str, Gate] = {}
        #: channel -> monotonic time until which local tasks let other clients go first
        self._yields: dict[str, float] = {}
        self._owners: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = (
            weakref.WeakKeyDictionary()
        )
        self._ids = 0
        self._watch = asyncio.Event()
        self._counts: Counter[str] = Counter()
        #: calls to slow masters still finishing after their round was decided
        self._stragglers: set[asyncio.Task[Any]] = set()

    # -- public ------------------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return self._keyspace.prefix

    @property
    def id(self) -> str:
        """This manager's id (32 hex digits): every token of its holds starts with it,
        and its identity record is ``<prefix>:mgr:{<id>}`` on each master."""
        return self._keyspace.manager_id

    @property
    def name(self) -> str | None:
        """The application name given as ``name=`` (None if none was)."""
        return self._name

    @property
    def masters(self) -> list[Redis]:
        """The masters' clients, in the order given."""
        return [node.redis for node in self._nodes]

    def lock(
        self,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        max_hold: float | None = _DEFAULT,
    ) -> RedlockLock:
        """A handle on the Redlock *name*; no I/O until it is acquired.

        *timeout* is the default wait (``None``: as long as it takes, ``0``: one round);
        *lease* a fixed lease in seconds (not renewed; ``None`` renews the manager's);
        *max_hold* the longest a hold lasts, instead of the manager's (``None``: no bound).
        """
        name = check_name(name)
        timeout = check_timeout(timeout)
        if lease is not None:
            lease = self._check_fixed_lease(lease)
        limit = self.max_hold if max_hold is _DEFAULT else check_max_hold(max_hold)
        return RedlockLock(self, self._keyspace.keys(name, REDLOCK_TAG), timeout, lease, limit)

    def locked(
        self,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        on_busy: OnBusy = "wait",
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
        """Decorate an async function to run under the Redlock *name*, formatted per call.

        As :meth:`aiolock.LockManager.locked`: *name* is a template filled from the
        call's arguments by parameter name (``"order:{order_id}"``), checked when
        decorating; *on_busy* is ``"wait"``, ``"skip"`` or ``"raise"``; a lost lock
        cancels the call and raises :class:`~aiolock.LockLostError`. One name only (a
        Redlock has no multi-lock). *lease* is a fixed lease, checked here as
        :meth:`lock` checks it.
        """
        if not isinstance(name, str):
            raise TypeError(
                f"a Redlock manager's locked() takes one name template (str), not {name!r}: "
                "there is no Redlock multi-lock; use LockManager(redis).locked([...]) for one"
            )
        if lease is not None:
            lease = self._check_fixed_lease(lease)
        return decorate(
            self, name, _redlock_maker, timeout=timeout, lease=lease, on_busy=on_busy,
            what="locked()",
        )  # fmt: skip

    def statistics(self) -> RedlockStatistics:
        c = self._counts
        return RedlockStatistics(
            masters=len(self._nodes),
            quorum=self.quorum,
            held=len(self._holds),
            acquired=c["acquired"],
            failed_rounds=c["failed_rounds"],
            lost=c["lost"],
            renewal_rounds=c["renewal_rounds"],
            messages=self._signals.messages,
            pending_cleanups=self._cleanup.pending,
        )

    def __repr__(self) -> str:
        masters = ", ".join(node.address for node in self._nodes)
        return f"<RedlockManager [{masters}] quorum={self.quorum} {self._state}>"

    # -- lifecycle ---------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release held locks (bounded by close_timeout), fail waiters, stop the tasks."""
        await self._close()

    async def _before_open(self) -> None:
        # The record exists on every master that answers once open() returns; a master
        # that does not answer within node_timeout gets it at the next round.
        await self._publish_identity()
        # A master that cannot be read is left out of the check, as a round leaves it out.
        await refuse_other_layouts(
            [node.client for node in self._nodes],
            self.prefix,
            self.id,
            self._identities,
            what=self._WHAT,
            limit=self.node_timeout,
            tolerate=True,
        )

    async def _publish_identity(self) -> None:
        async with anyio.create_task_group() as tg:
            for identity in self._identities:
                tg.start_soon(identity.publish)

    async def _keep_identity(self) -> None:
        while True:
            await anyio.sleep(self.lease / 3)
            await self._publish_identity()

    def _start_tasks(self, tg: TaskGroup) -> None:
        for node in self._nodes:
            tg.start_soon(node.listener.run)
        tg.start_soon(self._cleanup.run)
        tg.start_soon(self._renewal_loop)
        if self._identities:
            tg.start_soon(self._keep_identity)

    def _failed(self) -> None:
        self._signals.close()
        for hold in list(self._holds.values()):
            self._lose(hold, "the RedlockManager's background tasks failed", release=False)

    async def _drain(self) -> None:
        self._signals.close()
        holds = list(self._holds.values())
        for hold in holds:
            self._lose(hold, "the RedlockManager was closed", release=False)
        with anyio.move_on_after(self.close_timeout):
            async with anyio.create_task_group() as tg:
                for hold in holds:
                    tg.start_soon(self._send_release, hold)
        if self._stragglers:  # each is bounded by node_timeout
            await asyncio.wait(set(self._stragglers), timeout=2 * self.node_timeout)
            left = set(self._stragglers)
            for task in left:
                task.cancel()
            if left:
                await asyncio.wait(left)

    async def _after_stop(self) -> None:
        if self._identities:  # after the loop that writes them stopped
            with anyio.move_on_after(self.close_timeout):
                async with anyio.create_task_group() as tg:
                    for identity in self._identities:
                        tg.start_soon(identity.delete)
        for node in self._nodes:
            await node.client.aclose()

    def _check_fixed_lease(self, lease: object) -> float:
        seconds = check_lease(lease)
        if self.node_timeout >= seconds / 3:
            raise ValueError(
                f"lease ({seconds} s) must be more than three times node_timeout "
                f"({self.node_timeout} s), or a round to the masters could use up its validity"
            )
        return seconds

    def _owner(self) -> str:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("aiolock locks must be used from inside an asyncio task")
        owner = self._owners.get(task)
        if owner is None:
            self._ids += 1
            owner = self._owners[task] = self._keyspace.owner(self._ids)
            task.add_done_callback(lambda _: self._owner_done(owner))
        return owner

    def _owner_done(self, owner: str) -> None:
        """A task ended holding Redlocks: release them rather than renew them forever."""
        for key, hold in list(self._holds.items()):
            if key[1] == owner:
                logger.warning(
                    "redlock %r was still held when its task ended; releasing it%s",
                    hold.keys.name,
                    ". Its 'async with' block is still open: it is held across a 'yield' "
                    "the task stopped iterating without closing it (contextlib.aclosing)"
                    if hold.scopes
                    else "",
                )
                self._lose(hold, "its task ended")
        # No task can ask about the task's lost holds any more (release() or a re-entry
        # would report them): forgotten, or they would be kept until the cap. Entries go
        # when their task ends, so this scans only losses of tasks still running.
        for key in [key for key in self._lost if key[1] == owner]:
            del self._lost[key]

    # -- release -----------------------------------------------------------------------

    async def release(self, keys: LockKeys) -> None:
        await self.release_hold(self.owned_hold(keys, "release"))

    async def release_hold(self, hold: RedlockHold) -> None:
        """Release one count of *hold*, whichever task calls (an ``async with`` block
        closed in another task, such as a generator's finaliser, releases its own)."""
        keys = hold.keys
        if hold.count > 1:
            hold.count -= 1
            return
        if self._holds.get((keys.lock, hold.owner)) is not hold:
            return  # released already, or lost (its task ended, say)
        self._forget(hold, keep_gate=True)
        try:
            gone = await self._send_release(hold)
        finally:
            # Only now may the next local task try: before, its round would find the
            # lock still held on the masters the release has not reached yet.
            self._open_gate(hold)
        self._signals.wake(keys.channel)  # the next local waiter tries at once
        if gone > len(self._nodes) - self.quorum:
            self._counts["lost"] += 1
            raise LockLostError(
                f"redlock {keys.name!r} was no longer held by a majority of masters when "
                f"released ({gone} of {len(self._nodes)} no longer had it): a master "
                "restarted empty, the key was deleted, or its lease ran out, so another "
                "owner may have entered the critical section"
            )

    async def _send_release(self, hold: RedlockHold) -> int:
        """Release *hold* on every master; return how many answered that they lacked it."""
        gone = 0
        heard = 0
        channel = hold.keys.channel
        # With the acquisition's void marker, left where the hold is not found: its acquire
        # may still be on its way to a master the round was decided without (release.lua).
        keys = (hold.keys.lock, hold.keys.void(hold.token))
        args = (hold.token, void_ttl_ms(hold.lease))

        async def on(node: Node) -> None:
            nonlocal gone, heard
            reply = as_int(await node.run(RELEASE, keys, args))
            if reply == 0:
                gone += 1
            else:
                mine = 1 if node.listener.subscribed(channel) else 0
                heard = max(heard, reply - 1 - mine)

        # Retried while the hold may live, and while its acquire may still land somewhere
        # (the void marker's lifetime): a release that gave up sooner left a late acquire
        # free to set a key for a whole lease, owned by nobody.
        left = max(hold.valid_until - time.monotonic(), 0.0) + self._drift(hold.lease)
        patience = max(left, args[1] / 1000)
        # Only where the acquire was sent: a skipped master never had it.
        targets = [node for node in self._nodes if node.index in hold.sent]
        await self._on_all(targets, on, f"release of redlock {hold.keys.name!r}", patience)
        if len(self._yields) > 1000:  # forget windows long over
            now = time.monotonic()
            self._yields = {c: t for c, t in self._yields.items() if t > now}
        if heard > 0:
            # Other clients wait for it: this manager's tasks keep off it for a moment, or
            # a task that releases and asks again would win every time (its round starts
            # before their release message has even arrived).
            self._yields[channel] = time.monotonic() + YIELD_WINDOW
        return gone

    def _forget(self, hold: RedlockHold, *, keep_gate: bool = False) -> None:
        if self._holds.get((hold.keys.lock, hold.owner)) is hold:
            del self._holds[(hold.keys.lock, hold.owner)]
        if not keep_gate:
            self._open_gate(hold)
        if hold.timer is not None:
            hold.timer.cancel()
            hold.timer = None
        if hold.limit is not None:
            hold.limit.cancel()
            hold.limit = None

    def _open_gate(self, hold: RedlockHold) -> None:
        gate, hold.gate = hold.gate, None
        if gate is not None:
            gate.lock.release()  # the next local task may try now
            self._leave_gate(hold.keys.lock, gate)

    def _lose(self, hold: RedlockHold, reason: str, *, release: bool = True) -> None:
        """Mark *hold* lost: cancel its bodies, remember it for release(), free the masters."""
        if hold.lost:
            return
        hold.lost, hold.lost_reason = True, reason
        self._counts["lost"] += 1
        self._forget(hold)
        self._lost[(hold.keys.lock, hold.owner)] = hold
        while len(self._lost) > 10_000:
            del self._lost[next(iter(self._lost))]
        for scope in hold.scopes:
            scope.cancel()
        self._signals.wake(hold.keys.channel)
        if release:
            # Masters that still have it (a minority, or all if the validity ran out on
            # this side only) are freed now rather than when the lease ends.
            async def free() -> None:
                await self._send_release(hold)

            what = f"release of lost redlock {hold.keys.name!r}"
            self._cleanup.add(what, free, time.monotonic() + hold.lease)

    # -- renewal -----------------------------------------------------------------------

    async def _renewal_loop(self) -> None:
        while True:
            now = time.monotonic()
            holds = list(self._holds.values())
            due = [hold for hold in holds if hold.next_check <= now]
            if due:
                try:
                    await self._renew(due)
                except Exception:  # a bug or an unexpected reply: the timers still bound
                    logger.exception("redlock renewal round failed; retrying shortly")
                    for hold in due:
                        hold.next_check = max(hold.next_check, time.monotonic() + 0.05)
                continue
            self._watch.clear()
            wait = min((hold.next_check for hold in holds), default=now + 3600.0) - now
            with anyio.move_on_after(wait):
                await self._watch.wait()

    async def _renew(self, holds: list[RedlockHold]) -> None:
        """One renewal round: every due hold on every master (one script call per master)."""
        self._counts["renewal_rounds"] += 1
        keys = [hold.keys.lock for hold in holds]
        args: list[str | int] = []
        for hold in holds:
            args += (hold.token, ms(hold.lease) if hold.renew else 0)
        n, quorum = len(self._nodes), self.quorum

        def call(node: Node) -> Any:
            return lambda: node.run(RENEW, keys, args)

        def decided(results: list[Any]) -> bool:
            return sum(1 for r in results if isinstance(r, list)) >= quorum

        start = time.monotonic()
        results = await fan_out(
            [call(node) for node in self._nodes], decided, adopt=self._adopt_straggler
        )
        now = time.monotonic()
        for i, hold in enumerate(holds):
            if hold.lost or self._holds.get((hold.keys.lock, hold.owner)) is not hold:
                continue  # released or lost meanwhile
            yes = sum(1 for r in results if isinstance(r, list) and as_int(r[i]) == 1)
            no = sum(1 for r in results if isinstance(r, list) and as_int(r[i]) == 0)
            if yes >= quorum:
                if hold.renew:
                    hold.valid_until = max(
                        hold.valid_until, start + hold.lease - self._drift(hold.lease)
                    )
                    self._arm(hold)
                hold.next_check = start + hold.lease / 3
            elif no > n - quorum:
                self._lose(
                    hold,
                    f"only {yes} of {n} masters still had it at renewal ({no} did not): a "
                    "master restarted empty, the key was deleted or expired",
                )
            else:  # too few answers to tell: try again soon, until the validity ends
                left = hold.valid_until - now
                hold.next_check = now + max(0.01, min(hold.lease / 10, left / 3))
