"""The turns of starving managers (turns.lua, aiolock._engine.turns), script by script.

The turns are a key of the lock's layout (``<lock key>:turns``), and what these tests check
is how the scripts read and write it: they call the scripts directly and look at the key.
The behaviour through the public API (a starving manager is served) is checked by
tests/stress/test_starvation.py; giving a turn up by tests at the end of this file.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine import turns as turns_module
from aiolock._engine import wait as wait_module
from aiolock._kinds.lock.kind import ACQUIRE, KEEP_TURN, RELEASE
from aiolock._redis.client import Client
from tests._support.helpers import eventually, hold_once

LEASE_MS = 5000


class Lock:
    """One lock's keys, and its scripts run as manager ``m<i>``'s tasks would run them."""

    def __init__(self, redis: Redis, prefix: str) -> None:
        self.client = Client(redis)
        self.redis = redis
        self.key = f"{prefix}:lock:{{t}}"
        self.turns = f"{self.key}:turns"
        self._n = 0

    async def acquire(self, manager: str, *, ask_ms: int | None = None) -> Any:
        self._n += 1
        args: tuple[str | int, ...] = (f"{manager}:{self._n}", LEASE_MS, 0, manager)
        if ask_ms is not None:
            args += (ask_ms,)
        keys = (self.key, f"{self.key}:void:{self._n}", self.turns)
        return await self.client.run(ACQUIRE, keys, args)

    async def release(self, field: str, token: int, successor: str = "") -> Any:
        manager = field.split(":", maxsplit=1)[0]
        args = (f"{field}|1|{token}|", token, "60000", 1, manager, successor, LEASE_MS, 1, 0)
        keys = (self.key,) if not successor else (self.key, self.turns)
        return await self.client.run(RELEASE, keys, args)

    async def order(self) -> list[str]:
        return (await self.text(self.turns)).split()[::2]

    async def text(self, key: str) -> str:
        raw = await self.redis.get(key)
        return raw.decode() if isinstance(raw, bytes) else raw or ""


@pytest.fixture
def lock(redis: Redis, prefix: str) -> Lock:
    return Lock(redis, prefix)


async def test_a_free_lock_goes_to_the_first_turn_only(lock: Lock) -> None:
    held = await lock.acquire("m0")
    assert isinstance(held, int)
    # m1 and m2 find it busy and ask for turns, in this order
    assert (await lock.acquire("m1", ask_ms=1500))[0] == 0
    assert (await lock.acquire("m2", ask_ms=1500))[0] == 0
    assert await lock.order() == ["m1", "m2"]
    assert (await lock.text(lock.key)).endswith("|*")  # waiters were seen
    assert await lock.release("m0:1", held) == 0  # freed (and published: nobody subscribed)
    # free, but m1's turn: m2 (and a newcomer that never asked) are told it is busy, with
    # the turn's time left as the wait
    code, wait_ms = await lock.acquire("m2", ask_ms=1500)
    assert code == 0 and 0 < wait_ms <= 1500
    assert (await lock.acquire("m3"))[0] == 0
    assert await lock.order() == ["m1", "m2"]  # m3 did not ask; m2 kept its place
    token = await lock.acquire("m1")  # not asking any more: its turn is there anyway
    assert isinstance(token, int) and token > held
    assert await lock.order() == ["m2"]  # the turn was used up
    # m1's grant carries the waiter flag: its release publishes for m2
    assert (await lock.text(lock.key)).endswith("|*")
    assert isinstance(await lock.acquire("m2"), list)  # busy: held by m1
    await lock.release(f"m1:{lock._n - 1}", token)
    assert isinstance(await lock.acquire("m2"), int)
    assert await lock.redis.get(lock.turns) is None  # the last turn used: the key is gone


async def test_a_turn_lapses_unless_kept(lock: Lock) -> None:
    held = await lock.acquire("m0")
    assert (await lock.acquire("m1", ask_ms=300))[0] == 0
    await lock.release("m0:1", held)
    assert (await lock.acquire("m2"))[0] == 0  # m1's turn
    assert await lock.client.run(KEEP_TURN, (lock.turns,), (300, "m1")) == 1  # kept
    assert await lock.client.run(KEEP_TURN, (lock.turns,), (300, "m9")) == 0  # never asked
    start = time.monotonic()
    while not isinstance(await lock.acquire("m2"), int):  # m1 died: its turn lapses
        assert time.monotonic() - start < 2.0, "m1's turn did not lapse"
        await asyncio.sleep(0.02)
    assert time.monotonic() - start >= 0.2  # not before the kept turn's 300 ms
    assert await lock.redis.get(lock.turns) is None


async def test_a_turn_given_up_is_gone_at_once(lock: Lock) -> None:
    held = await lock.acquire("m0")
    assert (await lock.acquire("m1", ask_ms=60_000))[0] == 0
    assert (await lock.acquire("m2", ask_ms=60_000))[0] == 0
    assert await lock.client.run(KEEP_TURN, (lock.turns,), (0, "m1")) == 1
    assert await lock.order() == ["m2"]
    await lock.release("m0:1", held)
    assert (await lock.acquire("m3"))[0] == 0  # m2's turn now
    assert isinstance(await lock.acquire("m2"), int)


async def test_no_local_hand_over_past_another_managers_turn(lock: Lock) -> None:
    held = await lock.acquire("m0")
    assert (await lock.acquire("m1", ask_ms=60_000))[0] == 0
    # m0 releases with a local successor, even "freely" (ARGV[8] = 1): m1's turn comes
    # first, so the lock is freed and the release published instead
    reply = await lock.release("m0:1", held, successor="m0:99")
    assert reply == 0  # freed, not handed over (a hand-over answers [4, token])
    assert (await lock.acquire("m0"))[0] == 0  # m0's own tasks wait their turn too
    assert isinstance(await lock.acquire("m1"), int)


async def test_a_release_hands_over_on_its_own_managers_turn(lock: Lock) -> None:
    held = await lock.acquire("m0")
    assert (await lock.acquire("m0", ask_ms=60_000))[0] == 0  # (a resend would differ)
    assert await lock.order() == ["m0"]
    code, _ = await lock.release("m0:1", held, successor="m0:99")
    assert code == 4  # handed over: the turn was m0's own, and is used up
    assert await lock.redis.get(lock.turns) is None


async def test_a_waiter_that_gives_up_gives_its_turn_up(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through managers: a starving waiter that times out leaves no turn behind to keep
    the free lock from others until it lapses."""
    monkeypatch.setattr(wait_module, "STARVE_AFTER", 1)  # ask after one busy attempt
    lock = Lock(redis, prefix)
    async with (
        aiolock.LockManager(redis, prefix=prefix) as holder,
        aiolock.LockManager(redis, prefix=prefix) as quitter,
        aiolock.LockManager(redis, prefix=prefix) as newcomer,
    ):
        held = holder.lock("t")
        await held.acquire()
        wait = asyncio.create_task(quitter.lock("t").acquire(timeout=3))
        await eventually(lambda: _present(redis, lock.turns), what="the quitter's turn")
        wait.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait
        # given up at once: sooner than it would lapse (claim_ttl, 1.5 s, after the last
        # refresh, which may have been just now)
        await eventually(lambda: _gone(redis, lock.turns), timeout=0.8, what="the turn given up")
        await held.release()
        # well within the turn's lapse (claim_ttl, 1.5 s)
        async with newcomer.lock("t", timeout=0.5):
            pass


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


