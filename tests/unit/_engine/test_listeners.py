"""Who listens for a plain lock (issue 20, item 1): managers register as listeners.

A plain lock's waiters wait on its release channel, which Redis can count (NUMSUB) but
not name; a manager whose waiter found the lock busy registers its id in
``<lock>:listeners`` while it stays subscribed, and ``aiolock show`` lists them with who
they are. An uncontended acquire writes nothing more.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine import listeners
from aiolock._engine.kind import LockKind
from aiolock._keys import LockKeys
from aiolock._redis.scripts import Script
from tests._support.helpers import eventually
from tests.unit._cli.test_main import run_cli
from tests.unit._redis.test_identity import record_of


async def test_show_lists_the_managers_waiting_for_a_plain_lock(
    redis: Redis, redis_url: str, prefix: str
) -> None:
    async with (
        aiolock.LockManager(redis, prefix=prefix, name="holder") as holder,
        aiolock.LockManager(redis, prefix=prefix, name="billing-worker") as first,
        aiolock.LockManager(redis, prefix=prefix, name="reports") as second,
    ):
        for manager in (holder, first, second):
            await record_of(redis, manager)
        key = f"{prefix}:lock:{{orders}}:listeners"
        async with holder.lock("orders"):
            waiting = [
                asyncio.create_task(first.lock("orders").acquire()),
                asyncio.create_task(first.lock("orders").acquire()),  # one entry per manager
                asyncio.create_task(second.lock("orders").acquire()),
            ]
            try:

                async def registered() -> bool:
                    return await redis.zcard(key) == 2

                await eventually(registered, what="both waiting managers registered")
                # (the holder listens on the channel too, once it has held the lock a
                # while: a release it did not make ends its hold, see _engine.heed)
                await eventually(
                    lambda: holder._open_engine().heed.listened == 1, what="the holder heeding"
                )
                shown = await run_cli(redis_url, prefix, "--json", "show", "orders")
                table = await run_cli(redis_url, prefix, "show", "orders")
            finally:
                for task in waiting:
                    task.cancel()
                await asyncio.gather(*waiting, return_exceptions=True)

            async def withdrawn() -> bool:
                return not await redis.exists(key)

            # the waiters gave up: the registrations go at the next round (TTL / 3), not
            # when they expire (TTL)
            await eventually(withdrawn, timeout=listeners.TTL, what="registrations withdrawn")
    assert shown.code == 0, shown.err
    (lock,) = json.loads(shown.out)["objects"]
    assert lock["listeners"] == 3  # PUBSUB NUMSUB: one subscription per manager
    by_id = {who["manager"]: who for who in lock["listening"]}
    assert set(by_id) == {first.id, second.id}
    assert by_id[first.id]["name"] == "billing-worker"
    assert by_id[second.id]["name"] == "reports"
    assert by_id[first.id]["host"] == socket.gethostname()
    assert by_id[first.id]["pid"] == os.getpid()
    assert table.code == 0, table.err
    assert f"{first.id}: billing-worker@{socket.gethostname()} pid {os.getpid()}" in table.out
    assert f"{second.id}: reports@" in table.out


async def test_an_uncontended_acquire_registers_nothing(
    locks: aiolock.LockManager, redis: Redis, prefix: str
) -> None:
    lock = locks.lock("quiet")
    for _ in range(20):
        async with lock:
            assert not await redis.exists(f"{prefix}:lock:{{quiet}}:listeners")
    assert len(locks._open_engine().state.listeners) == 0


async def test_a_registration_outlives_its_ttl_while_the_waiter_waits(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listeners, "TTL", 0.6)  # refreshed every 0.2 s
    async with (
        aiolock.LockManager(redis, prefix=prefix) as holder,
        aiolock.LockManager(redis, prefix=prefix) as waiter,
    ):
        key = f"{prefix}:lock:{{long}}:listeners"
        async with holder.lock("long"):
            task = asyncio.create_task(waiter.lock("long").acquire())
            try:

                async def registered() -> bool:
                    return await redis.zscore(key, waiter.id) is not None

                await eventually(registered, what="the waiter registered")
                loop = asyncio.get_running_loop()
                until = loop.time() + 1.8  # three TTLs: only refreshes keep it
                while loop.time() < until:
                    assert await redis.zscore(key, waiter.id) is not None
                    await asyncio.sleep(0.05)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


# -- a pass's cost is its batches, not its locks (issue 24) ------------------------------

#: waited-on names in the batch tests: several full batches and a partial one
MANY = 1_200
NAMES = [f"many-{i}" for i in range(MANY)]


class Clock:
    """The listeners module's monotonic clock, moved on by the test: a refresh round comes
    when the test says, never because a loaded machine was slow."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead


