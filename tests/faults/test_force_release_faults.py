"""A lock force-released by another manager (an administrator, another process): the
holder must learn of it as a loss, never carry on as if nothing happened."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

import aiolock
from tests._support.faults import bounded, unique_prefix


async def test_a_force_release_elsewhere_cancels_the_body_at_the_next_renewal(
    redis_url: str,
) -> None:
    lease = 1.5  # renewal every 0.5 s
    prefix = unique_prefix("force")
    clients = [Redis.from_url(redis_url) for _ in range(2)]
    outcome: list[str] = []
    try:
        async with (
            aiolock.LockManager(clients[0], prefix=prefix, lease=lease) as holder_side,
            aiolock.LockManager(clients[1], prefix=prefix, lease=lease) as admin_side,
        ):
            forced = asyncio.Event()

            async def hold() -> float:
                try:
                    async with holder_side.lock("f", timeout=5):
                        forced.set()
                        await asyncio.sleep(30)
                        outcome.append("the body was not cancelled")
                except aiolock.LockLostError as exc:
                    outcome.append(str(exc))
                return time.monotonic()

            task = asyncio.create_task(hold())
            await bounded(forced.wait(), 10, "the holder entering")
            assert await admin_side.lock("f").force_release()
            forced_at = time.monotonic()
            ended = await bounded(task, 10, "the holder")
            # and the lock is usable by others at once
            async with admin_side.lock("f", timeout=2):
                pass
    finally:
        for client in clients:
            await client.aclose()
    assert len(outcome) == 1 and "lost" in outcome[0], outcome
    assert ended - forced_at < lease / 3 + 1.0, ended - forced_at


async def test_reentering_a_hold_force_released_elsewhere_is_a_loss(redis_url: str) -> None:
    """Before any renewal round notices, the holder re-enters: the re-entry must report
    the loss, not take the free lock anew under the old hold (with its old token, its
    count reset, and the outer body carrying on)."""
    prefix = unique_prefix("reenter")
    clients = [Redis.from_url(redis_url) for _ in range(2)]
    outcome: object = None
    try:
        async with (
            aiolock.LockManager(clients[0], prefix=prefix, lease=30) as holder_side,
            aiolock.LockManager(clients[1], prefix=prefix, lease=30) as admin_side,
        ):
            lock = holder_side.lock("r", timeout=5)
            try:
                async with lock:
                    first = lock.fencing_token
                    assert await admin_side.lock("r").force_release()
                    async with admin_side.lock("r", timeout=5) as other:  # someone came in
                        between = other.fencing_token
                    try:
                        async with lock:  # re-entry, before any renewal round
                            outcome = ("re-entered", lock.fencing_token, await lock.hold_count())
                    except aiolock.LockLostError:
                        outcome = "lost"
                        raise
            except aiolock.LockLostError:
                pass
            assert not await admin_side.lock("r").locked(), "the late re-entry kept the lock"
    finally:
        for client in clients:
            await client.aclose()
    assert outcome == "lost", (
        f"re-entry after a force-release: {outcome!r} (token before {first}, "
        f"another owner's token {between})"
    )


async def test_a_nested_release_of_a_force_released_hold_reports_the_loss(
    redis_url: str,
) -> None:
    prefix = unique_prefix("dash")
    clients = [Redis.from_url(redis_url) for _ in range(3)]
    try:
        async with aiolock.LockManager(clients[0], prefix=prefix) as closing:
            await closing.lock("n").acquire()  # released quietly by the close
        async with (
            aiolock.LockManager(clients[1], prefix=prefix) as holder_side,
            aiolock.LockManager(clients[2], prefix=prefix) as admin_side,
        ):
            lock = holder_side.lock("n", timeout=5)
            await lock.acquire()
            await lock.acquire()  # held twice
            assert await admin_side.lock("n").force_release()
            with pytest.raises(aiolock.LockLostError):
                await lock.release()
    finally:
        for client in clients:
            await client.aclose()
