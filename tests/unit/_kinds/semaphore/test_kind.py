"""What only the semaphore promises: the limit (under crashes too), leases, waking, the limit
stored in Redis, and the Permit API. The contract every kind keeps is in test_contract.py."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock._engine.kind import Attempt
from tests._children.semaphore import counter
from tests._support.helpers import PATIENCE, eventually
from tests._support.paths import REPO_ROOT
from tests._support.proxy import FaultProxy


@pytest.fixture
async def others(redis_url: str, prefix: str) -> AsyncIterator[list[aiolock.LockManager]]:
    """Three more managers on the same keys: other processes, as far as Redis can tell."""
    managers = [aiolock.LockManager.from_url(redis_url, prefix=prefix) for _ in range(3)]
    for manager in managers:
        await manager.__aenter__()
    try:
        yield managers
    finally:
        for manager in managers:
            await manager.aclose()


class Holder:
    """A task that acquires permits and holds them until told to release them (a permit
    belongs to the task that acquired it: a task that ends gives its permits back)."""

    def __init__(self, sem: aiolock.Semaphore, permits: int) -> None:
        self.got = asyncio.Event()
        self.permit: aiolock.Permit | None = None
        self._go = asyncio.Event()
        self.task = asyncio.create_task(self._run(sem, permits))

    async def _run(self, sem: aiolock.Semaphore, permits: int) -> None:
        self.permit = await sem.acquire(permits)
        self.got.set()
        await self._go.wait()
        await self.permit.release()

    async def acquired(self, timeout: float = PATIENCE) -> aiolock.Permit:
        # Milliseconds when all is well; the deadline is for a hang, not a loaded machine.
        await eventually(self.got.is_set, timeout=timeout, what="the holder's permits")
        assert self.permit is not None
        return self.permit

    async def release(self) -> None:
        self._go.set()
        await asyncio.wait_for(self.task, PATIENCE)


# -- the limit -------------------------------------------------------------------------


async def test_the_limit_holds_under_concurrency_in_one_process(
    locks: aiolock.LockManager, others: list[aiolock.LockManager], admin: Redis, prefix: str
) -> None:
    limit, inside, peak = 4, [0], [0]
    rng = random.Random(7)

    async def worker(manager: aiolock.LockManager) -> None:
        sem = manager.semaphore("pool", limit)
        for _ in range(12):
            want = rng.randint(1, 3)
            permit = await sem.acquire(want, timeout=20)
            # checked through Redis too, by a counter the semaphore does not know
            total = await admin.incrby(f"{prefix}:inside", want)
            inside[0] += want
            peak[0] = max(peak[0], inside[0], total)
            await asyncio.sleep(rng.uniform(0, 0.01))
            inside[0] -= want
            await admin.decrby(f"{prefix}:inside", want)
            await permit.release()

    managers = [locks, *others]
    await asyncio.gather(*(worker(managers[i % 4]) for i in range(12)))
    assert 3 <= peak[0] <= limit
    assert await locks.semaphore("pool", limit).available() == limit


@pytest.mark.processes
async def test_the_limit_holds_across_processes_with_killed_holders(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    processes, lease, limit = 4, 1.5, 5
    spec = {
        "url": redis_url, "prefix": prefix, "name": "shared", "limit": limit, "lease": lease,
        "processes": processes, "tasks": 4, "rounds": 25, "max_permits": 3, "hold": 0.03,
        "timeout": 15.0, "max_seconds": 40.0,
    }  # fmt: skip
    children = [_start_child({**spec, "index": i, "seed": i}) for i in range(processes)]
    try:
        killed = children[:2]
        for child in killed:  # kill them while they hold permits
            assert child.stdout is not None
            line = await asyncio.to_thread(child.stdout.readline)
            assert line.strip() == "READY", line
        await asyncio.sleep(0.05)
        for index, child in enumerate(killed):
            _kill(child)
            # Its permits stay counted by the checker for half a lease: surely less than
            # what they have left in Redis (renewed every third of the lease).
            await admin.pexpire(counter(prefix, index), int(lease * 500))
        results = []
        for child in children[2:]:
            out, err = await asyncio.to_thread(child.communicate, timeout=60)
            assert child.returncode == 0, err[-2000:]
            results.append(json.loads(out.strip().splitlines()[-1].removeprefix("DONE ")))
    finally:
        for child in children:
            _kill(child)
    violations = int(await admin.get(f"{prefix}:check:violations") or 0)
    log = await admin.lrange(f"{prefix}:check:violations:log", 0, 10)
    assert violations == 0, log
    # the survivors did all their work: the killed holders' permits came back
    assert all(r["timeouts"] == 0 for r in results), results
    assert sum(r["acquired"] for r in results) == 2 * 4 * 25


def _start_child(spec: dict[str, object]) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(
        [sys.executable, "-m", "tests._children.semaphore", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO_ROOT),
    )


def _kill(child: subprocess.Popen[str]) -> None:
    """SIGKILL a child of this test (by its pid) if it still runs."""
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(5)


# -- leases ----------------------------------------------------------------------------


async def test_expired_permits_are_reclaimed_by_lease(
    locks: aiolock.LockManager, others: list[aiolock.LockManager]
) -> None:
    sem = locks.semaphore("leased", 3)
    started = time.monotonic()  # before the lease begins: it ends 0.4 s after this at least
    crashed = await sem.acquire(3, lease=0.4)  # never released, as if its holder crashed
    taken = await others[0].semaphore("leased", 3).acquire(2, timeout=20)
    # At the lease's end (not before: the permits were taken back by the lease, not
    # granted twice), with room for a loaded machine; not when the waiter's own wait for a
    # lease it does not know (the 30 s default) ends.
    took = time.monotonic() - started
    assert 0.3 <= took < 0.4 + 3.5, f"the permits came back {took:.2f} s after a 0.4 s lease"
    await eventually(lambda: not crashed.held, what="the local loss")
    with pytest.raises(aiolock.LockLostError):
        await crashed.release()
    assert await sem.available() == 1
    await taken.release()


async def test_renewal_of_many_permits_is_batched(
    redis_url: str, prefix: str, others: list[aiolock.LockManager]
) -> None:
    # A 1.5 s lease, renewed every 0.5 s: a round that a loaded machine delays by a second
    # still keeps the permits (with 0.6 s, a 0.4 s stall lost all twelve).
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=1.5) as short:
        permits = [
            await short.semaphore(f"batch{i % 4}", 6).acquire(1 + i % 2, timeout=10)
            for i in range(12)
        ]
        before = short.statistics()
        # Four rounds, at least 0.5 s apart: the permits are older than a lease, and only
        # renewal kept them.
        await eventually(
            lambda: short.statistics().renewal_rounds - before.renewal_rounds >= 4,
            what="four renewal rounds",
        )
        after = short.statistics()
        rounds = after.renewal_rounds - before.renewal_rounds
        assert after.renewal_round_trips - before.renewal_round_trips == rounds  # one per round
        for i in range(4):
            assert await others[0].semaphore(f"batch{i}", 6).holders() == 3
        assert all(p.held for p in permits)
        for permit in permits:
            await permit.release()


# -- waking policy ---------------------------------------------------------------------


async def test_a_big_waiter_is_not_starved_by_small_ones_and_they_go_on_after_it(
    locks: aiolock.LockManager, others: list[aiolock.LockManager]
) -> None:
    limit, stop = 3, asyncio.Event()
    # Small permits granted, counted as each acquire returns. (Counted after the release
    # before: a release that freed the big one's last permit could return to its task
    # after the big one's grant had returned to the test, and count as if it ran during
    # the big hold: seen once under CI's load. An acquire granted before the big one's
    # grant returns before its own release is sent, so before that grant.)
    small_granted = [0]
    big: aiolock.Permit | None = None

    async def churn(manager: aiolock.LockManager) -> None:
        sem = manager.semaphore("fair", limit)
        while not stop.is_set():
            permit = await sem.acquire(1, timeout=10)
            small_granted[0] += 1
            await asyncio.sleep(0.02)
            await permit.release()

    churners = [asyncio.create_task(churn(others[i % 2])) for i in range(4)]
    try:
        await eventually(lambda: small_granted[0] >= 10, what="the small ones at work")
        started = time.monotonic()
        big = await locks.semaphore("fair", limit).acquire(3, timeout=PATIENCE * 2)
        # Served once the small holds in flight end (20 ms each), with room for a loaded
        # machine: a starved big waiter gets in only when all 3 happen to be free at once.
        took = time.monotonic() - started
        assert took < 5.0, f"the big waiter waited {took:.2f} s"
        during = small_granted[0]
        await asyncio.sleep(0.2)
        granted = small_granted[0] - during
        assert granted == 0, f"{granted} small permits granted while the big one held all 3"
        await big.release()
        await eventually(lambda: small_granted[0] >= during + 10, what="the small ones again")
    finally:
        stop.set()
        if big is not None and big.held:  # (a failed check: let the churners end at once)
            await big.release()
        await asyncio.gather(*churners)


async def test_within_a_process_waiters_are_served_in_order(
    locks: aiolock.LockManager, others: list[aiolock.LockManager]
) -> None:
    holder = await others[0].semaphore("order", 3).acquire(2)
    assert holder.permits == 2
    sem = locks.semaphore("order", 3)
    big = Holder(sem, 3)
    await eventually(lambda: locks.statistics().hub.waiters == 1, what="the big waiter")
    small = Holder(sem, 1)
    await eventually(lambda: locks.statistics().hub.waiters == 2, what="the small waiter")
    # 1 permit is free, but the small request queues behind the big one
    assert not small.got.is_set() and not big.got.is_set()
    # and a request of another process cannot take it either: the big one claimed it
    assert await others[1].semaphore("order", 3).try_acquire(1) is None
    await holder.release()
    await big.acquired()
    await asyncio.sleep(0.1)
    assert not small.got.is_set()
    await big.release()
    await small.acquired()
    await small.release()


async def test_a_release_of_several_permits_wakes_several_waiters_at_once(
    locks: aiolock.LockManager, others: list[aiolock.LockManager]
) -> None:
    everything = await locks.semaphore("wake", 4).acquire(4)  # lease 30 s: no timer helps
    waiters = [Holder(manager.semaphore("wake", 4), 1) for manager in (*others, others[0])]
    await eventually(
        lambda: sum(m.statistics().hub.subscriptions for m in others) == 3, what="subs"
    )
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await everything.release()
    await asyncio.wait_for(asyncio.gather(*(w.acquired() for w in waiters)), 10)
    # Woken by the one release, not the 30 s lease (5 s: room for a loaded machine)
    assert time.monotonic() - started < 5
    for waiter in waiters:
        await waiter.release()


# -- the limit in Redis ----------------------------------------------------------------


async def test_a_handle_with_another_limit_is_refused_naming_both(
    locks: aiolock.LockManager, others: list[aiolock.LockManager]
) -> None:
    ten = locks.semaphore("api", 10)
    await (await ten.acquire()).release()
    twenty = others[0].semaphore("api", 20)
    with pytest.raises(aiolock.LockError, match=r"10.*20"):
        await twenty.acquire()
    await ten.set_limit(20)
    assert ten.limit == 20
    await (await twenty.acquire(15)).release()
    with pytest.raises(aiolock.LockError, match=r"20.*10"):
        await others[1].semaphore("api", 10).try_acquire()
    assert await twenty.available() == 20


async def _keys_left(admin: Redis, prefix: str) -> list[str]:
    """Keys under *prefix* but the managers' identity records and release tombstones
    (kept 10 s whatever the semaphore does; checked to expire)."""
    left = []
    async for raw in admin.scan_iter(match=f"{prefix}:*", count=1000):
        key = raw.decode()
        if ":mgr:{" in key:
            continue
        if ":rel:" in key:
            assert await admin.pttl(key) > 0, key
            continue
        left.append(key)
    return sorted(left)


async def test_the_limit_key_lives_as_long_as_the_semaphore_is_in_use(
    redis_url: str, prefix: str, admin: Redis, others: list[aiolock.LockManager]
) -> None:
    # issue 24 item 6, issue 18 item 13: the limit key had no expiry, one key per name
    # ever used. It must stay while permits are held or claimed (renewals and claim
    # refreshes keep it), so a handle with another limit is still refused; and go with
    # the last lease, so that a lease after the last release nothing of the name is left.
    # A 2.5 s lease: two CI runs at once, each beside its robustness profile, ended a
    # 1.5 s lease before its grant's reply arrived (and 0.5 s under four suites at once
    # lost a permit whose renewals could not get through). 4 renewal rounds (lease / 3
    # apart) still span more than one lease.
    async with aiolock.LockManager.from_url(
        redis_url, prefix=prefix, lease=2.5, fence_ttl=0
    ) as short:
        sem = short.semaphore("used", 2)
        permits = [await sem.acquire(1), await sem.acquire(1)]
        waiter = Holder(short.semaphore("used", 2), 1)
        await eventually(lambda: short.statistics().claims == 1, what="a claim")
        rounds = short.statistics().renewal_rounds
        # held across several leases: only renewals keep the holders (and the limit)
        await eventually(
            lambda: short.statistics().renewal_rounds >= rounds + 4, what="4 renewal rounds"
        )
        with pytest.raises(aiolock.LockError, match=r"2.*3"):
            await others[0].semaphore("used", 3).try_acquire()
        limit_key = f"{prefix}:sem:{{used}}:limit"
        assert await admin.get(limit_key) == b"2"
        assert await admin.pttl(limit_key) > 0
        for permit in permits:
            await permit.release()
        await waiter.acquired()
        await waiter.release()
        deadline = time.monotonic() + 8  # one lease (2.5 s) and a margin for a busy machine
        while left := await _keys_left(admin, prefix):
            assert time.monotonic() < deadline, f"keys left after the last lease: {left}"
            await asyncio.sleep(0.05)
        # the next use stores its own limit again
        await (await others[0].semaphore("used", 3).acquire(3)).release()


async def test_a_limit_set_on_an_idle_semaphore_waits_for_its_next_use(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    # 1.5 s, renewed: a loaded machine's late round must not let it lapse before the PTTL
    # read below (a lapse would read -2)
    async with aiolock.LockManager.from_url(
        redis_url, prefix=prefix, lease=1.5, fence_ttl=0
    ) as short:
        sem = short.semaphore("idle", 2)
        await sem.set_limit(4)
        limit_key = f"{prefix}:sem:{{idle}}:limit"
        assert await admin.pttl(limit_key) == -1  # no use yet: kept for the next acquire
        with pytest.raises(aiolock.LockError, match=r"4.*2"):
            await short.semaphore("idle", 2).try_acquire()
        permit = await sem.acquire(4)
        assert 0 < await admin.pttl(limit_key) <= 1500  # now tied to the lease
        await permit.release()
        deadline = time.monotonic() + 8
        while left := await _keys_left(admin, prefix):
            assert time.monotonic() < deadline, f"keys left after the last lease: {left}"
            await asyncio.sleep(0.05)


async def test_raising_the_limit_wakes_waiters_and_lowering_keeps_holders(
    locks: aiolock.LockManager, others: list[aiolock.LockManager]
) -> None:
    sem = locks.semaphore("lim", 2)
    held = [await sem.acquire(1), await sem.acquire(1)]
    waiter = Holder(others[0].semaphore("lim", 2), 1)
    await eventually(lambda: others[0].statistics().hub.subscriptions == 1, what="a waiter")
    await asyncio.sleep(0.1)
    admin_handle = others[1].semaphore("lim", 2)
    await admin_handle.set_limit(3)  # the waiting request goes on under the new limit
    extra = await waiter.acquired()
    await admin_handle.set_limit(1)  # lower than the 3 held: the holders keep theirs
    assert all(p.held for p in [*held, extra])
    assert await admin_handle.available() == 0
    late = Holder(admin_handle, 1)
    for permit in held:
        await permit.release()
        await asyncio.sleep(0.1)
        assert not late.got.is_set()  # still 1 held, the new limit is 1
    await waiter.release()
    await late.acquired()
    await late.release()


async def test_available_and_holders(
    locks: aiolock.LockManager, others: list[aiolock.LockManager]
) -> None:
    sem = locks.semaphore("count", 5)
    assert (await sem.available(), await sem.holders(), sem.limit) == (5, 0, 5)
    a = await sem.acquire(2)
    b = await others[0].semaphore("count", 5).acquire(1)
    assert (await sem.available(), await sem.holders()) == (2, 2)
    await a.release()
    await b.release()
    assert (await sem.available(), await sem.holders()) == (5, 0)


# -- the Permit API --------------------------------------------------------------------


async def test_permit_api(locks: aiolock.LockManager, admin: Redis) -> None:
    # a fixed 1 s lease: the extend below must come before it ends, even on a loaded machine
    sem = locks.semaphore("permits", 4, lease=1.0)
    first = await sem.acquire(2)
    second = await sem.acquire(1)  # several permits per task are fine
    assert (first.permits, second.permits) == (2, 1)
    assert second.fencing_token > first.fencing_token
    await first.extend(5)
    # past the original lease (first's began before second's): the extended one lives on
    await eventually(lambda: not second.held, what="the loss of the permit's 1 s lease")
    assert first.held
    with pytest.raises(aiolock.LockLostError):
        await second.release()
    await first.release()
    with pytest.raises(aiolock.LockNotOwnedError):
        await first.release()
    with pytest.raises(aiolock.LockNotOwnedError):
        await first.extend(1)
    third = await sem.acquire(4, lease=None)
    assert third.fencing_token > first.fencing_token
    with pytest.raises(aiolock.LockError, match="renewed automatically"):
        await third.extend(5)
    await third.release()
    async with sem as a, sem as b:  # nested: one permit each, a stack per task
        assert await sem.holders() == 2 and b.fencing_token > a.fencing_token
    assert await sem.holders() == 0


async def test_bad_input_is_refused_at_the_call(locks: aiolock.LockManager) -> None:
    with pytest.raises(TypeError, match="limit"):
        locks.semaphore("bad", "10")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit"):
        locks.semaphore("bad", True)
    with pytest.raises(ValueError, match="limit"):
        locks.semaphore("bad", 0)
    sem = locks.semaphore("bad", 3)
    for permits, error in [(0, ValueError), (4, ValueError), (1.5, TypeError), (True, TypeError)]:
        with pytest.raises(error, match="permits"):
            await sem.acquire(permits)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        await sem.set_limit(-1)
    with pytest.raises(ValueError, match="lease"):
        await sem.acquire(1, lease=0)
    assert locks.statistics().held == 0


async def test_a_cancelled_waiter_leaves_no_claim(
    locks: aiolock.LockManager, others: list[aiolock.LockManager], admin: Redis, prefix: str
) -> None:
    holder = await others[0].semaphore("cancel", 2).acquire(2)
    waiter = asyncio.create_task(locks.semaphore("cancel", 2).acquire(2))
    await eventually(lambda: locks.statistics().claims == 1, what="a claim")
    claims = f"{prefix}:sem:{{cancel}}:claims"
    assert await admin.zcard(claims) == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await admin.zcard(claims) == 0
    assert await admin.hlen(f"{prefix}:sem:{{cancel}}:wants") == 0
    await holder.release()
    assert await locks.semaphore("cancel", 2).available() == 2
    assert (locks.statistics().held, locks.statistics().claims) == (0, 0)


async def test_force_release_frees_every_permit_and_holders_learn_it(
    redis_url: str, prefix: str, others: list[aiolock.LockManager]
) -> None:
    # renewed 3 s leases: the holds outlive a late round (and an acquire slowed by a
    # loaded machine), so only the force-release ends them
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=3.0) as short:
        sem = short.semaphore("forced", 3)
        permit = await sem.acquire(3)
        assert await others[0].semaphore("forced", 3).force_release()
        # the holder's watchdog finds it gone within a third of the lease
        await eventually(lambda: not permit.held, what="the loss")
        with pytest.raises(aiolock.LockLostError):
            await permit.release()
        assert await sem.available() == 3
        mine = await sem.acquire(2)
        assert await sem.force_release()  # in the same manager: known at once
        assert not mine.held
        assert not await sem.force_release()


# --------------------------------------------------------------------------------------
# Regressions found by the adversarial review of the semaphore (issue 8), against a real


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[FaultProxy]:
    """A FaultProxy in front of the suite's redis-server."""
    parts = urlsplit(redis_url)
    async with FaultProxy(parts.hostname or "127.0.0.1", parts.port or 6379) as started:
        yield started


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


