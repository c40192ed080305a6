"""The pub/sub connection is killed again and again, before and during a hand-off chain.

Waiters sleep on pub/sub with a 30 s lease as their only fallback: a wake-up lost to a
killed connection would stall the chain for up to 30 s, so finishing well within 5 s
shows that every kill was recovered from (resubscribe, then every queue head retries).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing import RedisServer
from tests._support.faults import bounded, eventually, unique_prefix

LEASE = 30.0


def _unsubscribed(manager: aiolock.LockManager) -> bool:
    return manager.statistics().hub.subscriptions == 0


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of this test alone: CLIENT KILL TYPE pubsub hits no other test."""
    with RedisServer() as server:
        yield server


async def test_waiters_survive_pubsub_kills_before_and_during_the_handoff(
    own_server: RedisServer,
) -> None:
    url = own_server.url
    prefix = unique_prefix("ps-kill")
    admin = Redis.from_url(url)
    clients = [Redis.from_url(url) for _ in range(3)]
    got: list[tuple[str, int]] = []
    inside = 0
    overlaps = 0

    async def waiter(locks: aiolock.LockManager, label: str, i: int) -> None:
        nonlocal inside, overlaps
        async with locks.lock("chain", timeout=120):
            inside += 1
            overlaps += inside != 1
            got.append((label, i))
            await asyncio.sleep(0.05)
            inside -= 1

    kills_before = kills_during = 0
    try:
        async with (
            aiolock.LockManager(clients[0], prefix=prefix, lease=LEASE) as holder_side,
            aiolock.LockManager(clients[1], prefix=prefix, lease=LEASE) as left,
            aiolock.LockManager(clients[2], prefix=prefix, lease=LEASE) as right,
        ):
            held = holder_side.lock("chain")
            await held.acquire()
            tasks: list[asyncio.Task[None]] = []
            for i in range(10):  # one at a time, so that each queue's order is known
                for label, m in (("left", left), ("right", right)):
                    tasks.append(asyncio.create_task(waiter(m, label, i)))

                    def queued(m: aiolock.LockManager = m, n: int = i + 1) -> bool:
                        return m.statistics().hub.waiters == n

                    await eventually(queued, what="a waiter")

            def settled(after: int) -> bool:
                # (The holder's manager listens there too, for a release it did not make.)
                holder = holder_side.statistics().hub
                return (
                    holder.subscriptions == 1
                    and holder.reconnects >= after
                    and all(
                        m.statistics().hub.waiters == 10
                        and m.statistics().hub.subscriptions == 1
                        and m.statistics().hub.reconnects >= after
                        for m in (left, right)
                    )
                )

            await eventually(lambda: settled(0), what="20 waiters, subscribed")
            for round_ in range(1, 4):
                killed = int(await admin.client_kill_filter(_type="pubsub"))
                assert killed == 3, killed  # one pub/sub connection per manager
                kills_before += 1
                await eventually(
                    functools.partial(settled, round_), what="reconnect and resubscribe"
                )
            assert got == []
            released_at = time.monotonic()
            await held.release()
            # Keep killing while the lock is handed from task to task, across managers.
            for _ in range(40):
                if all(task.done() for task in tasks):
                    break
                await asyncio.sleep(0.1)
                if int(await admin.client_kill_filter(_type="pubsub")) > 0:
                    kills_during += 1
            await bounded(asyncio.gather(*tasks), 2 * LEASE, "the hand-off chain")
            elapsed = time.monotonic() - released_at
            for m in (left, right):
                await eventually(functools.partial(_unsubscribed, m), what="unsubscribed")
                stats = m.statistics()
                assert stats.hub.waiters == 0 and stats.hub.queues == 0, stats
                assert stats.hub.reconnects >= kills_before, stats
                assert stats.held == 0, stats
            reconnects = [m.statistics().hub.reconnects for m in (left, right)]
    finally:
        for client in (admin, *clients):
            await client.aclose()
    print(
        f"\nchain of 20 finished {elapsed:.2f} s after the release; pub/sub kills: "
        f"{kills_before} before, {kills_during} during; reconnects {reconnects}"
    )
    assert sorted(got) == sorted(
        [("left", i) for i in range(10)] + [("right", i) for i in range(10)]
    )
    assert overlaps == 0
    assert elapsed < 5.0, f"the chain took {elapsed:.2f} s: a wake-up was lost"
    assert kills_during >= 3
    # first come, first served within each process
    for label in ("left", "right"):
        assert [i for lab, i in got if lab == label] == list(range(10))
