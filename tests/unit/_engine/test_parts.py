"""The engine's parts, each built and exercised alone: no Engine, no LockManager.

The engine (:mod:`aiolock._engine.engine`) composes objects that are given what they use
when they are made. Here each is made by hand over the suite's Redis server and a real
client, and does its work: the release path from the shared parts alone (a fast final
release, a nested one, a hold whose task ended), the acquire path from the parts and the
release path (a fast grant, a re-entry, a single attempt that times out, a wait handed
the lock by a local release), each fast step from its path's protocol (the acquire's over
a recording stand-in for the acquire path, the release's called directly), and the
engine binding the paths' entry points to itself, with no layer of its own between.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.acquire import AcquirePath
from aiolock._engine.fast import FastAcquire, FastRelease
from aiolock._engine.hub import WaiterHub
from aiolock._engine.kind import Attempt, Busy, Granted, Hold, LockKind
from aiolock._engine.release import ReleasePath
from aiolock._engine.runtime import Runtime
from aiolock._engine.state import EngineState
from aiolock._engine.waiter import Waiter
from aiolock._errors import ManagerNotOpenError
from aiolock._keys import KeySpace, LockKeys, new_manager_id
from aiolock._kinds.lock.kind import ReentrantLockKind
from aiolock._redis.client import Client
from aiolock._redis.pubsub import Subscriber
from aiolock._redis.reach import Reachability


@pytest.fixture
async def runtime(redis: Redis, prefix: str) -> AsyncIterator[Runtime]:
    client = Client(redis)
    try:
        yield Runtime(client, KeySpace(prefix, new_manager_id()), lease=30.0, fence_ttl=60.0)
    finally:
        await client.aclose()


@pytest.fixture
def state(runtime: Runtime, redis: Redis) -> EngineState:
    """The shared parts; the hub's subscriptions are not run unless a test runs them."""
    return EngineState(runtime, WaiterHub(Subscriber(redis), runtime.manager_id))


def owner_of(runtime: Runtime, task: int) -> str:
    return f"{runtime.manager_id}:{task}"


async def granted(
    rt: Runtime, kind: LockKind, keys: LockKeys, owner: str, before: int = 0
) -> Granted:
    """The kind's own attempt for *owner* (re-entering its field when *before* > 0)."""
    number = rt.next_id()
    field = kind.hold_field(owner, 0)  # one field per owner here: a re-entry names it
    void = keys.void(f"{rt.manager_id}:{number}")
    outcome = await kind.attempt(Attempt(keys, owner, field, before, rt.lease, void))
    assert isinstance(outcome, Granted)
    return outcome


async def registered_hold(state: EngineState, kind: LockKind, keys: LockKeys, owner: str) -> Hold:
    """A hold granted by the kind alone, registered as an acquire path would."""
    sent_at = time.monotonic()
    outcome = await granted(state.rt, kind, keys, owner)
    field = kind.hold_field(owner, 0)
    hold = Hold(kind, keys, owner, field, outcome.token, state.rt.lease, True, sent_at)
    state.registry.add(hold)
    return hold


# -- the release path -------------------------------------------------------------------


async def test_the_release_path_alone_frees_a_lock_and_releases_a_nested_hold(
    state: EngineState, runtime: Runtime, prefix: str
) -> None:
    releases = ReleasePath(state)
    kind = ReentrantLockKind(runtime)
    keys = LockKeys(prefix, "released")
    owner = owner_of(runtime, 1)
    hold = await registered_hold(state, kind, keys, owner)
    assert await kind.locked(keys)

    await releases.release(hold)  # count 1, nobody waiting: the fast step
    assert releases.fast.count == 1
    assert hold.count == 0 and len(state.registry) == 0
    assert not await kind.locked(keys)

    hold = await registered_hold(state, kind, keys, owner)
    assert (await granted(runtime, kind, keys, owner, before=1)).held == 2  # re-entered
    hold.count = 2
    await releases.release(hold)  # nested: the path's own release, the count down
    assert releases.fast.count == 1
    assert hold.count == 1 and await kind.hold_count(keys, hold) == 1  # here and in Redis
    await releases.release(hold)
    assert releases.fast.count == 2
    assert not await kind.locked(keys)
    assert releases.released_on_task_exit == 0


