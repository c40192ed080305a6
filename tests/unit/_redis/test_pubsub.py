"""The pub/sub hub: no polling, one connection, survives a killed connection; round trips."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection

import anyio
from redis.asyncio import Redis

import aiolock
from aiolock._redis.pubsub import Subscriber, SubscriptionEvents
from tests._support.helpers import PATIENCE, counting_client, eventually, unchanged_for, within


async def test_an_uncontended_cycle_costs_two_round_trips(redis_url: str, prefix: str) -> None:
    client, trips = counting_client(redis_url)
    async with aiolock.LockManager(client, prefix=prefix) as locks:
        lock = locks.lock("rt")
        async with lock:  # warm up: scripts loaded, connection open
            pass
        trips.sends = 0
        for _ in range(10):
            async with lock:
                pass
        assert trips.sends == 20
        trips.sends = 0
        await lock.acquire()
        await lock.acquire()  # re-entry: one round trip
        await lock.release()
        await lock.release()
        assert trips.sends == 4
    await client.aclose()


async def test_concurrent_commands_go_out_in_pipelines_of_at_most_max_batch(
    redis_url: str, prefix: str
) -> None:
    """64 tasks acquire and release 64 names at once: the commands that find every
    connection busy go out in pipelines of at most Client.MAX_BATCH, so Redis runs one
    while the client reads another's replies (in one pipeline of them all, the two took
    turns; W2 ran 1.3x-1.6x faster with 16 than with 512)."""
    from aiolock._redis.client import Client

    client, trips = counting_client(redis_url)
    async with aiolock.LockManager(client, prefix=prefix) as locks:

        async def cycle(i: int) -> None:
            async with locks.lock(f"batch-{i}"):
                pass

        # Warm up: scripts loaded, the manager's 3 connections open (each new one sends
        # its handshake commands, which would count here).
        await asyncio.gather(*(cycle(i) for i in range(64)))
        trips.batches.clear()
        await asyncio.gather(*(cycle(i) for i in range(64)))
        batches = list(trips.batches)
    await client.aclose()
    assert sum(batches) == 128  # 64 acquires and 64 releases, nothing else
    assert max(batches) == Client.MAX_BATCH == 16  # 61 were queued at once
    assert len(batches) >= 128 // Client.MAX_BATCH


async def test_waiting_tasks_send_no_commands(redis_url: str, prefix: str) -> None:
    client, trips = counting_client(redis_url, client_name=f"{prefix}-waiters")
    async with (
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix, lease=30) as holder_side,
        # (top_k=0: no contention summary, whose writes while figures change are the
        # manager's, not the waiters'; tests/unit/_engine/test_contention.py counts them)
        aiolock.LockManager(client, prefix=prefix, lease=30, top_k=0) as locks,
    ):
        await holder_side.lock("quiet").acquire()
        tasks = [asyncio.create_task(locks.lock("quiet").acquire()) for _ in range(200)]
        await eventually(lambda: locks.statistics().hub.waiters == 200, what="200 waiters")
        await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="subscription")
        # The head retries once after subscribing: waited out (however long a loaded
        # machine makes it), not slept on.
        await eventually(
            unchanged_for(lambda: trips.sends), what="the head's retry after subscribing"
        )
        before = trips.sends
        await asyncio.sleep(1.0)
        assert trips.sends == before  # not one command while 200 tasks wait
        clients = await holder_side.redis.client_list()
        ours = [c for c in clients if c.get("name") == f"{prefix}-waiters"]
        assert 1 <= len(ours) <= 4, ours  # a few command connections plus one pub/sub
        await holder_side.lock("quiet").release()
        # the head of the queue gets it (and keeps it: acquire() without release)
        done, _ = await asyncio.wait(tasks, timeout=PATIENCE, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, f"{len(done)} of 200 waiters got the lock within {PATIENCE} s"
        assert locks.statistics().hub.waiters == 199
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await holder_side.redis.aclose()
    await client.aclose()


async def test_waiters_survive_a_killed_pubsub_connection(
    redis_url: str, prefix: str, redis: Redis
) -> None:
    async with (
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix, lease=30) as holder_side,
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix, lease=30) as locks,
    ):
        held = holder_side.lock("killed")
        await held.acquire()
        got: list[int] = []

        async def waiter(i: int) -> None:
            async with locks.lock("killed"):
                got.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(10)]
        await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="subscription")
        for round_ in range(1, 4):
            killed = await redis.client_kill_filter(_type="pubsub")
            assert int(killed) >= 1

            def resubscribed(after: int = round_) -> bool:
                hub = locks.statistics().hub
                return hub.subscriptions == 1 and hub.reconnects >= after

            await eventually(resubscribed, what="the hub to reconnect and resubscribe")
            assert len(got) == 0  # still held by the other manager
        started = time.monotonic()
        await held.release()  # may land while the hub is reconnecting
        await within(asyncio.gather(*tasks), what="10 waiters after the release")
        waited = time.monotonic() - started
        assert waited < 15, f"{waited:.1f} s: the 30 s lease, not the release, woke them"
        assert sorted(got) == list(range(10))
        await eventually(lambda: locks.statistics().hub.subscriptions == 0, what="unsubscribe")
        await holder_side.redis.aclose()
        await locks.redis.aclose()


async def test_a_subscription_pass_looks_only_at_the_channels_that_changed(
    redis_url: str, prefix: str
) -> None:
    """Issue 24: each pass of the subscription pump scanned every waited-on name, so
    waking N waiters one after another cost O(N^2). With N waiters subscribed, one that
    gets its lock and leaves makes a pass that looks at its own channel only."""
    n = 300
    async with (
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as holder_side,
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as locks,
    ):
        held = [holder_side.lock(f"many-{i}") for i in range(n)]
        for lock in held:
            await lock.acquire()
        done: list[int] = []

        async def waiter(i: int) -> None:
            async with locks.lock(f"many-{i}", timeout=60):
                done.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(n)]
        try:
            await eventually(
                lambda: locks.statistics().hub.subscriptions == n, timeout=30, what="n subscribed"
            )
            hub = locks._engine.hub  # type: ignore[union-attr]
            # Subscribing n waiters looked at each channel about once (passes batch them).
            assert hub.examined <= 2 * n, hub.examined
            before = hub.examined
            await held[0].release()
            await eventually(
                lambda: locks.statistics().hub.subscriptions == n - 1, what="one unsubscribed"
            )
            assert done == [0]
            assert 1 <= hub.examined - before <= 2, hub.examined - before
        finally:
            for lock in held[1:]:
                await lock.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert sorted(done) == list(range(n))
        await holder_side.redis.aclose()
        await locks.redis.aclose()


class _CountingQueues(dict):  # type: ignore[type-arg]
    """The hub's queues, counting the walks over all of them."""

    walks = 0

    def values(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().values()


async def test_statistics_do_not_walk_the_waited_on_names(redis_url: str, prefix: str) -> None:
    """Issue 24: ``statistics()`` summed over every queue three times, so a caller that
    polls it (a dashboard, the scale benchmark's wait for N subscriptions) paid O(N) per
    look. The hub keeps the counts as queues change: asking walks no queue, and the
    counts match a recount through joins, confirmations, wakes and leaves."""
    n = 50
    async with (
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as holder_side,
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as locks,
    ):
        hub = locks._engine.hub  # type: ignore[union-attr]
        hub._queues = _CountingQueues(hub._queues)

        def recount() -> tuple[int, int, int]:
            queues = list(dict.values(hub._queues))
            return (
                sum(1 for q in queues if q.waiters),
                sum(len(q.waiters) for q in queues),
                sum(1 for q in queues if q.confirmed),
            )

        def counted() -> tuple[int, int, int]:
            hub_stats = locks.statistics().hub
            return hub_stats.queues, hub_stats.waiters, hub_stats.subscriptions

        held = [holder_side.lock(f"stat-{i}") for i in range(n)]
        for lock in held:
            await lock.acquire()

        async def waiter(i: int) -> None:
            async with locks.lock(f"stat-{i % n}", timeout=60):
                pass

        # two waiters on each name: a head and one behind it
        tasks = [asyncio.create_task(waiter(i)) for i in range(2 * n)]
        try:
            await eventually(lambda: counted() == (n, 2 * n, n), timeout=30, what="subscribed")
            assert counted() == recount()
            walks = _CountingQueues.walks
            for _ in range(100):
                locks.statistics()
            assert _CountingQueues.walks == walks
            for lock in held[: n // 2]:
                await lock.release()
            await eventually(
                lambda: counted() == (n - n // 2, n, n - n // 2), timeout=30, what="half done"
            )
            assert counted() == recount()
        finally:
            for lock in held[n // 2 :]:
                await lock.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await eventually(lambda: counted() == (0, 0, 0), timeout=30, what="all unsubscribed")
        assert counted() == recount()
        await holder_side.redis.aclose()
        await locks.redis.aclose()


# --------------------------------------------------------------------------------------
# The one pub/sub reader loop (aiolock._redis.pubsub.Subscriber) on its own, against a server.


class Recorder(SubscriptionEvents):
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def on_message(self, channel: str, data: str) -> None:
        self.events.append(("message", (channel, data)))

    def on_confirmed(self, channel: str) -> None:
        self.events.append(("confirmed", channel))

    def on_unconfirmed(self, channel: str) -> None:
        self.events.append(("unconfirmed", channel))

    def on_dropped(self, channel: str) -> None:
        self.events.append(("dropped", channel))

    def on_lost(self, channels: Collection[str]) -> None:
        self.events.append(("lost", frozenset(channels)))

    def count(self, event: tuple[str, object]) -> int:
        return self.events.count(event)


async def test_a_subscriber_follows_its_wanted_set_and_survives_a_killed_connection(
    redis: Redis, admin: Redis, prefix: str
) -> None:
    one, two = f"{prefix}:one", f"{prefix}:two"
    seen = Recorder()
    subscriber = Subscriber(redis, seen)
    async with anyio.create_task_group() as tg:
        tg.start_soon(subscriber.run)
        subscriber.want(one)
        subscriber.want(two)
        await eventually(lambda: seen.count(("confirmed", two)) == 1, what="confirmations")
        await admin.publish(one, "hello")
        await eventually(lambda: ("message", (one, "hello")) in seen.events, what="message")

        # A killed connection: both channels reported lost, then subscribed again.
        await admin.client_kill_filter(_type="pubsub")
        await eventually(lambda: ("lost", frozenset({one, two})) in seen.events, what="lost")
        await eventually(lambda: seen.count(("confirmed", two)) == 2, what="resubscribed")
        assert subscriber.tally.reconnects >= 1 and subscriber.tally.losses >= 1

        # No longer wanted: unsubscribed, then reported dropped; the other one stays.
        examined = subscriber.tally.examined
        subscriber.unwant(one)
        await eventually(lambda: ("dropped", one) in seen.events, what="dropped")
        assert ("unconfirmed", one) in seen.events
        assert subscriber.tally.examined - examined == 1  # only what changed is looked at
        assert not subscriber.subscribed(one) and subscriber.subscribed(two)
        await eventually(lambda: not subscriber.listening(one), what="the unsubscription")
        tg.cancel_scope.cancel()
