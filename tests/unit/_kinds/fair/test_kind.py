"""What only the fair lock promises: grants in arrival order across processes, a queue
that drops waiters that give up at once and dead ones within the claim lifetime, leases
that lapse without stalling the queue, and one wake-up per release.

The contract every kind keeps (cancellation, loss, closing, repeated release, no
polling) is in :mod:`tests.behaviour.test_contract`. Child processes run
:mod:`tests._children.fair`; each is stopped by its own pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.claims import CLAIM_BATCH
from aiolock._engine.kind import Attempt, Busy, Granted, ReleaseStatus
from aiolock._errors import LockConnectionError
from aiolock._kinds.fair.kind import FairLockKind
from aiolock._redis.client import Client, as_text
from tests._support.helpers import PATIENCE, eventually, unchanged_for, within
from tests._support.paths import REPO_ROOT

#: a short claim lifetime for the tests of dead waiters (the default is 10 s)
SHORT_CLAIM_TTL = 1.0


def queue_key(prefix: str, name: str) -> str:
    return f"{prefix}:fair:{{{name}}}:queue"


async def queued(admin: Redis, prefix: str, name: str) -> list[str]:
    """The fields in the fair lock's queue, first first."""
    return [as_text(m) for m in await admin.zrange(queue_key(prefix, name), 0, -1)]


async def until_queued(
    admin: Redis, prefix: str, name: str, count: int, timeout: float = 10
) -> None:
    """Wait until the queue in Redis has *count* waiters (asked of Redis, every 10 ms)."""
    deadline = time.monotonic() + timeout
    while len(await queued(admin, prefix, name)) != count:
        if time.monotonic() > deadline:
            got = await queued(admin, prefix, name)
            raise AssertionError(f"the queue has {len(got)} waiters, not {count}")
        await asyncio.sleep(0.01)


def short_claims(manager: aiolock.LockManager) -> None:
    manager._kind(FairLockKind).claim_ttl = SHORT_CLAIM_TTL


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    """A second manager on the same keys: another process, as far as Redis can tell."""
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


