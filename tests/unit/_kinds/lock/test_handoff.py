"""Hand-off: a held lock detached into a token and adopted by another task or process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.crc import key_slot

import aiolock
from aiolock.testing_cluster import LocalCluster
from tests._support.helpers import eventually, hold_once
from tests._support.paths import REPO_ROOT
from tests._support.proxy import FaultProxy


async def in_task(coro: Any) -> Any:
    """Run *coro* in a task of its own: another owner than the calling task."""
    return await asyncio.create_task(coro)


async def test_detached_in_one_task_adopted_in_another_then_released(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    lock = locks.lock("job")
    await lock.acquire()
    fence = lock.fencing_token
    token = await lock.detach()
    assert isinstance(token, str) and len(token) < 200
    assert await lock.locked()  # still held: by the detached field, by no task
    assert not await lock.owned()
    with pytest.raises(aiolock.LockNotOwnedError) as caught:
        await lock.release()  # the original task no longer owns it
    assert not isinstance(caught.value, aiolock.LockLostError)

    async def adopter() -> tuple[int | None, int]:
        await lock.adopt(token)
        seen = (lock.fencing_token, await lock.hold_count())
        await lock.release()
        return seen

    assert await in_task(adopter()) == (fence, 1)  # the fencing token did not change
    assert not await lock.locked()
    # the state is free (issue 21: a free state keeps the epoch and the last token)
    state: Any = await admin.get(lock.key)
    assert state is None or state.startswith(b"|"), state


async def test_a_token_is_adopted_once(locks: aiolock.LockManager, redis: Redis) -> None:
    lock = locks.lock("once")
    await lock.acquire()
    token = await lock.detach()
    adopted = asyncio.Event()
    done = asyncio.Event()

    async def first() -> None:
        await lock.adopt(token)
        adopted.set()
        await done.wait()
        await lock.release()

    holder = asyncio.create_task(first())
    await adopted.wait()
    with pytest.raises(aiolock.LockHandoffError, match="adopted already"):
        await in_task(lock.adopt(token))
    # Another manager (another process, as far as Redis can tell) fares no better.
    async with aiolock.LockManager(redis, prefix=locks.prefix) as other:
        with pytest.raises(aiolock.LockHandoffError):
            await other.lock("once").adopt(token)
    done.set()
    await holder
    with pytest.raises(aiolock.LockHandoffError, match="free now"):
        await lock.adopt(token)  # released since: still not adoptable
    assert not await lock.locked()


async def test_a_token_whose_lease_ran_out_cannot_be_adopted(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("expired")
    await lock.acquire()
    token = await lock.detach(lease=0.2)
    ttl = await lock.ttl()
    # None: the 0.2 s already ran out before this read (a loaded machine can take that
    # long between two round trips); otherwise the lease is the detached one, not 30 s
    assert ttl is None or ttl <= 0.2, ttl
    deadline = time.monotonic() + 10
    while await lock.locked():  # nobody renews a detached hold: the lease frees it
        assert time.monotonic() < deadline, "the detached lock never expired"
        await asyncio.sleep(0.05)
    with pytest.raises(aiolock.LockHandoffError, match="lease"):
        await in_task(lock.adopt(token))
    assert not await lock.locked()  # the failed adoption took nothing


async def test_a_reentered_hold_is_not_detached(locks: aiolock.LockManager) -> None:
    lock = locks.lock("nested")
    await lock.acquire()
    await lock.acquire()
    with pytest.raises(aiolock.LockError, match="re-entered"):
        await lock.detach()
    assert await lock.hold_count() == 2  # untouched
    await lock.release()
    token = await lock.detach()  # counted once now
    await in_task(_adopt_and_release(lock, token))
    assert not await lock.locked()


async def test_detaching_a_hold_redis_no_longer_has_raises_lost(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    lock = locks.lock("gone")
    await lock.acquire()
    await admin.delete(lock.key)  # behind the holder's back (evicted, flushed)
    with pytest.raises(aiolock.LockLostError, match="could not be detached"):
        await lock.detach()
    assert not await lock.locked()  # nothing was made up in Redis
    with pytest.raises(aiolock.LockNotOwnedError) as caught:
        await lock.release()  # the loss was reported once, by detach()
    assert not isinstance(caught.value, aiolock.LockLostError)


async def _adopt_and_release(lock: aiolock.Lock, token: str) -> None:
    await lock.adopt(token)
    await lock.release()


async def test_detach_inside_async_with_leaves_the_lock_to_the_adopter(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("handler")
    async with lock:
        token = await lock.detach()
    assert await lock.locked()  # the block's end released nothing
    entered = []

    async def background() -> None:
        async with lock.adopted(token):
            entered.append(await lock.hold_count())
        entered.append(await lock.locked())

    await in_task(background())
    assert entered == [1, False]


async def test_an_adopted_hold_is_renewed_and_its_loss_detected(
    redis: Redis, admin: Redis, prefix: str
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix, lease=2.0) as locks:
        lock = locks.lock("renewed")
        await lock.acquire()
        token = await lock.detach(lease=30)
        adopted = asyncio.Event()
        check = asyncio.Event()
        outcome: list[BaseException] = []

        async def adopter() -> None:
            await lock.adopt(token)
            adopted.set()
            await check.wait()
            try:
                await lock.release()
            except aiolock.LockError as exc:
                outcome.append(exc)

        task = asyncio.create_task(adopter())
        await adopted.wait()
        assert 0 < await admin.pttl(lock.key) <= 2000  # the adopter's lease, not detach's
        await admin.pexpire(lock.key, 500)
        assert await locks._open_engine().watchdog.renew_all()  # the watchdog renews it
        assert await admin.pttl(lock.key) > 1000
        await lock.force_release()  # an administrator frees it: the adopter must learn
        check.set()
        await task
        assert len(outcome) == 1 and isinstance(outcome[0], aiolock.LockLostError)


async def test_an_adopted_hold_is_released_when_its_task_ends(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("orphan")
    await lock.acquire()
    token = await lock.detach()
    await in_task(lock.adopt(token))  # the task ends holding it
    deadline = time.monotonic() + 10
    while await lock.locked():
        assert time.monotonic() < deadline, "the ended task's hold was not released"
        await asyncio.sleep(0.02)


async def test_a_detach_cancelled_in_flight_leaves_nothing_held(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("cancelled-detach")
    acquired = asyncio.Event()

    async def holder() -> str:
        await lock.acquire()
        acquired.set()
        return await lock.detach(lease=60)

    task = asyncio.create_task(holder())
    await acquired.wait()
    await asyncio.sleep(0)  # the detach is on its way
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Nobody got the token: the detached hold is released, not left for its 60 s lease.
    deadline = time.monotonic() + 10
    while await lock.locked():
        assert time.monotonic() < deadline, "a cancelled detach left the lock held"
        await asyncio.sleep(0.02)


async def _blocked_clients(admin: Redis) -> int:
    return int((await admin.info("clients"))["blocked_clients"])


async def test_an_adoption_cancelled_in_flight_leaves_the_token_adoptable(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    lock = locks.lock("cancelled-adopt")
    await lock.acquire()
    await in_task(_adopt_and_release(lock, await lock.detach()))  # the scripts are loaded
    await lock.acquire()
    token = await lock.detach(lease=60)

    # CLIENT PAUSE WRITE holds every write command (scripts included) on the server and
    # counts the held clients as blocked: the adoption is known to be in flight, waiting
    # for its reply, when it is cancelled, however slow the machine is (a script that
    # kept the server busy for a while raced the adoption under load).
    await admin.client_pause(30_000, all=False)  # CLIENT PAUSE 30000 WRITE
    try:
        task = asyncio.create_task(lock.adopt(token))

        async def _adoption_held() -> bool:
            return await _blocked_clients(admin) >= 1

        await eventually(
            _adoption_held,
            what="the adoption to be held by CLIENT PAUSE on the server (blocked_clients)",
        )
        assert not task.done()
        task.cancel()
        # the adoption is already on the server: let it run rather than have the cancelled
        # task's shielded finish wait for its reply until that finish's own time limit
        await admin.client_unpause()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await admin.client_unpause()
    await in_task(_adopt_and_release(lock, token))  # it ran, and was given back
    assert not await lock.locked()


async def test_an_adoption_delayed_past_its_give_back_leaves_the_token_adoptable(
    redis_url: str, prefix: str
) -> None:
    """The adoption's command is delayed (300 ms) and cancelled after 50 ms: the
    give-back goes out on another connection and lands first, finding nothing to give
    back; it leaves the adoption's void marker, so the late adoption does nothing. Before
    (issue 36), it took the hold for the cancelled adopter: the token was dead and the
    lock held for the adoption's lease."""
    server = Redis.from_url(redis_url)
    host = server.connection_pool.connection_kwargs["host"]
    port = server.connection_pool.connection_kwargs["port"]
    await server.aclose()
    async with FaultProxy(host, port) as proxy:
        client = Redis.from_url(proxy.url)
        try:
            async with aiolock.LockManager(client, prefix=prefix) as locks:
                lock = locks.lock("delayed-adopt")
                await lock.acquire()
                await in_task(_adopt_and_release(lock, await lock.detach()))  # scripts loaded
                await lock.acquire()
                token = await lock.detach(lease=60)
                # 1 s: the cancellation and its give-back must land within it (the
                # same window of the Redlock and compensation tests: 0.3-0.4 s were
                # missed with two CI runs on the machine)
                proxy.set_latency(1.0, "upstream")
                task = asyncio.create_task(lock.adopt(token, lease=30))
                await eventually(lambda: proxy.in_flight > 0, what="the adoption to be sent")
                await asyncio.sleep(0.05)
                proxy.set_latency(0, "upstream")
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task  # given back, on another connection
                assert proxy.in_flight > 0, "the adoption landed first: nothing was tested"
                await eventually(lambda: proxy.in_flight == 0, what="the late adoption to land")
                await in_task(_adopt_and_release(lock, token))  # still adoptable
                assert not await lock.locked()
        finally:
            await client.aclose()