async def test_the_release_path_alone_releases_the_holds_of_a_task_that_ended(
    state: EngineState,
    runtime: Runtime,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    releases = ReleasePath(state)
    kind = ReentrantLockKind(runtime)
    keys = LockKeys(prefix, "left-behind")
    owner = owner_of(runtime, 2)

    async def holder() -> None:
        await registered_hold(state, kind, keys, owner)
        task = asyncio.current_task()
        assert task is not None
        releases.watch(task, owner)

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await asyncio.create_task(holder())
        await asyncio.sleep(0)  # (the task's done callbacks run)
        assert releases.released_on_task_exit == 1
        assert owner not in releases.watched and len(state.registry) == 0
        assert state.cleanup.pending == 1  # its release, sent in the background
        assert await state.cleanup.run_once() == 0
    assert not await kind.locked(keys)
    assert "was still held by task" in caplog.text


# -- the acquire path -------------------------------------------------------------------


async def test_the_acquire_path_alone_grants_reenters_and_times_out(
    state: EngineState, runtime: Runtime, prefix: str
) -> None:
    releases = ReleasePath(state)
    acquiring = AcquirePath(state, releases)
    kind = ReentrantLockKind(runtime)
    keys = LockKeys(prefix, "acquired")
    owner, other = owner_of(runtime, 1), owner_of(runtime, 2)

    hold = await acquiring.acquire(kind, keys, owner, 5.0, None)  # free: the fast step
    assert acquiring.fast.count == 1 and state.acquired == {"lock": 1}
    assert state.registry.get(hold.resource, owner) is hold
    assert owner in releases.watched  # its task's end would release it
    assert await kind.locked(keys)

    again = await acquiring.acquire(kind, keys, owner, 5.0, None)  # the path's re-entry
    assert again is hold and hold.count == 2
    assert acquiring.fast.count == 1 and state.acquired == {"lock": 1}

    with pytest.raises(aiolock.LockTimeoutError):
        await acquiring.acquire(kind, keys, other, 0, None)  # one attempt, found busy
    assert state.timeouts == {"lock": 1}
    assert state.hub.idle(keys.channel)  # the single attempt joined no queue

    await releases.release(hold)
    await releases.release(hold)
    assert not await kind.locked(keys)
    assert acquiring.connection_errors == 0


async def test_the_acquire_path_waits_and_is_handed_the_lock_by_the_release_path(
    state: EngineState, runtime: Runtime, prefix: str
) -> None:
    releases = ReleasePath(state)
    acquiring = AcquirePath(state, releases)
    kind = ReentrantLockKind(runtime)
    keys = LockKeys(prefix, "handed")
    holder, waiter = owner_of(runtime, 1), owner_of(runtime, 2)
    hold = await acquiring.acquire(kind, keys, holder, 5.0, None)
    handed: list[Hold] = []
    taken, done = asyncio.Event(), asyncio.Event()

    async def wait_for_it() -> None:  # a task of its own: the hold is its task's
        handed.append(await acquiring.acquire(kind, keys, waiter, 10.0, None))
        taken.set()
        await done.wait()
        await releases.release(handed[0])  # nobody waits now: the fast step

    async with anyio.create_task_group() as tg:
        tg.start_soon(state.hub.run)  # the hub's subscriptions, as the manager runs them
        tg.start_soon(wait_for_it)
        with anyio.fail_after(5):
            while not state.hub.wanted(keys.channel):  # noqa: ASYNC110  (no event tells)
                await asyncio.sleep(0.01)  # its fast attempt found the lock busy: it waits
        await releases.release(hold)  # a local waiter: handed over, not the fast step
        with anyio.fail_after(5):
            await taken.wait()
        assert handed[0].owner == waiter and handed[0] is not hold
        assert releases.fast.count == 0 and acquiring.fast.count == 1
        assert state.acquired == {"lock": 2}
        assert state.hub.idle(keys.channel)
        done.set()
        with anyio.fail_after(5):
            while releases.fast.count != 1:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert not await kind.locked(keys)
    assert releases.released_on_task_exit == 0


# -- the fast steps -----------------------------------------------------------------------


class GaveUp(Exception):
    """What the stand-in's wait raises: the test only looks at how it was called."""


class RecordingSteps:
    """A stand-in for the acquire path (:class:`~aiolock._engine.fast.AcquireSteps`):
    the real hub, runtime and reachability, and steps that record how they were called."""

    def __init__(self, state: EngineState) -> None:
        self.hub: WaiterHub = state.hub
        self.rt: Runtime = state.rt
        self.reach: Reachability = state.reach
        self.adopted: list[tuple[Hold, bool]] = []
        self.waits: list[tuple[Waiter | None, Busy | BaseException | None, float | None]] = []
        self.timeouts: list[str] = []

    def manager_closed(self) -> ManagerNotOpenError:
        return ManagerNotOpenError("closed")

    def timed_out(self, kind: LockKind, keys: LockKeys) -> None:
        self.timeouts.append(keys.name)

    def adopt(self, hold: Hold, granted: bool = False) -> Hold:
        self.adopted.append((hold, granted))
        return hold

    def acquire_new(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        timeout: float | None,
        lease: float | None,
        permits: int,
    ) -> Coroutine[Any, Any, Hold]:
        raise AssertionError("not reached without replicas=")

    async def wait(
        self,
        kind: LockKind,
        keys: LockKeys,
        owner: str,
        lease: float | None,
        deadline: float | None,
        timeout: float | None,
        permits: int,
        waiter: Waiter | None = None,
        first: Busy | BaseException | None = None,
        undo: Attempt | None = None,
    ) -> Hold:
        self.waits.append((waiter, first, deadline))
        assert waiter is not None
        self.hub.leave(waiter, acquired=False)  # as a wait's every way out does
        raise GaveUp

    async def in_turn(self, waiter: Waiter, deadline: float | None) -> tuple[bool, bool]:
        raise AssertionError("a lone acquisition never waits for a turn")

    async def undo(self, kind: LockKind, attempt: Attempt, until: float | None = None) -> None:
        raise AssertionError("no attempt fails in flight here")

    async def release_quietly(self, hold: Hold, *, pass_on: bool = False) -> None:
        raise AssertionError("the hub stays open here")


async def test_the_fast_acquire_alone_grants_or_hands_its_waiter_to_the_wait(
    state: EngineState, runtime: Runtime, prefix: str
) -> None:
    steps = RecordingSteps(state)
    fast = FastAcquire(steps)
    kind = ReentrantLockKind(runtime)
    keys = LockKeys(prefix, "fast")
    channel = keys.channel

    hold = await fast.acquire(kind, keys, owner_of(runtime, 1), 5.0, None, 1, channel)
    assert steps.adopted == [(hold, True)] and fast.count == 1
    assert state.hub.idle(channel)  # its lazy entry, dropped: no queue was made
    assert await kind.locked(keys)

    before = time.monotonic()
    with pytest.raises(GaveUp):  # busy: the wait goes on with a waiter made for it
        await fast.acquire(kind, keys, owner_of(runtime, 2), 5.0, None, 1, channel)
    ((waiter, first, deadline),) = steps.waits
    assert isinstance(first, Busy) and first.ttl > 0
    assert waiter is not None and waiter.owner == owner_of(runtime, 2)
    assert deadline is not None and before + 5.0 <= deadline <= time.monotonic() + 5.0
    assert fast.count == 1

    with pytest.raises(aiolock.LockTimeoutError):  # one attempt: no waiter, no wait
        await fast.acquire(kind, keys, owner_of(runtime, 3), 0, None, 1, channel)
    assert steps.timeouts == ["fast"] and len(steps.waits) == 1
    assert state.hub.idle(channel)


async def test_the_fast_release_alone_frees_a_lock_or_reports_it_lost(
    state: EngineState, runtime: Runtime, admin: Redis, prefix: str
) -> None:
    releases = ReleasePath(state)
    fast = FastRelease(releases)  # a step of its own, over the path's protocol
    kind = ReentrantLockKind(runtime)
    keys = LockKeys(prefix, "fast-release")
    owner = owner_of(runtime, 1)

    hold = await registered_hold(state, kind, keys, owner)
    await fast.release(hold)
    assert fast.count == 1 and releases.fast.count == 0
    assert hold.count == 0 and len(state.registry) == 0
    assert not await kind.locked(keys)
    assert state.cleanup.pending == 0

    hold = await registered_hold(state, kind, keys, owner)
    await admin.delete(keys.lock)  # gone behind its back
    with pytest.raises(aiolock.LockLostError, match="no longer held"):
        await fast.release(hold)
    assert state.lost == {"lock": 1}
    assert state.registry.pop_lost(hold.resource, owner) is None  # reported right there


# -- the engine that composes them -------------------------------------------------------


async def test_the_engine_binds_the_paths_entry_points_with_no_layer_between(
    locks: aiolock.LockManager,
) -> None:
    engine = locks._open_engine()
    for name, part, function in [
        ("acquire", engine.acquiring, AcquirePath.acquire),
        ("adopt", engine.acquiring, AcquirePath.adopt),
        ("release", engine.releases, ReleasePath.release),
        ("release_lost", engine.releases, ReleasePath.release_lost),
        ("release_quietly", engine.releases, ReleasePath.release_quietly),
    ]:
        bound = vars(engine)[name]  # an attribute of the instance: no method of the engine's
        assert bound.__self__ is part and bound.__func__ is function, name
    assert engine.registry is engine.state.registry is engine.acquiring.registry
    assert engine.hub is engine.releases.hub
    async with locks.lock("counted"):
        pass
    assert (engine.fast_acquired, engine.fast_released) == (1, 1)
    assert engine.acquiring.fast.count == engine.releases.fast.count == 1