# -- a Permit released by its ``async with`` block -------------------------------------


async def test_a_permit_released_by_its_block_cannot_be_released_again(
    locks: aiolock.LockManager,
) -> None:
    sem = locks.semaphore("block", 2)
    async with sem as permit:
        assert permit.held
    with pytest.raises(aiolock.LockNotOwnedError):
        await permit.release()  # returned silently before the fix
    with pytest.raises(aiolock.LockNotOwnedError):
        await permit.extend(1)
    assert await sem.available() == 2


async def test_a_permit_released_inside_its_block_is_not_reported_lost_on_exit(
    locks: aiolock.LockManager,
) -> None:
    sem = locks.semaphore("early", 2)
    async with sem as permit:
        await permit.release()  # give it back early; the block must not then fail
        assert not permit.held
    assert locks.statistics().lost.get("semaphore", 0) == 0
    assert await sem.available() == 2


# -- two unconfirmed releases of one task ------------------------------------------------


async def test_two_unconfirmed_releases_of_one_task_are_each_resent(
    proxy: FaultProxy, prefix: str, redis_url: str
) -> None:
    """The registry's parked index is keyed by (resource, owner): the second permit's
    parked release hid the first's, whose release() then said "not owned"."""
    client = Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 0))
    try:
        async with aiolock.LockManager(client, prefix=prefix, command_timeout=0.3) as locks:
            sem = locks.semaphore("parked", 3)
            first, second = await sem.acquire(1), await sem.acquire(2)
            proxy.blackhole()
            for permit in (first, second):
                with pytest.raises(aiolock.LockConnectionError):
                    await asyncio.wait_for(permit.release(), 10)
            # Still unreachable: calling release() again resends it (and fails again).
            with pytest.raises(aiolock.LockConnectionError):
                await asyncio.wait_for(first.release(), 10)
            proxy.restore()
            for permit in (first, second):
                await asyncio.wait_for(permit.release(), 10)  # resent, or found done
                with pytest.raises(aiolock.LockNotOwnedError):
                    await permit.release()
            async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as direct:
                assert await direct.semaphore("parked", 3).available() == 3
    finally:
        proxy.restore()
        await client.aclose()


