"""The per-name contention table (aiolock._engine.contention) on its own, and as a
manager fills it against a real server (``LockManager.statistics().names``)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.contention import (
    MAX_TOP_K,
    SAMPLES,
    SUMMARY_FIELDS,
    TOP_NAME,
    TOP_PERIOD,
    Contention,
    keep_published,
    parse_summary,
    top_summary,
)
from tests._support.helpers import eventually


def test_the_table_keeps_the_heavy_hitters_within_top_k_entries() -> None:
    """Space-saving: 5,000 names that wait a little each and 3 that wait a lot; the table
    never holds more than top_k names, and the 3 heavy ones are its first three."""
    table = Contention(10)
    rng = random.Random(7)
    heavy = {f"heavy{i}": 0.0 for i in range(3)}
    for step in range(20_000):
        if step % 4 == 0:
            name = rng.choice(list(heavy))
            heavy[name] += 0.05
            table.waited(name, "lock", name, 0.05)
        else:
            name = f"light{rng.randrange(5_000)}"
            table.waited(name, "lock", name, 0.001)
        assert len(table) <= 10
    rows = table.snapshot()
    assert {row.name for row in rows[:3]} == set(heavy)
    for row in rows[:3]:
        # never understated; overstated by at most the total it inherited (error)
        assert heavy[row.name] - 1e-6 <= row.wait_seconds <= heavy[row.name] + row.error + 1e-6


def test_a_name_that_never_waited_evicts_nobody() -> None:
    table = Contention(2)
    table.waited("a", "lock", "a", 0.5)
    table.waited("b", "lock", "b", 0.2)
    for i in range(100):
        table.acquired(f"free{i}", "lock", f"free{i}")
    assert [row.name for row in table.snapshot()] == ["a", "b"]
    table.waited("c", "lock", "c", 0.1)  # a wait does evict: the least-waited name
    rows = {row.name: row for row in table.snapshot()}
    assert set(rows) == {"a", "c"}
    assert rows["c"].error == 0.2 and rows["c"].wait_seconds == pytest.approx(0.3)


def test_top_k_zero_keeps_nothing() -> None:
    table = Contention(0)
    table.acquired("a", "lock", "a")
    table.waited("a", "lock", "a", 1.0)
    table.lost("a", "lock", "a")
    table.timed_out("a", "lock", "a")
    assert table.snapshot() == ()


def test_percentiles_are_over_the_latest_samples() -> None:
    table = Contention(1)
    for _ in range(SAMPLES):
        table.waited("a", "lock", "a", 10.0)
    for i in range(SAMPLES):  # the older samples are gone
        table.waited("a", "lock", "a", (i + 1) / 1000)
        table.held("a", 0.002)
    row = table.snapshot()[0]
    assert row.wait_p99 == pytest.approx(0.254) and row.wait_p50 == pytest.approx(0.129)
    assert row.hold_p50 == row.hold_p99 == 0.002
    assert row.wait_seconds == pytest.approx(10.0 * SAMPLES + sum(range(1, SAMPLES + 1)) / 1000)


def test_the_summary_round_trips_and_cuts_long_names() -> None:
    table = Contention(3)
    long = "x" * (TOP_NAME + 50)
    table.waited("r1", "lock", "hot", 0.5)
    table.waited("r2", "semaphore", long, 0.1)
    rows = table.snapshot()
    before = {("lock", "hot"): 0}
    table.acquired("r1", "lock", "hot")
    table.acquired("r1", "lock", "hot")
    value = top_summary(table.snapshot(), before, 2.0)
    parsed = parse_summary(value)
    assert parsed is not None and [r["name"] for r in parsed] == ["hot", "x" * (TOP_NAME - 1) + "…"]
    assert set(parsed[0]) == set(SUMMARY_FIELDS)
    assert parsed[0]["grants_per_s"] == 1.0 and parsed[1]["grants_per_s"] == 0.0
    assert len(rows) == 2
    assert parse_summary("not json") is None and parse_summary(json.dumps({"n": 1})) is None
    assert parse_summary(json.dumps({"n": [[1, 2]]})) == []  # a row of another shape


@pytest.mark.parametrize("value", [-1, MAX_TOP_K + 1, 2.5, "20", True, None])
def test_a_bad_top_k_is_refused_at_the_call(value: object) -> None:
    with pytest.raises((TypeError, ValueError), match="top_k"):
        aiolock.LockManager(Redis(), top_k=value)  # type: ignore[arg-type]


# -- a manager, against the suite's server -------------------------------------------------


async def test_one_process_sees_its_own_contention(redis: Redis, prefix: str) -> None:
    """Issue 38: with every waiter in one process, the waits are local hand-overs that
    nothing in Redis shows; the manager's statistics count them."""
    async with aiolock.LockManager(redis, prefix=prefix, top_k=5) as locks:

        async def task(name: str, times: int) -> None:
            for _ in range(times):
                async with locks.lock(name):
                    await asyncio.sleep(0.002)

        await asyncio.gather(*(task("hot", 20) for _ in range(6)), task("cold", 20))
        rows = locks.statistics().names
        assert [row.name for row in rows[:2]] == ["hot", "cold"]
        hot, cold = rows[0], rows[1]
        assert hot.kind == "lock" and hot.acquisitions == 120
        assert hot.waits >= 100 and hot.handovers >= 100 and hot.wait_seconds > 0
        assert 0 < hot.wait_p50 <= hot.wait_p99
        assert 0.002 <= hot.hold_p50 <= hot.hold_p99
        assert cold.acquisitions == 20 and cold.waits == 0 and cold.wait_seconds == 0
        assert hot.waiting == cold.waiting == 0  # nobody waits any more


