"""Fencing tokens across a failover to a replica that lags (issue 36 item 2).

A Sentinel deployment of one primary, one replica and three sentinels, each a
redis-server this module starts on loopback and stops by pid. The replica stops
replicating (``REPLICAOF NO ONE``: it keeps the copy it has), the primary grants the
lock a few more times, then it is killed with SIGKILL and ``SENTINEL FAILOVER`` promotes
the replica, whose copy of the name's state is older than the tokens the clients saw.
The next grant through the same manager must still get a larger token: before issue 36
it counted on from the copy's last token and handed out tokens already given.
"""

from __future__ import annotations

import asyncio
import signal

import pytest
from redis.asyncio import Redis

import aiolock
from tests._support.helpers import eventually
from tests._support.sentinel_servers import SERVICE, SentinelGroup


async def _grant(lock: aiolock.Lock, seen: list[int]) -> None:
    async with lock:
        assert lock.fencing_token is not None
        seen.append(lock.fencing_token)


@pytest.mark.processes
async def test_tokens_rise_across_a_failover_to_a_replica_that_lags(prefix: str) -> None:
    with SentinelGroup(replicas=1, sentinels=3) as group:
        old = group.primary_port()
        (replica_port,) = (node.port for node in group.nodes if node.port != old)
        replica = Redis(host="127.0.0.1", port=replica_port)
        locks = aiolock.LockManager.from_sentinel(
            group.addresses, SERVICE, prefix=prefix, lease=3.0, socket_timeout=1.0
        )
        try:
            async with locks:
                lock = locks.lock("fenced")
                seen: list[int] = []
                for _ in range(3):
                    await _grant(lock, seen)
                # The key is read on the replica: its copy of the state is what the test
                # is about. Replicated up to the third grant, then it stops replicating.
                key = lock.key

                async def caught_up() -> bool:
                    state = await replica.get(key)
                    return isinstance(state, bytes) and state.endswith(b"|%d" % seen[-1])

                await eventually(caught_up, what="the third grant replicated")
                await replica.replicaof("NO", "ONE")
                copy = await replica.get(key)
                for _ in range(5):  # grants the replica never gets
                    await _grant(lock, seen)
                assert await replica.get(key) == copy  # it lags: the older free state

                group.signal(old, signal.SIGKILL)
                group.failover()
                new = await asyncio.to_thread(group.wait_for_new_primary, old)
                assert new == replica_port
                await eventually(
                    lambda: locks.statistics().failovers == 1, what="the manager followed"
                )
                await lock.acquire(timeout=10)
                try:
                    assert lock.fencing_token is not None
                    assert lock.fencing_token > max(seen), (lock.fencing_token, seen)
                finally:
                    await lock.release()
        finally:
            await replica.aclose()