# -- a late undo of a waiter's earlier attempt -------------------------------------------


async def test_a_late_undo_of_an_earlier_attempt_never_takes_a_later_grant(
    locks: aiolock.LockManager, other: aiolock.LockManager, redis_url: str, prefix: str
) -> None:
    """A waiter keeps one field for its whole wait. When one of its attempts failed in
    flight and the undo could not be sent, the undo was retried in the background while
    the waiter tried again under the same field: the late undo then took the permits the
    waiter had since been granted, and another client could exceed the limit."""
    sem = locks.semaphore("late-undo", 2)
    kind: Any = sem._kind
    real_attempt, real_undo = kind.attempt, kind.undo
    calls = {"attempt": 0, "undo": 0}
    fail_next, let_undo = asyncio.Event(), asyncio.Event()

    async def attempt(a: Attempt) -> Any:
        calls["attempt"] += 1
        outcome = await real_attempt(a)
        if fail_next.is_set() and calls["undo"] == 0:  # it ran, but its reply is lost
            raise aiolock.LockConnectionError("reply lost (test)")
        return outcome

    async def undo(a: Attempt) -> bool:
        calls["undo"] += 1
        if calls["undo"] == 1:  # the undo cannot be sent now: retried in the background
            raise aiolock.LockConnectionError("undo not sent (test)")
        if calls["undo"] == 2:
            await let_undo.wait()  # the retry lands late
        result: bool = await real_undo(a)
        return result

    kind.attempt, kind.undo = attempt, undo
    holders = [await other.semaphore("late-undo", 2).acquire(1) for _ in range(2)]
    checked = asyncio.Event()

    async def wait_and_hold() -> bool:
        permit = await sem.acquire(2, timeout=10)  # a permit belongs to its task
        await checked.wait()
        held = permit.held
        await permit.release()
        return held

    waiter = asyncio.create_task(wait_and_hold())
    await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="the waiter")
    await asyncio.sleep(0.1)
    fail_next.set()
    await holders[0].release()  # wakes the waiter: its attempt fails in flight
    await eventually(lambda: calls["undo"] == 2, what="the undo retried in the background")
    await asyncio.sleep(0.2)
    await holders[1].release()
    # Before the fix the waiter was granted now, and the undo then took its permits.
    # After it, the old field's claim (ahead of the new one) holds it until the undo lands.
    await asyncio.wait({waiter}, timeout=0.5)
    let_undo.set()
    await eventually(lambda: locks.statistics().held == 1, what="the waiter's grant")
    await eventually(lambda: locks.statistics().pending_cleanups == 0, what="the late undo")
    try:
        async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as third:
            # the waiter holds both permits: a third client must get none
            assert await third.semaphore("late-undo", 2).try_acquire(1) is None
    finally:
        checked.set()
    assert await asyncio.wait_for(waiter, 5)
