"""Unit tests of :mod:`aiolock._engine.state`.

Checks what an :class:`EngineState` is made of (its runtime, client, hub, registry,
watchdog, cleanup, observers and zeroed counters), the error it gives once the manager
stops handing out locks, and how it hears of holds: a lost hold is counted, reported to
the observers once and wakes the head of its lock's local queue; an ended hold is
reported released once; and (through a LockManager) a fixed-lease hold wakes the
watchdog, which finds a hold Redis no longer has within a third of its lease.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import anyio
import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.hub import WaiterHub
from aiolock._engine.kind import Hold
from aiolock._engine.runtime import Runtime
from aiolock._engine.state import ORPHAN, EngineState
from aiolock._errors import ManagerNotOpenError
from aiolock._keys import KeySpace, LockKeys, new_manager_id
from aiolock._kinds.lock.kind import ReentrantLockKind
from aiolock._observe import ObserverSet
from aiolock._redis.client import Client
from aiolock._redis.pubsub import Subscriber


class Ends(aiolock.Observer):
    """Records how holds end (how long they were held, apart)."""

    def __init__(self) -> None:
        self.ends: list[tuple[str, str, str, int, str | None]] = []
        self.held: list[float] = []
        self.ended = asyncio.Event()

    def released(self, kind: str, name: str, held_s: float, token: int) -> None:
        self.ends.append(("released", kind, name, token, None))
        self.held.append(held_s)
        self.ended.set()

    def lost(self, kind: str, name: str, held_s: float, token: int, reason: str) -> None:
        self.ends.append(("lost", kind, name, token, reason))
        self.held.append(held_s)
        self.ended.set()


@pytest.fixture
async def runtime(redis: Redis, prefix: str) -> AsyncIterator[Runtime]:
    client = Client(redis)
    try:
        yield Runtime(client, KeySpace(prefix, new_manager_id()), lease=30.0, fence_ttl=60.0)
    finally:
        await client.aclose()


def make_state(runtime: Runtime, redis: Redis, observers: ObserverSet | None = None) -> EngineState:
    hub = WaiterHub(Subscriber(redis), runtime.manager_id)  # nothing runs: no I/O
    return EngineState(runtime, hub, observers)


def observed_hold(state: EngineState, prefix: str, name: str, token: int) -> Hold:
    kind = ReentrantLockKind(state.rt)
    keys = LockKeys(prefix, name)
    hold = Hold(kind, keys, "owner:1", "owner:1:1", token, 30.0, True, time.monotonic())
    hold.observed_at = time.monotonic()
    return hold


async def test_a_state_bundles_the_parts_of_an_open_manager(
    runtime: Runtime, redis: Redis, redis_url: str
) -> None:
    state = make_state(runtime, redis)
    assert state.rt is runtime
    assert state.client is runtime.client
    assert not state.hub.closed
    assert len(state.registry) == 0
    assert state.watchdog.period == runtime.lease / 3
    assert state.watchdog.group_by_slot is False  # one server: batches may mix slots
    assert state.cleanup.pending == 0
    assert isinstance(state.observers, ObserverSet) and not state.observers.active
    assert not state.acquired and not state.timeouts and not state.lost
    assert state.claims.count == 0
    assert state.reach.failure is None
    assert str(urlparse(redis_url).port) in state.reach.address  # names the server
    assert ORPHAN == ""  # the owner of no task: never a manager's owner id

    given = ObserverSet([Ends()])
    assert make_state(runtime, redis, given).observers is given


async def test_manager_closed_says_what_to_do(runtime: Runtime, redis: Redis) -> None:
    state = make_state(runtime, redis)
    error = state.manager_closed()
    assert isinstance(error, ManagerNotOpenError)
    assert "hands out no more locks" in str(error)
    assert "Open a new LockManager" in str(error)
    assert state.manager_closed() is not error  # a fresh error for every raise


async def test_a_lost_hold_is_counted_reported_once_and_wakes_its_head(
    runtime: Runtime, redis: Redis, prefix: str
) -> None:
    observer = Ends()
    state = make_state(runtime, redis, ObserverSet([observer]))
    hold = observed_hold(state, prefix, "x", token=7)
    # Another task of this manager waits for the same lock (the head of its queue).
    waiter = state.hub.join(hold.keys.channel, "owner:2", None)
    assert not waiter.pending
    state.registry.add(hold)
    state.registry.lose(hold, "it was force-released")
    assert state.lost == {"lock": 1}
    assert observer.ends == [("lost", "lock", "x", 7, "it was force-released")]
    assert 0 <= observer.held[0] < 5
    assert hold.observed_at is None
    assert waiter.pending  # woken: the lock may be free now
    state.ended(hold, "again")  # reported once only
    assert len(observer.ends) == 1
    state.hub.leave(waiter, acquired=False)


async def test_an_ended_hold_is_reported_released_once(
    runtime: Runtime, redis: Redis, prefix: str
) -> None:
    observer = Ends()
    state = make_state(runtime, redis, ObserverSet([observer]))
    hold = observed_hold(state, prefix, "y", token=3)
    state.ended(hold)
    state.ended(hold)
    assert observer.ends == [("released", "lock", "y", 3, None)]
    assert 0 <= observer.held[0] < 5
    assert hold.observed_at is None
    unobserved = observed_hold(state, prefix, "z", token=4)
    unobserved.observed_at = None  # acquired while no observer was attached
    state.ended(unobserved)
    state.ended(unobserved, "lost")
    assert len(observer.ends) == 1
    assert not state.lost  # ended only reports; counting is the loss's


async def test_a_fixed_lease_hold_wakes_the_watchdog_which_finds_it_gone(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    """The manager's watchdog sleeps a third of its 30 s lease; a fixed-lease hold of
    0.3 s reschedules it (EngineState._on_fixed), so a hold deleted behind the manager's
    back is found gone at its first check (0.1 s), before its own lease ends."""
    observer = Ends()
    locks.add_observer(observer)
    lock = locks.lock("fixed", lease=0.3)
    await lock.acquire()
    token = lock.fencing_token
    assert token is not None
    await admin.delete(lock.key)
    with anyio.fail_after(5):
        await observer.ended.wait()
    ((how, kind, name, reported, reason),) = observer.ends
    assert (how, kind, name, reported) == ("lost", "lock", "fixed", token)
    assert reason is not None and reason.startswith("Redis no longer has it")
    assert locks.statistics().lost == {"lock": 1}
    assert locks.statistics().held == 0
    with pytest.raises(aiolock.LockLostError, match="Redis no longer has it"):
        await lock.release()