class _Events(aiolock.Observer):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def acquired(self, kind: str, name: str, waited_s: float, token: int) -> None:
        self.seen.append(("acquired", token))

    def released(self, kind: str, name: str, held_s: float, token: int) -> None:
        self.seen.append(("released", token))


async def test_observers_see_the_detach_end_a_hold_and_the_adoption_begin_one(
    locks: aiolock.LockManager,
) -> None:
    events = _Events()
    locks.add_observer(events)
    lock = locks.lock("observed")
    await lock.acquire()
    fence = lock.fencing_token
    assert fence is not None
    token = await lock.detach()
    await in_task(_adopt_and_release(lock, token))
    assert events.seen == [("acquired", fence), ("released", fence)] * 2


async def test_bad_tokens_fail_at_the_call(locks: aiolock.LockManager) -> None:
    lock = locks.lock("a")
    await lock.acquire()
    token = await lock.detach()
    with pytest.raises(ValueError, match="for the lock key"):
        await locks.lock("b").adopt(token)
    with pytest.raises(ValueError, match="not a hand-off token"):
        await lock.adopt("hello")
    with pytest.raises(ValueError, match="not a hand-off token"):
        await lock.adopt(token[:-4] + "!!!!")
    with pytest.raises(TypeError, match="str"):
        await lock.adopt(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a hand-off token"):
        lock.adopted("nope")
    with pytest.raises(ValueError, match="lease"):
        await lock.detach(lease=-1)
    await lock.adopt(token)  # none of that touched the detached hold
    await lock.release()


async def test_detach_without_a_hold_and_unsupported_kinds(locks: aiolock.LockManager) -> None:
    with pytest.raises(aiolock.LockNotOwnedError, match="not held"):
        await locks.lock("free").detach()
    fair = locks.fair_lock("fair")
    await fair.acquire()
    with pytest.raises(aiolock.LockError, match="only a plain Lock"):
        await fair.detach()
    assert await fair.owned()
    await fair.release()
    foreign = locks.lock("foreign", wire="token")
    with pytest.raises(aiolock.WireFormatError, match="only a plain Lock"):
        await foreign.detach()


# -- across processes --------------------------------------------------------------------


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for child in started:  # only the ones this test started, by pid
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)


