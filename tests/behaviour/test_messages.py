"""What aiolock says when something goes wrong: the words of its errors and warnings."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import aiolock


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aiolock" and r.levelno >= 30]


async def test_a_manager_not_open_says_to_call_open(redis_url: str) -> None:
    manager = aiolock.LockManager.from_url(redis_url)
    with pytest.raises(aiolock.ManagerNotOpenError) as caught:
        await manager.lock("x").acquire()
    assert "await manager.open()" in str(caught.value)
    assert "__aenter__" not in str(caught.value)


async def test_a_task_that_ends_holding_a_permit_is_reported_as_a_permit(
    locks: aiolock.LockManager, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aiolock")

    async def forgetful() -> None:
        await locks.semaphore("pool", 2).acquire(timeout=5)

    await asyncio.create_task(forgetful(), name="forgetful-holder")
    for _ in range(100):  # the task's done callback runs soon after the task ends
        if locks.statistics().released_on_task_exit:
            break
        await asyncio.sleep(0.05)
    found = [m for m in _warnings(caplog) if "forgetful-holder" in m]
    assert found and found[0].startswith("a permit of semaphore 'pool' was still held"), found
    assert "A lock belongs" not in found[0]


async def test_a_renewal_that_times_out_says_so(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """It used to log "lease renewal of 1 locks failed, will retry: " and nothing more:
    the timeout's TimeoutError has no message."""
    caplog.set_level(logging.WARNING, logger="aiolock")
    locks = aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=1.5)
    async with locks, locks.lock("slow"):
        engine: Any = locks._engine  # the watchdog is internal: drive one round of it
        (hold,) = list(engine.registry)

        async def no_reply(*args: object) -> list[bool]:
            await asyncio.sleep(30)  # cut short by the watchdog's timeout (0.5 s)
            return []

        real = hold.kind.renew
        hold.kind.renew = no_reply
        try:
            assert await engine.watchdog.run_round([hold]) is False
        finally:
            hold.kind.renew = real
    found = [m for m in _warnings(caplog) if m.startswith("lease renewal")]
    # The manager's own watchdog may have run a round into the stub as well: same words.
    expected = (
        "lease renewal of 1 lock hold failed, will retry: no reply within 0.5 s "
        "(a third of the lease)"
    )
    assert found and set(found) == {expected}, found