class Child:
    """A child process running one mode of :mod:`tests._children.fair`."""

    def __init__(self, mode: str, spec: dict[str, Any]) -> None:
        self.mode, self.spec = mode, spec
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> Child:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *sys.path]))
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests._children.fair",
            self.mode,
            json.dumps(self.spec),
            cwd=REPO_ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        return self

    async def expect(self, word: str, timeout: float = 15.0) -> str:
        """The next line of output, which must start with *word*."""
        assert self.proc is not None and self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), timeout)).decode().strip()
        assert line.startswith(word), f"child said {line!r}, expected {word}"
        return line

    async def kill(self) -> None:
        """SIGKILL, by this child's pid; bounded wait for it to go."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await asyncio.wait_for(self.proc.wait(), 10)


@contextlib.asynccontextmanager
async def children() -> AsyncIterator[list[Child]]:
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in started:
            await child.kill()


def spec(redis_url: str, prefix: str, name: str, **more: Any) -> dict[str, Any]:
    return {"url": redis_url, "prefix": prefix, "name": name, "max_seconds": 30, **more}


async def hold_until(lock: aiolock.Lock, gate: asyncio.Event, log: list[Any], label: Any) -> None:
    """Acquire *lock*, note *label* and the token in *log*, hold until *gate* opens."""
    async with lock:
        log.append((label, lock.fencing_token))
        await gate.wait()


# -- order ---------------------------------------------------------------------------


@pytest.mark.processes
async def test_grants_follow_arrival_order_across_processes(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    name, order = "printer", f"{prefix}:order"
    holder = locks.fair_lock(name)
    await holder.acquire()
    first_token = holder.fencing_token
    assert first_token is not None
    expected: list[str] = []
    local: list[asyncio.Task[None]] = []

    async def local_waiter(label: str) -> None:
        async with locks.fair_lock(name) as lock:
            await admin.rpush(order, f"{label} {lock.fencing_token}")

    async with children() as kids:
        # Three child processes and two tasks of this process, registered one after
        # another: each joins only once the one before it is in the queue in Redis.
        for i in range(5):
            label = f"child{i}" if i % 2 == 0 else f"local{i}"
            if i % 2 == 0:
                child = await Child(
                    "wait", spec(redis_url, prefix, name, label=label, order=order)
                ).start()
                kids.append(child)
                await child.expect("READY")
            else:
                local.append(asyncio.create_task(local_waiter(label)))
            await until_queued(admin, prefix, name, i + 1)
            expected.append(label)
        await holder.release()
        for child in kids:
            await child.expect("GOT")
            await child.expect("DONE")
        await asyncio.wait_for(asyncio.gather(*local), 10)
    records = [as_text(entry).split() for entry in await admin.lrange(order, 0, -1)]
    assert [label for label, _ in records] == expected
    tokens = [first_token] + [int(token) for _, token in records]
    assert tokens == sorted(set(tokens))  # a larger fencing token for every new holder
    assert await queued(admin, prefix, name) == []


async def test_grants_follow_arrival_order_within_a_process(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    holder = other.fair_lock("fifo")
    await holder.acquire()
    log: list[Any] = []
    gate = asyncio.Event()
    gate.set()  # each waiter releases as soon as it has noted its turn
    tasks = []
    for i in range(10):
        tasks.append(asyncio.create_task(hold_until(locks.fair_lock("fifo"), gate, log, i)))
        await until_queued(admin, prefix, "fifo", i + 1)
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert [label for label, _ in log] == list(range(10))
    tokens = [token for _, token in log]
    assert tokens == sorted(set(tokens))


async def test_a_thousand_waiters_of_a_process_queue_in_call_order(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    # issue 24 item 3: the first attempts went out on up to max_in_flight connections at
    # once, so Redis queued them in another order than the tasks called (16 of 1,000
    # adjacent pairs swapped). Tasks started together, in order, must queue in order.
    waiters = 1000
    holder = other.fair_lock("crowd")
    await holder.acquire()
    log: list[Any] = []
    gate = asyncio.Event()
    gate.set()
    tasks = [
        asyncio.create_task(hold_until(locks.fair_lock("crowd"), gate, log, i))
        for i in range(waiters)
    ]
    await until_queued(admin, prefix, "crowd", waiters, timeout=60)
    await holder.release()  # Redis grants in its queue's order, one after another
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    labels = [label for label, _ in log]
    swapped = sum(1 for a, b in itertools.pairwise(labels) if a > b)
    assert (swapped, labels) == (0, list(range(waiters)))


async def test_waiters_cancelled_while_their_attempt_waits_in_the_lane_drop_out(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    # The ordered lane (Client.run_in_order) drops the commands of cancelled callers and
    # goes on with the rest, in order; nothing of it is left once the waiters are done.
    holder = other.fair_lock("lane")
    await holder.acquire()
    log: list[Any] = []
    gate = asyncio.Event()
    gate.set()
    tasks = [
        asyncio.create_task(hold_until(locks.fair_lock("lane"), gate, log, i)) for i in range(200)
    ]
    await asyncio.sleep(0)  # every task has called acquire; most attempts wait in the lane
    client = locks._runtime.client
    assert isinstance(client, Client) and client._lanes
    for task in tasks[1::7]:
        task.cancel()
    kept = [i for i in range(200) if i % 7 != 1]
    await until_queued(admin, prefix, "lane", len(kept))
    await holder.release()
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    assert sum(isinstance(r, asyncio.CancelledError) for r in done) == 200 - len(kept)
    assert [label for label, _ in log] == kept
    assert client._lanes == {}


async def test_the_holder_re_enters_at_once_past_the_queue(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    lock = locks.fair_lock("again")
    await lock.acquire()
    waiter = asyncio.create_task(hold_until(other.fair_lock("again"), asyncio.Event(), [], 0))
    await until_queued(admin, prefix, "again", 1)
    assert await lock.try_acquire()  # re-entry: no queue for the holder
    assert await lock.hold_count() == 2
    await lock.release()
    assert await lock.owned() and not waiter.done()
    await lock.release()
    await eventually(lambda: other.statistics().held == 1, what="the waiter's grant")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


# -- waiters that leave ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_a_waiter_that_gives_up_leaves_the_queue_at_once(
    how: str, locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    holder = other.fair_lock("leave")
    await holder.acquire()
    # 3 s: it must still be queued when the stayer has queued behind it (0.5 s ran out
    # first on a loaded machine)
    quitter = asyncio.create_task(locks.fair_lock("leave", timeout=3.0).acquire())
    await until_queued(admin, prefix, "leave", 1)
    log: list[Any] = []
    gate = asyncio.Event()
    stayer = asyncio.create_task(hold_until(locks.fair_lock("leave"), gate, log, "stayer"))
    await until_queued(admin, prefix, "leave", 2)
    _quitter, stayer_field = await queued(admin, prefix, "leave")
    if how == "cancel":
        quitter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await quitter
    else:
        with pytest.raises(aiolock.LockTimeoutError, match="not granted"):
            await quitter
    # Gone the moment the acquire returned: the withdrawal ran before it did.
    assert await queued(admin, prefix, "leave") == [stayer_field]
    assert locks.statistics().claims == 1  # the stayer's
    await holder.release()
    await eventually(lambda: bool(log), what="the next waiter's grant")
    stats = locks.statistics()
    assert stats.held_by_kind == {"fair lock": 1}
    assert stats.acquired == {"fair lock": 1}
    assert stats.timeouts == ({"fair lock": 1} if how == "timeout" else {})
    assert stats.claims == 0
    gate.set()
    await stayer
    assert locks.statistics().held == 0
    assert not await admin.exists(queue_key(prefix, "leave"))


@pytest.mark.processes
async def test_a_killed_waiter_process_leaves_within_the_claim_lifetime(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    short_claims(locks)
    holder = locks.fair_lock("dead")
    await holder.acquire()
    log: list[Any] = []
    async with children() as kids:
        child = await Child(
            "wait", spec(redis_url, prefix, "dead", label="c", order="-", claim_ttl=SHORT_CLAIM_TTL)
        ).start()
        kids.append(child)
        await child.expect("READY")
        await until_queued(admin, prefix, "dead", 1)
        gate = asyncio.Event()
        gate.set()
        waiter = asyncio.create_task(hold_until(locks.fair_lock("dead"), gate, log, "w"))
        await until_queued(admin, prefix, "dead", 2)
        await child.kill()
        killed_at = time.monotonic()
        # The lock stays held all along: the live waiter's refreshes drop the dead one.
        await until_queued(admin, prefix, "dead", 1)
        # Within the dead waiter's 1 s claim plus one refresh period (1.33 s), with room
        # for a loaded machine; a claim that lived as long as the default claim_ttl (10 s)
        # fails it, and one kept for good fails the wait above.
        took = time.monotonic() - killed_at
        assert took < SHORT_CLAIM_TTL * 4 / 3 + 2.5, f"the dead waiter left after {took:.2f} s"
        assert not log
        await holder.release()
        await within(waiter, what="the live waiter to get the lock")
    assert [label for label, _ in log] == ["w"]


@pytest.mark.processes
async def test_a_grant_to_a_killed_waiter_lapses_within_the_claim_lifetime(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    short_claims(locks)  # the releaser's kind sets the pickup lease of its grant
    holder = locks.fair_lock("lapse")
    await holder.acquire()
    log: list[Any] = []
    async with children() as kids:
        child = await Child(
            "wait",
            spec(redis_url, prefix, "lapse", label="c", order="-", claim_ttl=SHORT_CLAIM_TTL),
        ).start()
        kids.append(child)
        await child.expect("READY")
        await until_queued(admin, prefix, "lapse", 1)
        gate = asyncio.Event()
        gate.set()
        waiter = asyncio.create_task(hold_until(locks.fair_lock("lapse"), gate, log, "w"))
        await until_queued(admin, prefix, "lapse", 2)
        await child.kill()
        released_at = time.monotonic()
        await holder.release()  # granted to the dead child, whose claim is still live
        await within(waiter, what="the live waiter to get the lapsed grant")
        # The pickup lease (claim_ttl) lapses; the live waiter's next refresh (every
        # claim_ttl / 3) grants it the lock: 1.33 s, with room for a loaded machine. A
        # grant kept until the default claim lifetime (10 s) or the 30 s lease fails it.
        took = time.monotonic() - released_at
        assert took < SHORT_CLAIM_TTL * 4 / 3 + 2.5, f"the grant lapsed after {took:.2f} s"
    assert [label for label, _ in log] == ["w"]


# -- leases that end without a release -------------------------------------------------


async def test_an_expired_lease_lets_the_head_in_promptly(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    holder = other.fair_lock("lapsed")
    # never released; 1.5 s, so that both waiters are queued before it ends, on a loaded
    # machine too (had it ended first, they would not queue at all)
    await holder.acquire(lease=1.5)
    acquired_at = time.monotonic()
    log: list[Any] = []
    gate = asyncio.Event()
    gate.set()
    first = asyncio.create_task(hold_until(locks.fair_lock("lapsed"), gate, log, "first"))
    await until_queued(admin, prefix, "lapsed", 1)
    second = asyncio.create_task(hold_until(locks.fair_lock("lapsed"), gate, log, "second"))
    await until_queued(admin, prefix, "lapsed", 2)
    await within(first, what="the head to get the lock whose lease lapsed")
    # At the lease's end (the head sleeps for the holder's PTTL), with room for a loaded
    # machine; not when the head's own wait for an unknown lease (the 30 s default) ends.
    took = time.monotonic() - acquired_at
    assert took < 1.5 + 2.5, f"the head got in {took:.2f} s after a 1.5 s lease began"
    await within(second, what="the second waiter")
    assert [label for label, _ in log] == ["first", "second"]
    with pytest.raises(aiolock.LockLostError):
        await holder.release()


@pytest.mark.processes
async def test_a_killed_holder_process_lets_the_head_in_promptly(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    log: list[Any] = []
    async with children() as kids:
        child = await Child("hold", spec(redis_url, prefix, "crash", lease=1.0)).start()
        kids.append(child)
        await child.expect("HELD")
        gate = asyncio.Event()
        gate.set()
        waiter = asyncio.create_task(hold_until(locks.fair_lock("crash"), gate, log, "w"))
        await until_queued(admin, prefix, "crash", 1)
        await child.kill()
        killed_at = time.monotonic()
        await within(waiter, what="the waiter to outwait the killed holder's lease")
        # Within the holder's 1 s lease (the head sleeps for its PTTL), with room for a
        # loaded machine; not the 30 s the head waits for an unknown lease.
        took = time.monotonic() - killed_at
        assert took < 1.0 + 2.5, f"the waiter got in {took:.2f} s after the kill"
    assert [label for label, _ in log] == ["w"]


# -- one wake-up per release -------------------------------------------------------------


async def test_a_release_wakes_only_the_next_waiter(
    locks: aiolock.LockManager,
    other: aiolock.LockManager,
    admin: Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waiters = 8
    holder = other.fair_lock("one")
    await holder.acquire()
    log: list[Any] = []
    gates = [asyncio.Event() for _ in range(waiters)]
    tasks = []
    for i in range(waiters):
        lock = locks.fair_lock("one")
        tasks.append(asyncio.create_task(hold_until(lock, gates[i], log, i)))
        await until_queued(admin, prefix, "one", i + 1)
    kind = locks._kind(FairLockKind)
    attempts = 0
    attempt = kind.attempt

    async def counted(a: Attempt) -> Granted | Busy:
        nonlocal attempts
        attempts += 1
        return await attempt(a)

    monkeypatch.setattr(kind, "attempt", counted)
    await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="the subscription")
    # The head retries once after the confirmation: waited out (however long a loaded
    # machine makes it), not slept on.
    await eventually(
        unchanged_for(lambda: attempts), what="the head's retry after the confirmation"
    )
    attempts = 0
    messages = locks.statistics().hub.messages
    await holder.release()
    await eventually(lambda: len(log) == 1, what="the first grant")
    await asyncio.sleep(0.2)
    assert attempts == 1  # the one woken waiter picking up its grant
    assert locks.statistics().hub.messages == messages + 1
    for i in range(waiters - 1):
        gates[i].set()  # each release (within this manager) wakes the next one alone
        await eventually(lambda: len(log) == i + 2, what=f"grant {i + 2}")  # noqa: B023
        await asyncio.sleep(0.05)
        assert attempts == i + 2
    gates[-1].set()
    await within(asyncio.gather(*tasks), what="the last waiter")
    assert [label for label, _ in log] == list(range(waiters))


async def test_a_confirmation_or_a_reconnect_wakes_only_the_first_waiter(
    locks: aiolock.LockManager,
    other: aiolock.LockManager,
    admin: Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # issue 24 item 3: the subscription's confirmation and a pub/sub reconnect woke every
    # fair waiter of the process (N attempts each); a missed grant can only have named
    # the first of ours (Redis grants in its queue's order, which is our call order).
    waiters = 100
    kind = locks._kind(FairLockKind)
    attempts = 0
    attempt = kind.attempt

    async def counted(a: Attempt) -> Granted | Busy:
        nonlocal attempts
        attempts += 1
        return await attempt(a)

    monkeypatch.setattr(kind, "attempt", counted)
    holder = other.fair_lock("calm")
    await holder.acquire()
    log: list[Any] = []
    gate = asyncio.Event()
    gate.set()
    tasks = [
        asyncio.create_task(hold_until(locks.fair_lock("calm"), gate, log, i))
        for i in range(waiters)
    ]
    await until_queued(admin, prefix, "calm", waiters)
    await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="the subscription")
    await asyncio.sleep(1.5)  # past READY_WAIT: whatever retries would come, came
    assert waiters <= attempts <= waiters + 2  # the first attempts, and the first's retry
    before, reconnects = attempts, locks.statistics().hub.reconnects
    assert await admin.client_kill_filter(_type="pubsub")
    await eventually(
        lambda: locks.statistics().hub.reconnects > reconnects, timeout=10, what="a reconnect"
    )
    await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="resubscribed")
    await asyncio.sleep(1.5)
    assert attempts - before <= 3  # the first waiter: woken by the loss, the confirmation
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert [label for label, _ in log] == list(range(waiters))


async def test_claims_are_refreshed_in_calls_of_at_most_claim_batch(
    locks: aiolock.LockManager,
    other: aiolock.LockManager,
    admin: Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # issue 24 item 3: one refresh script carried all N waiters of a process (a call
    # of 0.6 x N commands that blocks Redis, every claim_ttl / 3)
    waiters = 1100
    short_claims(locks)
    kind = locks._kind(FairLockKind)
    calls: list[list[str]] = []
    seen: set[str] = set()  # every field any call refreshed
    refresh = kind.refresh_claims

    async def recorded(keys: Any, fields: Any) -> None:
        calls.append(list(fields))
        seen.update(fields)
        await refresh(keys, fields)

    monkeypatch.setattr(kind, "refresh_claims", recorded)
    holder = other.fair_lock("many")
    await holder.acquire()
    tasks = [
        asyncio.create_task(hold_until(locks.fair_lock("many"), asyncio.Event(), [], i))
        for i in range(waiters)
    ]
    await until_queued(admin, prefix, "many", waiters, timeout=60)
    # Every waiter's claim refreshed by some call: on a loaded machine the rounds that ran
    # while the waiters were still registering carried only those registered by then, so a
    # count of calls says nothing about which claims they carried (issue 25).
    claims = set(await queued(admin, prefix, "many"))
    try:
        await eventually(lambda: claims <= seen, timeout=60, what="every claim refreshed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {len(claims & seen)} of {waiters} seen") from None
    assert max(len(fields) for fields in calls) <= CLAIM_BATCH, [len(fields) for fields in calls]
    assert len(seen) == waiters
    assert len(await queued(admin, prefix, "many")) == waiters  # every claim kept alive
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await holder.release()


async def test_hand_over_latency(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    holder = other.fair_lock("fast")
    latencies = []
    for _ in range(20):
        await holder.acquire()
        got = asyncio.Event()

        async def take(got: asyncio.Event) -> None:
            async with locks.fair_lock("fast"):
                got.set()

        waiter = asyncio.create_task(take(got))
        await until_queued(admin, prefix, "fast", 1)
        started = time.monotonic()
        await holder.release()
        await within(got.wait(), what="the hand-over")
        latencies.append(time.monotonic() - started)
        await waiter
    # A release, the message, the pickup: three round trips on a local server, a few ms
    # (the median leaves room for a loaded machine); a waiter not woken by the message
    # would wait for the holder's 30 s lease.
    assert statistics.median(latencies) < 0.25, latencies
    assert max(latencies) < 5.0, latencies


# -- fencing and administration ------------------------------------------------------------


async def test_force_release_grants_the_next_waiter(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    holder = other.fair_lock("forced")
    await holder.acquire()
    log: list[Any] = []
    gate = asyncio.Event()
    waiter = asyncio.create_task(hold_until(locks.fair_lock("forced"), gate, log, "w"))
    await until_queued(admin, prefix, "forced", 1)
    assert await locks.fair_lock("forced").force_release()
    await eventually(lambda: bool(log), what="the grant")
    assert log[0][1] > (holder.fencing_token or 0)
    with pytest.raises(aiolock.LockLostError):
        await holder.release()
    gate.set()
    await waiter
    assert not await locks.fair_lock("forced").force_release()


async def test_try_acquire_never_jumps_the_queue(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    holder = other.fair_lock("nojump")
    # lapses with a waiter queued (1 s: time to queue it first, on a loaded machine too)
    await holder.acquire(lease=1.0)
    log: list[Any] = []
    gate = asyncio.Event()
    waiter = asyncio.create_task(hold_until(locks.fair_lock("nojump"), gate, log, "w"))
    await until_queued(admin, prefix, "nojump", 1)
    await asyncio.sleep(1.05)
    # Free in Redis or already picked up: either way the newcomer does not get it, and
    # its one attempt leaves no trace in the queue.
    assert not await other.fair_lock("nojump").try_acquire()
    await eventually(lambda: bool(log), what="the queued waiter's grant")
    assert await queued(admin, prefix, "nojump") == []
    gate.set()
    await waiter


async def test_a_fair_lock_is_not_the_lock_of_the_same_name(locks: aiolock.LockManager) -> None:
    fair = locks.fair_lock("same")
    plain = locks.lock("same")
    assert isinstance(fair, aiolock.FairLock) and "FairLock" in repr(fair)
    assert fair.key != plain.key
    async with fair:
        assert await plain.try_acquire()
        await plain.release()


async def test_exclusion_under_churn_with_timeouts_and_cancellations(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    """Two managers, 16 tasks, short timeouts and cancellations: one holder at a time,
    every grant picked up or passed on, and nothing left in Redis afterwards."""
    rng = random.Random(8)
    inside = 0
    entered = 0
    deadline = time.monotonic() + 20

    async def worker(manager: aiolock.LockManager, seed: int) -> None:
        nonlocal inside, entered
        own = random.Random(seed)
        lock = manager.fair_lock("churn", timeout=own.choice([0, 0.01, 0.05, 1.0]))
        for _ in range(15):
            if time.monotonic() > deadline:
                return
            try:
                async with lock:
                    inside += 1
                    entered += 1
                    try:  # a task cancelled in the body leaves too
                        assert inside == 1, "two holders at once"
                        await asyncio.sleep(own.random() * 0.005)
                    finally:
                        inside -= 1
            except aiolock.LockTimeoutError:
                pass

    async def canceller(task: asyncio.Task[None]) -> None:
        await asyncio.sleep(rng.random() * 0.3)
        task.cancel()

    tasks = [asyncio.create_task(worker(locks if i % 2 else other, i)) for i in range(16)]
    cancellers = [asyncio.create_task(canceller(task)) for task in tasks[::4]]
    done, pending = await asyncio.wait(tasks, timeout=30)
    await asyncio.gather(*cancellers)
    assert not pending
    for task in done:
        if not task.cancelled():
            task.result()
    assert entered >= 10
    assert (locks.statistics().held, other.statistics().held) == (0, 0)
    assert (locks.statistics().claims, other.statistics().claims) == (0, 0)
    await eventually(lambda: locks.statistics().pending_cleanups == 0, what="cleanups")
    assert await queued(admin, prefix, "churn") == []
    assert not await admin.exists(f"{prefix}:fair:{{churn}}")


# --------------------------------------------------------------------------------------
# Regressions from the adversarial review of the fair lock (issue 8).

__all__ = ["other"]  # the second manager fixture


def lock_key(prefix: str, name: str) -> str:
    return f"{prefix}:fair:{{{name}}}"


# -- defect 1: an undo that passes a grant on did not void the pickup it undid ----------


async def test_a_pickup_that_runs_after_its_undo_does_not_queue_a_ghost(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    """A pickup attempt cancelled in flight, whose undo reaches Redis first (another
    connection), must be a no-op when it runs late.

    Before the fix: undo.lua found the grant (count 1), passed it on and returned 1
    without setting the void marker; the late pickup then found its field gone and the
    lock held, and queued the field again -- a waiter that had left, back in the queue
    (and granted the lock in turn, stalling it for a pickup lease)."""
    kind = locks._kind(FairLockKind)
    keys = locks._keyspace.keys("ghost", "fair")
    holder = other.fair_lock("ghost")
    await holder.acquire()

    def attempt(field: str, void: str) -> Attempt:
        return Attempt(keys, "o", field, 0, 30.0, keys.void(void))

    assert isinstance(await kind.attempt(attempt("A", "a1")), Busy)  # queued first
    log: list[Any] = []
    gate = asyncio.Event()
    second = asyncio.create_task(hold_until(locks.fair_lock("ghost"), gate, log, "b"))
    await until_queued(admin, prefix, "ghost", 2)
    await holder.release()  # granted to A, which is "cancelled" while picking it up
    assert as_text(await admin.hget(lock_key(prefix, "ghost"), "A")) == "1"
    pickup = attempt("A", "a2")
    assert await kind.undo(pickup)  # the undo overtakes the pickup: the grant passes on
    await eventually(lambda: bool(log), what="the next waiter's grant")
    late = await kind.attempt(pickup)  # the pickup arrives late
    assert not isinstance(late, Granted)
    assert await queued(admin, prefix, "ghost") == []  # A stays gone
    gate.set()
    await second
    assert not await admin.exists(lock_key(prefix, "ghost"))


# -- defect 2: a deferred undo of a failed attempt reverted a later one ------------------


async def test_a_deferred_undo_never_reverts_a_later_pickup(
    locks: aiolock.LockManager,
    other: aiolock.LockManager,
    admin: Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pickup whose reply is lost (connection error) is undone; if Redis cannot be
    reached for the undo, it is retried in the background. The waiter retries its own
    attempt meanwhile; the late undo must not touch what that retry acquired.

    Before the fix: the waiter kept its one field for the retry, the retry picked the
    grant up again under it, and the background undo (same field, count 1) then deleted
    the new hold and granted the lock to the next waiter: two holders at once."""
    kind = locks._kind(FairLockKind)
    real_attempt, real_undo = kind.attempt, kind.undo
    holder = other.fair_lock("lost")
    await holder.acquire()
    lost_reply = asyncio.Event()
    down_until = [0.0]

    async def attempt(a: Attempt) -> Granted | Busy:
        outcome = await real_attempt(a)
        if isinstance(outcome, Granted) and not lost_reply.is_set():
            lost_reply.set()  # it ran in Redis, but its reply never arrived
            down_until[0] = time.monotonic() + 0.5
            raise LockConnectionError("connection lost (injected)")
        return outcome

    async def undo(a: Attempt) -> bool:
        if time.monotonic() < down_until[0]:
            raise LockConnectionError("connection lost (injected)")
        return await real_undo(a)

    monkeypatch.setattr(kind, "attempt", attempt)
    monkeypatch.setattr(kind, "undo", undo)
    lock = locks.fair_lock("lost", timeout=10)
    acquired, checked = asyncio.Event(), asyncio.Event()

    async def waiter() -> bool:  # a hold belongs to its task: check it from there
        await lock.acquire()
        acquired.set()
        await checked.wait()
        owned = await lock.owned()
        with contextlib.suppress(aiolock.LockLostError):
            await lock.release()
        return owned

    task = asyncio.create_task(waiter())
    await until_queued(admin, prefix, "lost", 1)
    await holder.release()
    await asyncio.wait_for(acquired.wait(), 10)
    assert lost_reply.is_set()
    # Let the background undo run (Redis is "reachable" again after 0.5 s).
    await asyncio.sleep(max(0.0, down_until[0] - time.monotonic()) + 0.3)
    await eventually(lambda: locks.statistics().pending_cleanups == 0, what="the undo")
    checked.set()
    assert await asyncio.wait_for(task, 5), "the late undo deleted the hold the retry acquired"
    assert not await admin.exists(lock_key(prefix, "lost"))