def _spawn(children: list[subprocess.Popen[str]], spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    child = subprocess.Popen(
        [sys.executable, "-m", "tests._children.handoff", json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    children.append(child)
    return child


async def _line(child: subprocess.Popen[str], timeout: float = 30) -> str:
    assert child.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), timeout)
    assert line, f"the child exited early (code {child.poll()})"
    return line.strip()


@pytest.fixture
async def competitor(redis_url: str, prefix: str) -> AsyncIterator[_Competitor]:
    competitor = _Competitor(redis_url, prefix)
    yield competitor
    await competitor.stop()


class _Competitor:
    """Another manager that keeps acquiring the name and checks, independently of the
    lock, that nobody else is inside: ``INCR <prefix>:check:inside`` must give 1."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.entries = 0
        self.violations = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, name: str) -> None:
        self._task = asyncio.create_task(self._run(name))

    async def _run(self, name: str) -> None:
        redis = Redis.from_url(self.url)
        inside = f"{self.prefix}:check:inside"
        try:
            async with aiolock.LockManager(redis, prefix=self.prefix, lease=5) as locks:
                lock = locks.lock(name)
                for _ in range(100_000):  # until stop(); bounded regardless
                    if self._stop.is_set():
                        return
                    async with lock:
                        if await redis.incr(inside) != 1:
                            self.violations += 1
                        await asyncio.sleep(0.002)
                        await redis.decr(inside)
                        self.entries += 1
        finally:
            await redis.aclose()

    async def stop(self) -> None:
        """Stop between two sections (a cancellation could leave the checker counting one)."""
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 30)


@pytest.mark.processes
async def test_handed_to_other_processes_with_an_independent_overlap_check(
    locks: aiolock.LockManager,
    redis: Redis,
    redis_url: str,
    prefix: str,
    children: list[subprocess.Popen[str]],
    competitor: _Competitor,
) -> None:
    """Each round: this process enters the critical section, detaches, and a child adopts
    the token from stdin, finishes the section and releases; a competitor in another
    manager acquires the same name all along. The checker counts who is inside."""
    lock = locks.lock("shared")
    inside = f"{prefix}:check:inside"
    competitor.start("shared")
    await eventually(lambda: competitor.entries > 0, timeout=20, what="the competitor's entry")
    rounds = 3
    for _ in range(rounds):
        await lock.acquire()
        assert await redis.incr(inside) == 1, "someone else was inside"
        fence = lock.fencing_token
        token = await lock.detach(lease=30)
        spec = {"url": redis_url, "prefix": prefix, "name": "shared", "lease": 5.0}
        child = _spawn(children, {**spec, "mode": "release", "work": 0.1, "max_seconds": 30})
        assert child.stdin is not None
        child.stdin.write(token + "\n")
        child.stdin.flush()
        assert await _line(child) == f"ADOPTED {fence}"  # the fencing token travelled
        assert await _line(child) == "RELEASED"
        assert await asyncio.to_thread(child.wait, 30) == 0
        await _its_turn(competitor)
    await competitor.stop()
    assert competitor.violations == 0
    assert int(await redis.get(inside) or 0) == 0


async def _its_turn(competitor: _Competitor) -> None:
    """Wait until the competitor has entered once more (it got its turn between rounds)."""
    seen = competitor.entries
    await eventually(lambda: competitor.entries > seen, timeout=20, what="the competitor's turn")


@pytest.mark.processes
async def test_a_killed_adopter_frees_the_lock_within_its_lease(
    locks: aiolock.LockManager,
    redis_url: str,
    prefix: str,
    children: list[subprocess.Popen[str]],
) -> None:
    lock = locks.lock("killed")
    await lock.acquire()
    token = await lock.detach(lease=60)  # far longer than the adopter's lease
    child_lease = 1.5
    spec = {"url": redis_url, "prefix": prefix, "name": "killed", "lease": child_lease}
    child = _spawn(children, {**spec, "mode": "hold", "max_seconds": 60})
    assert child.stdin is not None
    child.stdin.write(token + "\n")
    child.stdin.flush()
    assert (await _line(child)).startswith("ADOPTED")
    os.kill(child.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    await asyncio.to_thread(child.wait, 10)
    await lock.acquire(timeout=30)  # another owner gets it once the adopter's lease ends
    freed_after = time.monotonic() - killed_at
    await lock.release()
    print(f"lock freed {freed_after:.2f} s after SIGKILL of the adopter (lease {child_lease} s)")
    # Within one adopter's lease (plus slack for a loaded machine), not the detach lease.
    assert freed_after < child_lease + 3.0


# -- Redis Cluster -----------------------------------------------------------------------


@pytest.mark.skipif(
    not hasattr(PubSub, "ssubscribe"),
    reason="Redis Cluster support needs redis-py >= 8.0.1 (asyncio sharded pub/sub)",
)
async def test_hand_off_on_a_cluster_on_every_primary() -> None:
    """Detach with one manager and adopt with another, for a name on each of 3 primaries."""
    with LocalCluster(primaries=3, replicas=0) as cluster:
        found: dict[int, str] = {}
        for i in range(10_000):  # one name per primary (the name is the hash tag)
            found.setdefault(cluster.owner_port(key_slot(f"h{i}".encode())), f"h{i}")
            if len(found) == cluster.primaries:
                break
        url, prefix = cluster.url, "handoff-cluster"
        async with (
            aiolock.LockManager.from_url(url, cluster=True, prefix=prefix) as a,
            aiolock.LockManager.from_url(url, cluster=True, prefix=prefix) as b,
        ):
            for name in found.values():
                lock = a.lock(name)
                await lock.acquire()
                fence = lock.fencing_token
                token = await lock.detach()
                other = b.lock(name)
                await other.adopt(token)
                assert other.fencing_token == fence
                with pytest.raises(aiolock.LockHandoffError):
                    await in_task(lock.adopt(token))
                await other.release()
                assert not await lock.locked()


async def test_a_waiter_of_the_detaching_manager_is_served_after_the_adopter_releases(
    redis: Redis, prefix: str
) -> None:
    """Robustness suite finding R1: two tasks of one manager wait on a name another
    manager holds; the first gets it from the freed lock (a new grant: no waiter marked
    on it) while the second sleeps without a timer behind it (a local holder wakes it on
    release). The first detaches, another manager adopts and releases: nothing marked
    the lock as waited for, so that release published nothing, and the second waiter
    slept until its deadline (forever with timeout=None)."""
    async with (
        aiolock.LockManager(redis, prefix=prefix) as first_holder,
        aiolock.LockManager(redis, prefix=prefix) as detaching,
        aiolock.LockManager(redis, prefix=prefix) as adopting,
    ):
        blocker = first_holder.lock("job")
        await blocker.acquire()
        tokens: asyncio.Queue[str] = asyncio.Queue()
        detacher = asyncio.create_task(in_task(_take_and_detach(detaching.lock("job"), tokens)))
        await eventually(lambda: detaching.statistics().hub.waiters == 1, what="the first")
        waiter = asyncio.create_task(in_task(hold_once(detaching.lock("job"))))
        await eventually(lambda: detaching.statistics().hub.waiters == 2, what="the second")
        await blocker.release()
        token = await asyncio.wait_for(tokens.get(), 5)
        await detacher
        await in_task(_adopt_and_release(adopting.lock("job"), token))
        await asyncio.wait_for(waiter, 5)  # timeout=None: only a wake-up ends its wait


async def _take_and_detach(lock: aiolock.Lock, tokens: asyncio.Queue[str]) -> None:
    await lock.acquire()
    await tokens.put(await lock.detach())
