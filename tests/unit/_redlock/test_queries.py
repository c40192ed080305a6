"""A Redlock handle has the lock's API where a majority can give it (issue 37, item 1):
``locked()``, ``ttl()``, ``hold_count()``, ``extend()`` (set or add), ``force_release()``
and the manager's ``locked`` decorator, each answered by a majority of real masters.

The arithmetic of ``ttl()`` over the masters (the quorum-th longest lease, less drift) is
checked on keys the test writes itself, because which master has which lease is the
point there; everything else goes through the public API.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock import RedlockManager
from aiolock.testing import RedisServer
from tests._support.helpers import PATIENCE, eventually
from tests._support.redlock import paused, redlock, started


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    with started(3) as servers:
        yield servers


@pytest.fixture
async def locks(servers: list[RedisServer]) -> AsyncIterator[RedlockManager]:
    async with redlock(servers, f"rq-{uuid.uuid4().hex[:8]}", lease=3.0) as manager:
        yield manager


@pytest.fixture
async def admins(servers: list[RedisServer]) -> AsyncIterator[list[Redis]]:
    made = [Redis.from_url(server.url) for server in servers]
    try:
        yield made
    finally:
        for client in made:
            await client.aclose()


# -- locked(), ttl(), hold_count() ------------------------------------------------------


async def test_locked_ttl_and_hold_count_follow_a_hold(
    servers: list[RedisServer], locks: RedlockManager
) -> None:
    lock = locks.lock("q")
    assert not await lock.locked()
    assert await lock.ttl() is None
    assert await lock.hold_count() == 0
    async with redlock(servers, locks.prefix) as other:
        seen = other.lock("q")
        async with lock:
            async with lock:
                assert await lock.hold_count() == 2
            assert await lock.hold_count() == 1
            assert await lock.locked()
            assert await seen.locked()  # from another manager too
            assert await seen.hold_count() == 0  # held, but not by that task
            left = await seen.ttl()
            assert left is not None and 2.0 < left <= 3.0
        assert not await seen.locked()
        assert await seen.ttl() is None
        assert await lock.hold_count() == 0


async def test_ttl_is_the_quorum_th_longest_lease_less_the_drift(
    locks: RedlockManager, admins: list[Redis]
) -> None:
    """Held while a majority has one token: the lease ends when the second longest of
    three runs out. A minority's key (a failed round's leftover) is not a hold."""
    lock = locks.lock("arith")
    await admins[0].set(lock.key, "tok", px=20_000)
    await admins[1].set(lock.key, "tok", px=10_000)
    await admins[2].set(lock.key, "other", px=30_000)
    left = await lock.ttl()
    drift = 10 * locks.drift_factor + 0.002
    assert left is not None and 10 - drift - 1 < left <= 10 - drift
    assert await lock.locked()
    await admins[1].delete(lock.key)
    assert not await lock.locked()  # one master each: nobody has a majority
    assert await lock.ttl() is None
    await admins[1].set(lock.key, "tok")  # no expiry on two masters
    await admins[0].persist(lock.key)
    assert await lock.ttl() == float("inf")


async def test_the_queries_say_when_too_few_masters_answer(
    servers: list[RedisServer], locks: RedlockManager
) -> None:
    lock = locks.lock("silent")
    async with lock:
        with paused(servers[2]):  # two of three answer, both have it: held
            assert await lock.locked()
            assert (await lock.ttl() or 0) > 0
        with paused(servers[1], servers[2]):
            with pytest.raises(aiolock.LockConnectionError, match=r"1 of 3 masters answered"):
                await lock.locked()
            with pytest.raises(aiolock.LockConnectionError, match="cannot tell"):
                await lock.ttl()
    # The release reaches a master skipped a moment ago in the background: once it has,
    # two answering masters without the key are enough to tell.
    await eventually(lambda: locks.statistics().pending_cleanups == 0, what="the release")
    with paused(servers[2]):
        assert not await lock.locked()


async def test_a_key_of_another_type_is_named(locks: RedlockManager, admins: list[Redis]) -> None:
    lock = locks.lock("typed")
    for admin in admins:
        await admin.rpush(lock.key, "x")
    try:
        with pytest.raises(aiolock.LockKeyTypeError, match="a list"):
            await lock.locked()
        with pytest.raises(aiolock.LockKeyTypeError, match="a list"):
            await lock.force_release()
        for admin in admins:
            assert await admin.llen(lock.key) == 1  # left alone
    finally:
        for admin in admins:
            await admin.delete(lock.key)


# -- extend() ---------------------------------------------------------------------------


async def test_extend_sets_or_adds_to_a_fixed_lease_on_the_masters(
    locks: RedlockManager,
) -> None:
    lock = locks.lock("ext", lease=1.0)
    async with lock:
        await lock.extend(4.0)
        left = await lock.ttl()
        assert left is not None and 3.0 < left <= 4.0
        await lock.extend(additional=2.0)
        left = await lock.ttl()
        assert left is not None and 5.0 < left <= 6.0
        await lock.extend(0.9)  # shorter is allowed too: the masters now end there
        left = await lock.ttl()
        assert left is not None and left <= 0.9


async def test_an_extended_hold_outlives_its_first_lease(locks: RedlockManager) -> None:
    """The hold's validity moves with the masters' leases: a body that runs past the
    lease it was acquired with is not cancelled, and still owns the lock."""
    lock = locks.lock("outlive", lease=0.6)
    started_at = time.monotonic()
    async with lock:
        await lock.extend(additional=2.0)
        await asyncio.sleep(1.0)  # past the first lease: it must have been extended
        assert time.monotonic() - started_at > 0.6
        assert await lock.owned()
    assert not await lock.locked()


async def test_extend_is_refused_where_it_has_no_meaning(locks: RedlockManager) -> None:
    renewed = locks.lock("renewed")
    with pytest.raises(aiolock.LockNotOwnedError, match="cannot extend"):
        await renewed.extend(5.0)
    async with renewed:
        with pytest.raises(aiolock.LockError, match="renewed automatically"):
            await renewed.extend(5.0)
    fixed = locks.lock("fixed", lease=2.0)
    async with fixed:
        with pytest.raises(TypeError, match="exactly one"):
            await fixed.extend(5.0, additional=1.0)
        with pytest.raises(TypeError, match="exactly one"):
            await fixed.extend()
        with pytest.raises(ValueError, match="three times node_timeout"):
            await fixed.extend(0.2)  # node_timeout is 0.1 s
        with pytest.raises(ValueError, match="additional"):
            await fixed.extend(additional=-1)
        assert await fixed.owned()  # none of it touched the hold


async def test_extend_confirmed_by_a_minority_loses_the_hold(
    locks: RedlockManager, admins: list[Redis]
) -> None:
    lock = locks.lock("minority", lease=2.0)
    with pytest.raises(aiolock.LockLostError, match="extend"):
        async with lock:
            for admin in admins[:2]:  # two masters lost it (restarted empty, say)
                await admin.delete(lock.key)
            with pytest.raises(aiolock.LockLostError, match=r"confirmed by 1 of 3"):
                await lock.extend(5.0)
            assert not await lock.owned()
            # reported once: the block's end reports the same loss
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.release()
    # released where it was still found: nothing is left to wait for
    assert await locks.lock("minority").try_acquire()


async def test_extend_with_too_few_masters_answering_loses_the_hold(
    servers: list[RedisServer], locks: RedlockManager
) -> None:
    lock = locks.lock("unanswered", lease=2.0)
    await lock.acquire()
    with paused(servers[1], servers[2]), pytest.raises(aiolock.LockLostError):
        await lock.extend(additional=5.0)
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.release()


# -- force_release() --------------------------------------------------------------------


async def test_force_release_frees_it_for_a_waiter_and_the_holder_loses_it(
    servers: list[RedisServer], locks: RedlockManager
) -> None:
    lock = locks.lock("forced")
    entered = asyncio.Event()
    body_ended: list[BaseException] = []

    async def holder() -> None:
        try:
            async with lock:
                entered.set()
                await asyncio.sleep(60)
        except BaseException as exc:
            body_ended.append(exc)
            raise

    held = asyncio.create_task(holder())
    await entered.wait()
    async with redlock(servers, locks.prefix) as admin:

        async def take() -> float:
            async with admin.lock("forced", timeout=PATIENCE):
                return time.monotonic()

        waiting = asyncio.create_task(take())
        await eventually(lambda: admin.statistics().failed_rounds > 0, what="a waiter")
        forced_at = time.monotonic()
        assert await admin.lock("forced").force_release() is True
        taken_at = await asyncio.wait_for(waiting, PATIENCE)
        # woken by the release message, not at the end of the holder's 3 s lease
        assert taken_at - forced_at < 1.5
        with pytest.raises(aiolock.LockLostError, match="lost"):
            await asyncio.wait_for(held, PATIENCE)  # found at its next renewal round
        assert isinstance(body_ended[0], aiolock.LockLostError)
    assert await lock.force_release() is False  # nobody holds it now


async def test_force_release_in_the_holders_manager_cancels_its_body_at_once(
    locks: RedlockManager,
) -> None:
    lock = locks.lock("own")
    entered = asyncio.Event()

    async def holder() -> None:
        async with lock:
            entered.set()
            await asyncio.sleep(60)

    held = asyncio.create_task(holder())
    await entered.wait()
    assert await lock.force_release()
    with pytest.raises(aiolock.LockLostError, match="force-released"):
        await asyncio.wait_for(held, 0.5)  # well before a renewal round (1 s)
    assert not await lock.locked()


async def test_force_release_with_too_few_masters_answering_says_so(
    servers: list[RedisServer], locks: RedlockManager
) -> None:
    lock = locks.lock("partial")
    with (
        paused(servers[1], servers[2]),
        pytest.raises(aiolock.LockConnectionError, match=r"reached 1 of 3"),
    ):
        await lock.force_release()
    # (the paused masters run the commands queued for them once resumed: what they had
    # is unknown to the caller, which is what the error says)


# -- the locked decorator ---------------------------------------------------------------


async def test_the_locked_decorator_runs_calls_of_one_name_one_at_a_time(
    locks: RedlockManager,
) -> None:
    inside: dict[str, int] = {}
    most: dict[str, int] = {}

    @locks.locked("order:{order_id}")
    async def handle(order_id: int) -> int:
        name = f"order:{order_id}"
        inside[name] = inside.get(name, 0) + 1
        most[name] = max(most.get(name, 0), inside[name])
        assert await locks.lock(name).owned()
        await asyncio.sleep(0.02)
        inside[name] -= 1
        return order_id

    results = await asyncio.gather(*(handle(i % 2) for i in range(6)))
    assert sorted(r for r in results if r is not None) == [0, 0, 0, 1, 1, 1]
    assert most == {"order:0": 1, "order:1": 1}
    assert not await locks.lock("order:0").locked()


async def test_the_locked_decorator_skips_or_raises_when_busy(locks: RedlockManager) -> None:
    @locks.locked("job", on_busy="skip")
    async def skipped() -> str:
        return "ran"

    @locks.locked("job", on_busy="raise")
    async def raised() -> str:
        return "ran"

    async def elsewhere() -> None:
        async with locks.lock("job"):
            await eventually(done.is_set, what="the calls")

    done = asyncio.Event()
    other = asyncio.create_task(elsewhere())
    await eventually(lambda: locks.statistics().held == 1, what="the hold")
    assert await skipped() is None
    with pytest.raises(aiolock.LockTimeoutError):
        await raised()
    done.set()
    await other
    assert await skipped() == "ran"


def test_the_locked_decorator_checks_its_arguments(locks: RedlockManager) -> None:
    with pytest.raises(TypeError, match="no Redlock multi-lock"):
        locks.locked(["a", "b"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="three times node_timeout"):
        locks.locked("a", lease=0.2)
    with pytest.raises(ValueError, match="on_busy"):
        locks.locked("a", on_busy="later")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no parameter"):

        @locks.locked("order:{order_id}")
        async def handle(order: int) -> None: ...