# -- the storm: 50 waiters in 3 processes, random timeouts and cancellations, kills -----


@pytest.mark.processes
async def test_storm_of_waiters_in_three_processes_keeps_exclusion_and_leaves_nothing(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    """3 processes x 17 tasks with random timeouts (some None, some 0) and cancellations
    at random moments, plus two more waiter processes SIGKILLed while they wait or
    hold: an independent checker in Redis sees one holder at a time and increasing
    fencing tokens; afterwards the queue is empty and every key left has a TTL."""
    name, check = "storm", f"{prefix}-check"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *sys.path]))
    procs: list[asyncio.subprocess.Process] = []
    try:
        for i in range(3):
            storm_spec = {
                "url": redis_url, "prefix": prefix, "name": name, "check": check,
                "seed": i, "tasks": 17, "rounds": 6, "cancels": 10, "hold": 0.004,
                "lease": 5.0, "claim_ttl": SHORT_CLAIM_TTL, "max_seconds": 25,
            }  # fmt: skip
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests._children.fair_storm", json.dumps(storm_spec),
                cwd=REPO_ROOT, env=env, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            procs.append(proc)
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 20)
            assert line.strip() == b"READY", line
        async with children() as kids:
            for label in ("v1", "v2"):  # waiters that hold a while once granted
                victim = await Child(
                    "wait",
                    spec(redis_url, prefix, name, label=label, order=f"{check}:victims",
                         hold=0.3, claim_ttl=SHORT_CLAIM_TTL),
                ).start()  # fmt: skip
                kids.append(victim)
                await victim.expect("READY")
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            rng = random.Random(5)
            for victim in kids:  # killed at a random moment: waiting, holding or done
                await asyncio.sleep(rng.random() * 1.5)
                await victim.kill()
        reports = []
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line.startswith(b"REPORT "), line
            reports.append(json.loads(line[7:]))
            await asyncio.wait_for(proc.wait(), 10)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    print(reports)  # shown with -s, and on failure
    for report in reports:
        assert report["overlaps"] == 0 and report["fenced"] == 0, report
        assert report["errors"] == [] and report["lost"] == 0, report
        assert report["held_after"] == 0 and report["claims_after"] == 0, report
    assert sum(r["entered"] for r in reports) >= 30, reports
    assert sum(r["cancelled"] for r in reports) >= 10, reports
    # Dead waiters' claims run out within claim_ttl; then nothing is queued.
    deadline = time.monotonic() + 3 * SHORT_CLAIM_TTL
    while await queued(admin, prefix, name) or await admin.exists(lock_key(prefix, name)):
        assert time.monotonic() < deadline, await queued(admin, prefix, name)
        await asyncio.sleep(0.05)
    assert not await admin.exists(f"{lock_key(prefix, name)}:claims")
    async for key in admin.scan_iter(match=f"{prefix}:*", count=1000):
        assert await admin.pttl(key) != -1, f"{as_text(key)} has no TTL"


