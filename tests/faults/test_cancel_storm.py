"""Thousands of random cancellations, in one process and across processes, leave nothing
behind: no lock held in Redis, no hold, waiter, queue or pending cleanup in any manager,
no leaked task.

Sizes: ~2,000 delivered cancellations per test by default; ``AIOLOCK_LONG=1`` raises it
to 10,000 per test. Delivered means the task really ended cancelled (``task.cancelled()``).
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock.testing import RedisServer
from tests._support.faults import LONG, Child, bounded, children, eventually, unique_prefix
from tests._support.helpers import lock_held
from tests._support.proxy import FaultProxy
from tests._support.storm import StormReport, alive_since, storm

NAMES = [f"storm-{i}" for i in range(4)]
SEED = int(os.environ.get("AIOLOCK_STORM_SEED", "20261120"))

#: The one warning a storm may log: a cancelled final release is resent after another
#: owner acquired and released the lock, and the resend answers "not held" (see
#: ``test_a_resent_release_succeeds_after_another_owner_came_and_went``). The caller was
#: cancelled, so nothing surfaces but this log line.
KNOWN_WARNING = "lost: Redis no longer had it when it was released"


def _check(report: StormReport, target: int) -> None:
    text = json.dumps(report.to_json(), indent=1)
    assert report.unexpected == [], text
    assert report.hung == 0, text
    assert report.cancelled >= target, text
    # cancellations landed in every phase, not only before the tasks started
    for phase in ("acquire", "body", "release"):
        assert report.phases[phase] >= target // 50, (phase, text)
    assert report.drained, text
    assert report.final == {"held": 0, "waiters": 0, "queues": 0, "pending_cleanups": 0}, text
    assert report.leaked == [], text
    assert report.after_close == [], text
    assert report.max_waiters > 0, text  # tasks really queued on busy locks
    assert all(KNOWN_WARNING in w for w in report.warning_samples), text


async def _assert_nothing_held(url: str, prefix: str) -> None:
    check = Redis.from_url(url)
    try:
        for name in NAMES:
            key = f"{prefix}:lock:{{{name}}}"
            assert not await lock_held(check, key), f"{key} still held: {await check.get(key)!r}"
    finally:
        await check.aclose()


async def test_random_cancellations_in_one_process(fault_redis_server: RedisServer) -> None:
    target = 10_000 if LONG else 2_000
    prefix = unique_prefix("storm")
    baseline = set(asyncio.all_tasks())
    client = Redis.from_url(fault_redis_server.url)
    try:
        async with aiolock.LockManager(client, prefix=prefix) as manager:
            async with manager.lock("warm-up"):
                pass
            report = await storm(
                manager, NAMES, target=target, seed=SEED, max_seconds=120 if LONG else 40
            )
        report.after_close = alive_since(baseline)
    finally:
        await client.aclose()
    print(f"\none process: {json.dumps(report.to_json())}")
    _check(report, target)
    await _assert_nothing_held(fault_redis_server.url, prefix)


async def test_random_cancellations_across_processes(fault_redis_server: RedisServer) -> None:
    """Three child processes and this one run storms on the same names at once."""
    target = 10_000 if LONG else 2_000
    processes = 3
    share = target // (processes + 1) + 1
    max_seconds = 150.0 if LONG else 45.0
    prefix = unique_prefix("storm-x")
    url = fault_redis_server.url
    spec = {"url": url, "prefix": prefix, "names": NAMES, "target": share}
    made = [
        Child(
            "storm",
            {
                **spec,
                "seed": SEED + i,
                "max_seconds": max_seconds,
            },
        )
        for i in range(1, processes + 1)
    ]
    total = StormReport()
    async with children(*made):
        for child in made:
            await child.expect("READY", 60)
        client = Redis.from_url(url)
        baseline = set(asyncio.all_tasks())
        try:
            async with aiolock.LockManager(client, prefix=prefix) as manager:
                for child in made:
                    await child.send(b"go\n")
                mine = await storm(manager, NAMES, target=share, seed=SEED, max_seconds=max_seconds)
            mine.after_close = alive_since(baseline)
        finally:
            await client.aclose()
        total.add(mine)
        _check(mine, share)
        for child in made:
            line = await child.expect("REPORT ", max_seconds + 60)
            report = StormReport.from_json(json.loads(line.removeprefix("REPORT ")))
            _check(report, share)
            total.add(report)
            assert await bounded(child.wait(30), 40, "child exit") == 0, child.explain()
    print(f"\nacross {processes + 1} processes: {json.dumps(total.to_json())}")
    assert total.cancelled >= target
    await _assert_nothing_held(url, prefix)


async def test_a_void_marker_of_one_manager_voids_no_attempt_of_another(
    fault_proxy: FaultProxy, fault_redis_server: RedisServer
) -> None:
    """End to end, through a lost command: the undo of one manager's attempt leaves a void
    marker; another manager's attempts on the free lock (one-shot and re-entries) are not
    voided by it. (Found by the cross-process storm: markers were keyed by an attempt
    number that every manager counts from 1.)"""
    prefix = unique_prefix("void")
    direct = Redis.from_url(fault_redis_server.url)
    client = Redis.from_url(fault_proxy.url, retry=Retry(NoBackoff(), 0))
    try:
        async with (
            aiolock.LockManager(client, prefix=prefix, command_timeout=0.3) as first,
            aiolock.LockManager(direct, prefix=prefix) as second,
        ):
            async with first.lock("warm-up", timeout=5):
                pass
            # An attempt of the first manager is lost on its way to Redis; its undo, sent
            # again once the path is back, leaves a void marker for that attempt.
            fault_proxy.blackhole("upstream")
            with pytest.raises(aiolock.LockConnectionError):
                await bounded(first.lock("v").acquire(timeout=0), 30, "the lost acquire")
            fault_proxy.restore()

            async def marked() -> bool:
                return bool(await direct.keys(f"{prefix}:lock:{{v}}:void:*"))

            await eventually(marked, what="the undo's void marker")
            # The second manager, on the free lock: one-shot attempts, then re-entries.
            refused = 0
            for _ in range(10):
                lock = second.lock("v")
                if await lock.try_acquire(timeout=0):
                    await lock.release()
                else:
                    refused += 1
            lock = second.lock("v")
            await lock.acquire(timeout=0)
            lost: aiolock.LockLostError | None = None
            try:
                for _ in range(10):
                    await lock.acquire(timeout=0)  # re-entry
            except aiolock.LockLostError as exc:
                lost = exc
    finally:
        await client.aclose()
        await direct.aclose()
    assert refused == 0, f"{refused} of 10 attempts on a free lock were refused"
    assert lost is None, f"a re-entry raised {lost!r}"
