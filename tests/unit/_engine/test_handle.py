"""Unit tests of :mod:`aiolock._engine.handle`.

Checks the helpers every handle shares (``resolve``'s defaults and argument checks,
``extend_seconds``' exactly-one rule, the lost and not-owned errors), and the
:class:`Handle` base through a small subclass over a real LockManager that takes two
locks as one: ``async with`` guards and releases all its holds, the loss of one cancels
the body and releases the rest, the body guard is made lazily; that one handle serves
many tasks, each its own owner; and that ``_take`` acquires under the handle's
``replicas=`` policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

import anyio
import pytest

import aiolock
from aiolock._engine.handle import (
    _DEFAULT,
    Handle,
    extend_seconds,
    lost_error,
    not_owned_error,
    resolve,
)
from aiolock._engine.kind import Hold
from aiolock._keys import LockKeys
from aiolock._redis.replicas import INHERIT


class Pair(Handle[tuple[LockKeys, LockKeys], tuple[int, int]]):
    """Two locks taken as one; ``async with`` binds their fencing tokens."""

    __slots__ = ()

    async def _both(self) -> list[Hold]:
        engine = self._manager._open_engine()
        first, second = self._keys
        return [
            await self._take(first, self._timeout, self._lease, engine=engine),
            await self._take(second, self._timeout, self._lease, engine=engine),
        ]

    def _acquire_block(self) -> Coroutine[Any, Any, Hold | list[Hold]]:
        return self._both()

    def _entered(self, holds: Sequence[Hold]) -> tuple[int, int]:
        first, second = holds
        return first.token, second.token


def pair(locks: aiolock.LockManager, a: str, b: str) -> Pair:
    kind = locks.lock(a)._kind
    keys = (locks._keyspace.keys(a), locks._keyspace.keys(b))
    return Pair(locks, kind, keys, timeout=5.0, lease=None)


def test_resolve_takes_the_defaults_or_checks_what_is_given() -> None:
    assert repr(_DEFAULT) == "<default>"
    assert resolve(_DEFAULT, _DEFAULT, 5.0, 2.0) == (5.0, 2.0)
    assert resolve(None, _DEFAULT, 5.0, 2.0) == (None, 2.0)  # None: wait as long as it takes
    assert resolve(1, None, 5.0, 2.0) == (1.0, None)  # None: renewed, not the fixed default
    assert resolve(0, 0.5, None, None) == (0.0, 0.5)
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        resolve(-1, _DEFAULT, 5.0, None)
    with pytest.raises(TypeError, match="timeout must be a number of seconds"):
        resolve(True, _DEFAULT, 5.0, None)
    with pytest.raises(ValueError, match="lease must be between"):
        resolve(_DEFAULT, 0, 5.0, None)


def test_extend_seconds_takes_exactly_one_of_lease_and_additional() -> None:
    assert extend_seconds(2, None) == 2.0
    assert extend_seconds(None, 1.5) == 1.5
    for both_or_neither in [(None, None), (1.0, 1.0)]:
        with pytest.raises(TypeError, match="exactly one"):
            extend_seconds(*both_or_neither)
    with pytest.raises(ValueError, match=r"^additional must be between"):
        extend_seconds(None, -1)
    with pytest.raises(ValueError, match=r"^lease must be between"):
        extend_seconds(0, None)


def test_the_errors_say_what_was_lost_or_not_owned() -> None:
    lost = lost_error("lock 'x'", "its lease ended", " the critical section")
    assert isinstance(lost, aiolock.LockLostError)
    assert isinstance(lost, aiolock.LockNotOwnedError)  # a release()'s callers catch both
    assert str(lost) == (
        "lock 'x' was lost while this task held it (its lease ended); another owner may "
        "have entered the critical section"
    )
    not_owned = not_owned_error("semaphore 's'")
    assert type(not_owned) is aiolock.LockNotOwnedError
    assert str(not_owned).startswith("semaphore 's' is not held by the current task")
    assert "a child task is a different owner" in str(not_owned)


async def test_a_block_guards_and_releases_all_its_holds(locks: aiolock.LockManager) -> None:
    both = pair(locks, "a", "b")
    assert both._body_guard is None  # made when a block first enters
    async with both as tokens:
        assert all(token > 0 for token in tokens)
        assert await locks.lock("a").locked() and await locks.lock("b").locked()
        guard = both._body_guard
        assert guard is not None
        assert locks.statistics().held == 2
    assert not await locks.lock("a").locked() and not await locks.lock("b").locked()
    assert locks.statistics().held == 0
    async with both:
        assert both._body_guard is guard  # one guard per handle, kept


async def test_the_loss_of_one_hold_cancels_the_body_and_frees_the_rest(
    locks: aiolock.LockManager,
) -> None:
    both = pair(locks, "c", "d")
    entered = asyncio.Event()
    after_the_body: list[str] = []

    async def body() -> None:
        async with both:
            entered.set()
            await asyncio.Event().wait()  # until the loss cancels it
            after_the_body.append("ran on")

    task = asyncio.create_task(body())
    with anyio.fail_after(5):
        await entered.wait()
    assert await locks.lock("c").force_release()  # behind the body's back
    with anyio.fail_after(5), pytest.raises(aiolock.LockLostError, match="'c' was lost inside"):
        await task
    assert after_the_body == []
    assert not await locks.lock("d").locked()  # released at the block's exit
    assert locks.statistics().held == 0


async def test_one_handle_serves_many_tasks_each_its_own_owner(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("shared")  # one handle, used by two tasks
    held, done = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with lock:
            held.set()
            await done.wait()

    task = asyncio.create_task(holder())
    with anyio.fail_after(5):
        await held.wait()
    assert await lock.locked()
    assert not await lock.owned()  # this task is another owner
    assert not await lock.try_acquire()
    with pytest.raises(aiolock.LockNotOwnedError, match="not held by the current task"):
        await lock.release()
    done.set()
    await task
    assert await lock.try_acquire()
    await lock.release()


async def test_take_acquires_under_the_handles_replicas_policy(
    locks: aiolock.LockManager,
) -> None:
    plain = locks.lock("replicated")
    assert plain._replicas is INHERIT  # the manager's: no WAIT
    # A server without replicas acknowledges none: the grant is undone and refused.
    strict = locks.lock("replicated", replicas=1, replica_timeout=0.05)
    with pytest.raises(aiolock.ReplicaAckError):
        await strict.acquire(timeout=0)
    assert not await strict.locked()
    assert locks.statistics().held == 0
    relaxed = locks.lock("replicated", replicas=0)  # no WAIT for this lock
    async with relaxed:
        assert await relaxed.owned()
    async with plain:
        assert await plain.owned()
