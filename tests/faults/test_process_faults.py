"""A lock holder in another process is killed (SIGKILL) or paused (SIGSTOP/SIGCONT).

The holders are child processes (:mod:`tests._children.faults`), stopped by pid.
"""

from __future__ import annotations

import asyncio
import signal
import time

from redis.asyncio import Redis

import aiolock
from tests._support.faults import (
    Child,
    bounded,
    children,
    eventually,
    fenced_write,
    store_keys,
    store_log,
    unique_prefix,
)

#: The children's lease: renewed every LEASE / 3 while they run. 2 s, not 1: a child on a
#: loaded machine renews late now and then, and a renewal later than 2 / 3 of a lease
#: would let the test in while the child still runs.
LEASE = 2.0


async def test_holder_killed_with_sigkill_frees_the_lock_within_its_lease(redis_url: str) -> None:
    prefix = unique_prefix("kill")
    child = Child(
        "hold",
        {"url": redis_url, "prefix": prefix, "name": "k", "lease": LEASE, "max_seconds": 60},
    )
    client = Redis.from_url(redis_url)
    try:
        async with children(child), aiolock.LockManager(client, prefix=prefix) as locks:
            held = await child.expect("HELD ", 60)
            child_token = int(held.split()[1])
            lock = locks.lock("k")

            async def take() -> tuple[float, int | None]:
                async with lock:
                    return time.monotonic(), lock.fencing_token

            # A waiter queues while the child holds; the lease is renewed past its length.
            waiter = asyncio.create_task(take())
            await eventually(lambda: locks.statistics().hub.waiters == 1, what="a waiter")
            await asyncio.sleep(1.5 * LEASE)
            assert not waiter.done(), "the child's lease was not renewed"
            assert await lock.locked()
            child.signal(signal.SIGKILL)
            killed_at = time.monotonic()
            got_at, token = await bounded(waiter, LEASE + 10, "the waiter")
            waited = got_at - killed_at
            assert token is not None and token > child_token
            # A fresh acquisition after the crash is immediate.
            async with locks.lock("k", timeout=2):
                pass
            assert await child.wait(10) == -signal.SIGKILL
    finally:
        await client.aclose()
    print(f"\nlock taken {waited:.2f} s after SIGKILL (lease {LEASE} s)")
    # within the child's lease (room for a loaded machine), not the waiter's 30 s wait
    # for a lease it does not know
    assert waited < LEASE + 3.0, f"the waiter got the lock {waited:.2f} s after the kill"


async def test_paused_holder_is_fenced_off_and_told_it_lost_the_lock(redis_url: str) -> None:
    """Why fencing tokens exist.

    A holder that stops (SIGSTOP here; a GC pause, a swapped-out VM or a stalled disk in
    real life) keeps believing it holds the lock while its lease runs out and another
    process takes it. No lock service can prevent the paused process from acting on that
    stale belief the instant it resumes, before it learns anything: its next write was
    already decided. What protects the resource is the fencing token: the new holder's
    token is larger, the resource remembers the largest token it accepted, and the stale
    write is rejected. aiolock's part is (1) strictly increasing tokens and (2) telling the
    resumed holder promptly: its ``async with`` body is cancelled and ``LockLostError``
    raised, so it stops instead of carrying on.

    The child blocks (a gate on stdin) between reading its token and writing with it, and
    is stopped there, so that after SIGCONT its very first act is the stale write.
    """
    prefix = unique_prefix("pause")
    name = "fenced"
    child = Child(
        "pause",
        {
            "url": redis_url,
            "prefix": prefix,
            "name": name,
            "lease": LEASE,
            "interval": 0.1,  # between writes; the gate itself is answered at once
            "max_seconds": 60,
        },
    )
    admin = Redis.from_url(redis_url)
    client = Redis.from_url(redis_url)
    try:
        async with children(child), aiolock.LockManager(client, prefix=prefix) as locks:
            child_token = int((await child.expect("HELD ", 60)).split()[1])
            # A few writes, spread over more than a lease: renewal keeps the child's hold.
            started = time.monotonic()
            n = 0
            while n < 3 or time.monotonic() - started < 1.5 * LEASE:
                n += 1
                assert n < 100
                await child.expect(f"READY {n}", 30)
                await child.send(b"go\n")
                assert await child.expect(f"WROTE {n} ", 30) == f"WROTE {n} 1", child.explain()
            n += 1
            await child.expect(f"READY {n}", 30)
            child.signal(signal.SIGSTOP)  # stopped inside the gate, token in hand
            await child.send(b"go\n")  # waits in the pipe until it runs again
            paused_at = time.monotonic()
            lock = locks.lock(name, timeout=10 * LEASE)
            async with lock:
                took = time.monotonic() - paused_at
                token = lock.fencing_token
                assert token is not None and token > child_token
                assert await fenced_write(admin, prefix, name, token, "test")
                child.signal(signal.SIGCONT)
                stale = await child.expect(f"WROTE {n} ", 30)
                lost = await child.expect("LOST ", 10 * LEASE)
                assert await lock.owned(), "the resumed child released the test's hold"
                assert await lock.hold_count() == 1
                assert await child.wait(30) == 0, child.explain()
                assert await lock.owned(), "the child's exit released the test's hold"
            log = await store_log(admin, prefix, name)
            store, _ = store_keys(prefix, name)
            best = await admin.hget(store, "token")
    finally:
        await client.aclose()
        await admin.aclose()
    print(f"\nlock taken {took:.2f} s after SIGSTOP (lease {LEASE} s); child: {child.lines[-3:]}")
    assert took < LEASE + 3.0, f"the lock was taken {took:.2f} s after the pause"
    assert stale == f"WROTE {n} 0", f"the stale write was accepted: {child.lines}"
    assert "lost" in lost, lost
    ours = [i for i, (writer, _, _) in enumerate(log) if writer == "test"]
    assert len(ours) == 1, log
    before, after = log[: ours[0]], log[ours[0] + 1 :]
    assert before and all(w == "child" and t == child_token and ok for w, t, ok in before), log
    assert after == [("child", child_token, False)], log  # the one stale write: rejected
    assert best is not None and int(best) == token