async def _present(redis: Redis, key: str) -> bool:
    return bool(await redis.exists(key))


async def test_a_manager_served_at_once_forgets_it_starved(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager whose waiters starved asks at the first attempt of its next wait; once a
    wait of its is served without finding the lock busy, it forgets, and its acquisitions
    take the fast path again (else one episode of contention would slow every later
    acquisition of the name for as long as they come more than once a second)."""
    monkeypatch.setattr(wait_module, "STARVE_AFTER", 1)
    monkeypatch.setattr(turns_module, "STARVE_AFTER", 1)
    async with (
        aiolock.LockManager(redis, prefix=prefix) as holder,
        aiolock.LockManager(redis, prefix=prefix) as starving,
    ):
        held = holder.lock("f")
        await held.acquire()
        waiting = asyncio.create_task(hold_once(starving.lock("f", timeout=5)))
        await eventually(lambda: starving.statistics().claims == 1, what="its turn")
        await held.release()
        await waiting
        assert starving.statistics().claims == 0
        # remembered: the next acquisition waits (asks for a turn), found free at once
        engine = starving._engine
        assert engine is not None
        assert engine.starved, "the starvation was not remembered: nothing is tested"
        async with starving.lock("f", timeout=1):
            pass
        # served at once: forgotten, so the next takes the fast path
        before = engine.fast_acquired
        async with starving.lock("f", timeout=1):
            pass
        assert engine.fast_acquired == before + 1
