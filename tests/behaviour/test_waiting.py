"""Waiting: woken by releases, not by polling; fair within a process; bounded by timeouts."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import textwrap
import time
from collections import Counter
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine import listeners
from tests._support.helpers import PATIENCE, counting_client, eventually, unchanged_for, within


async def test_a_waiter_wakes_on_release_without_waiting_out_the_lease(
    redis_url: str, prefix: str
) -> None:
    async with (
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix, lease=30) as holder_side,
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix, lease=30) as waiter_side,
    ):
        held = holder_side.lock("wake")
        await held.acquire()
        waiting = asyncio.create_task(waiter_side.lock("wake").acquire(timeout=10))
        engine = waiter_side._engine
        assert engine is not None

        def asleep() -> bool:
            # Subscribed, and asleep again after the attempt its confirmation woke it for:
            # while that attempt is still on its way (a loaded CI machine), a release
            # meanwhile lets the attempt take the lock, and the message then finds no
            # waiter (stop 32's fresh-clone run counted 0 messages).
            waiters = [w for q in engine.hub._queues.values() for w in q.waiters]
            return waiter_side.statistics().hub.subscriptions == 1 and any(
                w._future is not None and not w._future.done() for w in waiters
            )

        await eventually(asleep, what="the waiter subscribed and asleep")
        released_at = time.monotonic()
        await held.release()
        await asyncio.wait_for(waiting, 10)
        # A message, not the 30 s lease (5 s: room for a loaded machine)
        assert time.monotonic() - released_at < 5.0
        assert waiter_side.statistics().hub.messages >= 1
        await holder_side.redis.aclose()
        await waiter_side.redis.aclose()


CRASHING_HOLDER = textwrap.dedent(
    """
    import asyncio, os, sys
    from redis.asyncio import Redis
    import aiolock

    async def main() -> None:
        async with aiolock.LockManager(Redis.from_url(sys.argv[1]), prefix=sys.argv[2],
                                       lease=1.0) as locks:
            await locks.lock("crash").acquire()
            print("held", flush=True)
            os._exit(0)  # vanish without releasing: no cleanup runs

    asyncio.run(main())
    """
)


async def test_a_waiter_takes_a_lock_whose_holder_vanished_at_expiry(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHING_HOLDER, redis_url, prefix,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert out.strip() == b"held"
    lock = locks.lock("crash")
    assert await lock.locked()
    started = time.monotonic()
    await lock.acquire(timeout=2 * PATIENCE)
    waited = time.monotonic() - started
    # at the 1 s lease's expiry, not at the end of the timeout (the margin is for a
    # loaded machine)
    assert waited < PATIENCE / 2, f"took {waited:.1f} s to take a lock whose 1 s lease ended"
    await lock.release()


async def test_timeout_raises_and_try_acquire_returns_false(locks: aiolock.LockManager) -> None:
    lock = locks.lock("busy")
    await lock.acquire()

    async def contender() -> None:
        started = time.monotonic()
        with pytest.raises(aiolock.LockTimeoutError, match=r"not released within 0\.2 s"):
            await lock.acquire(timeout=0.2)
        waited = time.monotonic() - started
        assert 0.15 < waited < 5.0, f"a 0.2 s timeout raised after {waited:.2f} s"
        assert await lock.try_acquire(timeout=0.1) is False
        with pytest.raises(TimeoutError):  # LockTimeoutError is a TimeoutError too
            async with locks.lock("busy", timeout=0):
                pass

    await asyncio.create_task(contender())
    stats = locks.statistics().hub
    assert stats.waiters == 0  # timed-out waiters left their queue
    await lock.release()


async def test_handoff_is_fifo_and_a_releaser_cannot_barge(locks: aiolock.LockManager) -> None:
    order: list[int] = []

    async def worker(i: int) -> None:
        for _ in range(20):
            async with locks.lock("fair"):
                order.append(i)
                await asyncio.sleep(0)

    await asyncio.gather(*(worker(i) for i in range(8)))
    counts = Counter(order)
    assert set(counts.values()) == {20}
    changes = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert changes / (len(order) - 1) > 0.9  # each release hands over to another task


async def test_waiters_are_served_one_after_another(locks: aiolock.LockManager) -> None:
    lock = locks.lock("queue")
    await lock.acquire()
    got: list[int] = []

    async def waiter(i: int) -> None:
        async with locks.lock("queue"):
            got.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(50)]
    await eventually(lambda: locks.statistics().hub.waiters == 50, what="50 waiters")
    await lock.release()
    await within(asyncio.gather(*tasks), what="50 waiters to be served")
    assert sorted(got) == list(range(50))
    assert locks.statistics().hub.waiters == 0


async def test_a_local_handoff_costs_one_round_trip(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No round of the manager's listener registrations during the test (aiolock show's
    # list of a plain lock's listeners): they refresh, or withdraw once nobody waits.
    monkeypatch.setattr(listeners, "TTL", 3600.0)
    client, trips = counting_client(redis_url)
    async with aiolock.LockManager(client, prefix=prefix) as locks:
        # Run the scripts once first: on a fresh server (this test alone) the first release
        # would also send SCRIPT LOAD, which is not what is counted here.
        async with locks.lock("warm-up"):
            pass
        lock = locks.lock("handoff")
        await lock.acquire()
        served: list[int] = []

        async def waiter(i: int) -> None:
            async with locks.lock("handoff") as mine:
                served.append(i)
                assert mine.fencing_token is not None

        tasks = []
        for i in range(10):
            tasks.append(asyncio.create_task(waiter(i)))
            await eventually(lambda: locks.statistics().hub.waiters == len(tasks), what="queue")
        await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="subscription")
        # The head retries once after subscribing: waited out, not slept on.
        await eventually(
            unchanged_for(lambda: trips.sends), what="the head's retry after subscribing"
        )
        trips.sends = 0
        await lock.release()  # hands the lock to the head, which hands it on, ...
        await within(asyncio.gather(*tasks), what="10 hand-overs")
        assert served == list(range(10))
        # 10 hand-overs and one final release; nobody re-acquires, nobody is woken to retry
        # (the pub/sub UNSUBSCRIBE at the end may or may not have been sent yet)
        assert trips.sends in (11, 12)
        assert not await lock.locked()
    await client.aclose()


async def test_no_handoff_starves_a_waiter_of_another_process(redis_url: str, prefix: str) -> None:
    async with (
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as busy,
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as other,
    ):
        stop = asyncio.Event()
        turns: list[int] = []

        async def hog(i: int) -> None:
            while not stop.is_set():
                async with busy.lock("hog"):
                    turns.append(i)
                    await asyncio.sleep(0.001)

        hogs = [asyncio.create_task(hog(i)) for i in range(4)]
        await eventually(
            lambda: len(set(turns[-8:])) > 1 and len(turns) >= 20,
            what="the hogs to hand the lock around among themselves",
        )
        started = time.monotonic()
        async with other.lock("hog", timeout=2 * PATIENCE):
            waited = time.monotonic() - started
        stop.set()
        await within(asyncio.gather(*hogs), what="the hogs to stop")
        # woken by a message: hand-overs stop once it listens too (starved, it would wait
        # until its timeout; the margin is for a loaded machine)
        assert waited < PATIENCE / 2, f"the other process waited {waited:.1f} s"
        await busy.redis.aclose()
        await other.redis.aclose()


@pytest.mark.parametrize("asleep", [True, False], ids=["waiting", "trying"])
async def test_a_release_does_not_hand_the_lock_to_a_waiter_being_cancelled(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch, asleep: bool
) -> None:
    """Issue 23: the waiter's task is cancelled in the loop step in which the holder
    releases. A hand-over to it would land after it left and cost one more release to
    pass the lock on (at a graceful shutdown, after the manager had closed): the release
    frees the lock instead. *asleep*: the waiter sleeps for its turn (its future is
    cancelled at once) or is about to try (only Task.cancelling() tells, 3.11+)."""
    if not asleep and sys.version_info < (3, 11):
        pytest.skip("Python 3.10 has no Task.cancelling(): only a sleeping waiter is seen")
    from aiolock._engine.release import ReleasePath

    handed: list[str] = []
    deliver = ReleasePath._deliver

    async def spy(self: ReleasePath, hold: Any, handoff: Any, token: int) -> None:
        handed.append(hold.keys.name)
        await deliver(self, hold, handoff, token)

    monkeypatch.setattr(ReleasePath, "_deliver", spy)
    engine = locks._engine
    assert engine is not None
    holder = locks.lock("cancelled-waiter")
    await holder.acquire()
    waiter = asyncio.create_task(locks.lock("cancelled-waiter").acquire())

    def sleeping() -> bool:  # the waiter sleeps in Waiter.wait() after a busy attempt
        # Its future still pending: one already woken (the subscription's confirmation
        # wakes the head to try once more) is "about to try", the other case; on Python
        # 3.10 a loaded CI machine once cancelled it there and saw the lock handed over.
        queues = engine.hub._queues.values()
        return any(
            w._future is not None and not w._future.done() for q in queues for w in q.waiters
        )

    await eventually(sleeping, what="the waiter asleep")
    if not asleep:
        engine.hub.wake(holder._keys.channel)  # it will try next
    waiter.cancel()
    await holder.release()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert handed == [], "the lock was handed to a waiter being cancelled"
    assert not await holder.locked()