class Hub:
    """Stands in for the manager's hub: the channels its waiters want (no waiter tasks)."""

    def __init__(self) -> None:
        self.channels: set[str] = set()

    def wanted(self, channel: str) -> bool:
        return channel in self.channels


class ListenCalls:
    """Counts the listener script's calls through a manager's client: the locks in each."""

    def __init__(self, locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        client = locks._open_engine().client
        run = client.run

        def counted(script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
            if script.name == "_kinds/lock/listen":
                self.sizes.append(len(keys))
            return run(script, keys, args)

        monkeypatch.setattr(client, "run", counted)

    @property
    def written(self) -> int:
        return sum(self.sizes)


class Listening:
    """A manager's listener registrations driven by the test: which locks its (stand-in)
    hub wants, when its refresh rounds come, and the script calls they make."""

    def __init__(
        self, locks: aiolock.LockManager, clock: Clock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.locks = locks
        self.clock = clock
        self.hub = Hub()
        self.registrations = locks._open_engine().state.listeners
        monkeypatch.setattr(self.registrations, "_hub", self.hub)
        self.calls = ListenCalls(locks, monkeypatch)

    def wait_on(self, names: Sequence[str]) -> None:
        """Waiters of *names* found them busy (one pass picks them all up)."""
        for name in names:
            kind, keys = self.kind_keys(name)
            self.hub.channels.add(keys.channel)
            self.registrations.listening(kind, keys)

    def stop_waiting(self, names: Sequence[str]) -> None:
        for name in names:
            _, keys = self.kind_keys(name)
            self.hub.channels.discard(keys.channel)

    def next_round(self) -> None:
        """Make the refresh round due (the next pass is one)."""
        self.clock.ahead += listeners.TTL

    def kind_keys(self, name: str) -> tuple[LockKind, LockKeys]:
        handle = self.locks.lock(name)
        return handle._kind, handle._keys

    async def written(self, count: int, what: str) -> None:
        await eventually(lambda: self.calls.written >= count, what=what)
        assert self.calls.written == count, self.calls.sizes


async def scores(redis: Redis, prefix: str, names: Sequence[str], manager: str) -> list[Any]:
    """The manager's entry (expiry, server ms) in each name's listeners, or None."""
    async with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.zscore(f"{prefix}:lock:{{{name}}}:listeners", manager)
        return list(await pipe.execute())


def driven_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A clock the test moves on, and rounds an hour apart unless it does (set before the
    manager opens: its loop reads both when it starts)."""
    clock = Clock()
    monkeypatch.setattr(listeners, "time", clock)
    monkeypatch.setattr(listeners, "TTL", 3600.0)
    return clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return driven_clock(monkeypatch)


async def test_new_registrations_are_written_in_batches(
    redis: Redis, prefix: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,200 waited-on names register in ceil(1200 / batch) script calls, not 1,200 (one
    call per lock took ~30 s for 50,000 names, past the registrations' TTL)."""
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        listening = Listening(locks, clock, monkeypatch)
        await registered(listening, redis, prefix)
        assert len(listening.calls.sizes) == math.ceil(MANY / listeners.LISTEN_BATCH)
        assert max(listening.calls.sizes) == listeners.LISTEN_BATCH


async def registered(listening: Listening, redis: Redis, prefix: str) -> list[Any]:
    """Waiters of MANY names found them busy: their registrations are written and visible
    (each name's listeners name the manager); their expiries."""
    listening.wait_on(NAMES)
    await listening.written(MANY, "the new registrations sent")

    async def visible() -> bool:
        return None not in await scores(redis, prefix, NAMES, listening.locks.id)

    await eventually(visible, what="every name's listeners naming the manager")
    return await scores(redis, prefix, NAMES, listening.locks.id)


async def test_a_refresh_round_is_written_in_batches(
    redis: Redis, prefix: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        listening = Listening(locks, clock, monkeypatch)
        first = await registered(listening, redis, prefix)
        # a refresh round, started by one more waited-on name: all of them, in batches
        # (on a doubled TTL, so that a refreshed entry shows: its expiry moved an hour on)
        monkeypatch.setattr(listeners, "TTL", 7200.0)
        listening.calls.sizes.clear()
        listening.next_round()
        listening.wait_on(["one-more"])
        await listening.written(MANY + 1, "the refresh round sent")
        assert len(listening.calls.sizes) == math.ceil((MANY + 1) / listeners.LISTEN_BATCH)

        async def refreshed() -> bool:
            now = await scores(redis, prefix, [*NAMES, "one-more"], locks.id)
            hour = 3_600_000
            return None not in now and all(b > a + hour for a, b in zip(first, now, strict=False))

        await eventually(refreshed, what="every registration refreshed")


async def test_withdrawals_are_written_in_batches_with_the_refreshes(
    redis: Redis, prefix: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        listening = Listening(locks, clock, monkeypatch)
        await registered(listening, redis, prefix)
        # half of the names lost their waiters: withdrawn at the next round, the others
        # refreshed, in the same batches
        gone, kept = NAMES[::2], NAMES[1::2]
        listening.stop_waiting(gone)
        listening.calls.sizes.clear()
        listening.next_round()
        listening.wait_on(["one-more"])
        await listening.written(MANY + 1, "the withdrawal round sent")
        assert len(listening.calls.sizes) == math.ceil((MANY + 1) / listeners.LISTEN_BATCH)
        assert len(listening.registrations) == len(kept) + 1

        async def withdrawn() -> bool:
            left = await scores(redis, prefix, gone, locks.id)
            return left == [None] * len(gone)

        await eventually(withdrawn, what="the registrations of names nobody waits for removed")
        assert None not in await scores(redis, prefix, [*kept, "one-more"], locks.id)


async def test_a_failing_round_is_logged_once_until_one_succeeds(
    redis: Redis,
    prefix: str,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Batches that fail round after round log one warning, counting the locks; a round
    that succeeds wholly ends the failure, and the next failure is logged again."""
    names = NAMES[: 2 * listeners.LISTEN_BATCH + 1]  # three batches a round
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        listening = Listening(locks, clock, monkeypatch)
        kind, _ = listening.kind_keys("any")
        write = kind.register_listeners
        failing = True
        tries = 0

        async def flaky(writes: Sequence[tuple[LockKeys, float]]) -> None:
            nonlocal tries
            tries += 1
            if failing:
                raise aiolock.LockError("Redis is away (the test's)")
            await write(writes)

        monkeypatch.setattr(kind, "register_listeners", flaky)

        def warnings() -> list[str]:
            return [r.getMessage() for r in caplog.records if "could not register" in r.msg]

        listening.wait_on(names)
        await eventually(lambda: len(warnings()) == 1, what="the first failure logged")
        assert f"of {len(names)} of {len(names)} locks" in warnings()[0]
        assert "Redis is away" in warnings()[0]
        listening.next_round()  # fails again: not logged again
        listening.wait_on(["one-more"])
        await eventually(lambda: tries == 6, what="the second round's three batches")
        failing = False
        listening.next_round()
        listening.wait_on(["another"])

        async def visible() -> bool:
            return None not in await scores(redis, prefix, [*names, "another"], locks.id)

        # (rounds run one after another: the second one's end came before this)
        await eventually(visible, what="the registrations written once Redis answers")
        assert len(warnings()) == 1
        failing = True
        listening.next_round()
        listening.wait_on(["third"])
        await eventually(lambda: len(warnings()) == 2, what="the next failure logged")