# -- attacks that held up (kept as tests) ------------------------------------------------


async def test_a_grant_published_while_the_pubsub_connection_is_down_is_picked_up(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    """CLIENT KILL TYPE pubsub, then a release at once: the grant's message is lost, but
    the reconnection wakes the waiter, whose attempt picks the grant up."""
    holder = other.fair_lock("deaf")
    await holder.acquire()
    log: list[Any] = []
    gate = asyncio.Event()
    gate.set()
    waiter = asyncio.create_task(hold_until(locks.fair_lock("deaf"), gate, log, "w"))
    await until_queued(admin, prefix, "deaf", 1)
    await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="subscription")
    assert await admin.client_kill_filter(_type="pubsub")
    started = time.monotonic()
    await holder.release()
    await within(waiter, what="the waiter to pick up the grant whose message was lost")
    # The reconnection's wake-up, with room for a loaded machine: not the holder's 30 s
    # lease, nor the grant's 10 s pickup lease (the default claim_ttl) running out.
    took = time.monotonic() - started
    assert took < 5.0, f"the waiter got the lock {took:.2f} s after the release"
    assert [label for label, _ in log] == ["w"]
    assert await queued(admin, prefix, "deaf") == []


@pytest.mark.parametrize("offset", [-0.004, -0.002, 0.0, 0.002, 0.004])
async def test_a_timeout_as_the_grant_lands_passes_it_on(
    offset: float,
    locks: aiolock.LockManager,
    other: aiolock.LockManager,
    admin: Redis,
    prefix: str,
) -> None:
    """The first waiter's timeout runs out around the moment the release grants it the
    lock: either it takes the lock, or the grant passes to the second waiter at once."""
    name = "edge"
    holder = other.fair_lock(name)
    await holder.acquire()

    async def try_first() -> bool:
        try:
            async with locks.fair_lock(name, timeout=0.3):
                return True
        except aiolock.LockTimeoutError:
            return False

    first = asyncio.create_task(try_first())
    started = time.monotonic()
    await until_queued(admin, prefix, name, 1)
    log: list[Any] = []
    gate = asyncio.Event()
    gate.set()
    second = asyncio.create_task(hold_until(other.fair_lock(name), gate, log, "second"))
    await until_queued(admin, prefix, name, 2)
    await asyncio.sleep(max(0.0, started + 0.3 + offset - time.monotonic()))
    released_at = time.monotonic()
    await holder.release()
    await within(first, what="the first waiter (its lock or its timeout)")
    await within(second, timeout=2 * PATIENCE, what="the second waiter")
    # Granted at once, with room for a loaded machine: not after the first waiter's grant
    # waited out its 10 s pickup lease (the default claim_ttl).
    took = time.monotonic() - released_at
    assert took < 5.0, f"the second waiter got the lock {took:.2f} s after the release"
    assert [label for label, _ in log] == ["second"]
    assert await queued(admin, prefix, name) == []
    assert not await admin.exists(lock_key(prefix, name))