async def test_timeouts_and_losses_are_counted_per_name(redis: Redis, prefix: str) -> None:
    async with (
        aiolock.LockManager(redis, prefix=prefix) as locks,
        aiolock.LockManager(redis, prefix=prefix) as others,
    ):
        held = locks.lock("busy")
        await held.acquire()
        waiter = asyncio.create_task(others.lock("busy").try_acquire(timeout=0.3))
        await asyncio.sleep(0.1)
        (row,) = [r for r in others.statistics().names if r.name == "busy"]
        assert row.waiting == 1  # waiting now
        assert await waiter is False
        await held.force_release()
        with pytest.raises(aiolock.LockLostError):
            await held.release()
        (theirs,) = others.statistics().names
        assert theirs.timeouts == 1 and theirs.waits == 1 and theirs.waiting == 0
        assert theirs.wait_seconds >= 0.25
        (mine,) = locks.statistics().names
        assert mine.losses == 1 and mine.acquisitions == 1


async def test_top_k_zero_turns_the_statistics_off(redis: Redis, prefix: str) -> None:
    async with aiolock.LockManager(redis, prefix=prefix, top_k=0) as locks:
        async with locks.lock("a"):
            pass
        assert locks.statistics().names == ()


async def test_a_name_stuck_behind_its_holder_shows_while_its_tasks_wait(
    redis: Redis, prefix: str
) -> None:
    """The table is full of names that waited a little; a name whose tasks wait behind a
    hung holder ranks first while they wait, before any of their waits has ended."""
    async with (
        aiolock.LockManager(redis, prefix=prefix) as holder,
        aiolock.LockManager(redis, prefix=prefix, top_k=3) as locks,
    ):

        async def briefly(name: str) -> None:
            async with locks.lock(name):
                await asyncio.sleep(0.01)

        for i in range(3):
            await asyncio.gather(briefly(f"quick{i}"), briefly(f"quick{i}"))
        assert len(locks.statistics().names) == 3
        hung = holder.lock("stuck")
        await hung.acquire()
        waiters = [asyncio.create_task(locks.lock("stuck").acquire()) for _ in range(4)]
        await asyncio.sleep(0.3)
        first = locks.statistics().names[0]
        assert (first.name, first.waiting, first.waits) == ("stuck", 4, 0)
        assert first.waiting_seconds >= 4 * 0.25
        assert len(locks.statistics().names) == 3  # still bounded by top_k
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await hung.release()
        stuck = [row for row in locks.statistics().names if row.name == "stuck"]
        assert stuck and stuck[0].waiting == 0 and stuck[0].waits == 4


async def test_the_summary_is_written_while_it_changes_and_not_while_it_stays(
    redis: Redis, prefix: str
) -> None:
    """The contention summary (its key is what this test is about) is rewritten while its
    figures change, and not while 50 tasks wait on and nothing else happens (until a
    third of the lease); it goes with the identity record."""
    async with (
        aiolock.LockManager(redis, prefix=prefix) as holder_side,
        aiolock.LockManager(redis, prefix=prefix, lease=30) as locks,
    ):
        summary = f"{prefix}:mgr:{{{locks.id}}}:top"
        await holder_side.lock("busy").acquire()
        tasks = [asyncio.create_task(locks.lock("busy").acquire()) for _ in range(50)]
        await eventually(lambda: locks.statistics().hub.waiters == 50, what="50 waiters")

        async def written() -> float | None:
            raw = await redis.get(summary)
            rows = parse_summary(raw)
            if raw is None or not rows or rows[0]["waiting"] != 50:
                return None
            return float(json.loads(raw)["t"])

        async def has_waiters() -> bool:
            return await written() is not None

        await eventually(has_waiters, what="the summary with the 50 waiters")
        first = await written()
        await asyncio.sleep(2.5 * TOP_PERIOD)
        assert await written() == first  # the same figures: not written again
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

        async def rewritten() -> bool:
            rows = parse_summary(await redis.get(summary))
            return (
                rows is not None
                and rows[:1] != []
                and (rows[0]["waiting"], rows[0]["waits"]) == (0, 50)
            )

        await eventually(rewritten, what="the changed figures' write")
    assert not await redis.exists(summary)  # deleted with the identity record


async def test_the_summary_waits_while_the_managers_round_trips_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under an outage or a slow network the summary is not written: the lock operations
    get the manager's connections (the publisher's own loop, with a recording call)."""
    monkeypatch.setattr("aiolock._engine.contention.TOP_PERIOD", 0.01)
    table = Contention(3)
    table.waited("r", "lock", "hot", 0.5)
    writes: list[tuple[object, ...]] = []

    async def call(*args: object, key: str) -> None:
        writes.append(args)

    reachable = False
    publisher = asyncio.create_task(
        keep_published(table, call, "p:mgr:{x}:top", 30.0, lambda: reachable)
    )
    await asyncio.sleep(0.2)
    assert writes == []  # unreachable: nothing written
    reachable = True
    await eventually(lambda: len(writes) == 1, what="the write once reachable")
    publisher.cancel()
    await asyncio.gather(publisher, return_exceptions=True)
    assert writes[0][:2] == ("SET", "p:mgr:{x}:top")