async def test_a_resent_release_after_other_owners_changes_nothing(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    """A final release sent again (same release id) after the lock passed through two
    more owners, one of them still holding and one waiter queued: it answers RELEASED
    and touches neither the holder, nor the queue, nor publishes a grant."""
    kind = locks._kind(FairLockKind)
    lock = locks.fair_lock("resend")
    await lock.acquire()
    hold = next(iter(locks._engine.registry))  # type: ignore[union-attr]
    first_outcome = await kind.release(hold, 1, "rid-1", None, False, False)
    for _ in range(2):  # two more owners come and go, then one holds
        async with other.fair_lock("resend"):
            pass
    holder = other.fair_lock("resend")
    await holder.acquire()
    log: list[Any] = []
    waiter = asyncio.create_task(hold_until(locks.fair_lock("resend"), asyncio.Event(), log, 0))
    await until_queued(admin, prefix, "resend", 1)
    before = await admin.hgetall(lock_key(prefix, "resend"))
    again = await kind.release(hold, 1, "rid-1", None, False, False)
    assert again.status is first_outcome.status is ReleaseStatus.RELEASED
    assert again.value == 0  # no grant, no message
    assert await admin.hgetall(lock_key(prefix, "resend")) == before
    assert len(await queued(admin, prefix, "resend")) == 1
    await holder.release()
    await eventually(lambda: bool(log), what="the waiter's grant")
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    locks._engine.registry.remove(hold)  # type: ignore[union-attr]
