"""Regressions from the adversarial review of the fair lock (issue 8).

Each test names the defect it pins down and failed before its fix (noted in its
docstring). The fair lock's own promises are in :mod:`tests.test_fair_lock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.kind import Attempt, Busy, Granted, ReleaseStatus
from aiolock._errors import LockConnectionError
from aiolock._kinds.fair.kind import FairLockKind
from aiolock._redis.client import as_text

from .helpers import PATIENCE, eventually, within
from .test_fair_lock import (
    REPO_ROOT,
    SHORT_CLAIM_TTL,
    Child,
    children,
    hold_until,
    other,
    queued,
    spec,
    until_queued,
)

__all__ = ["other"]  # the second manager fixture, shared with test_fair_lock


def lock_key(prefix: str, name: str) -> str:
    return f"{prefix}:fair:{{{name}}}"


# -- defect 1: an undo that passes a grant on did not void the pickup it undid ----------


async def test_a_pickup_that_runs_after_its_undo_does_not_queue_a_ghost(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    """A pickup attempt cancelled in flight, whose undo reaches Redis first (another
    connection), must be a no-op when it runs late.

    Before the fix: undo.lua found the grant (count 1), passed it on and returned 1
    without setting the void marker; the late pickup then found its field gone and the
    lock held, and queued the field again -- a waiter that had left, back in the queue
    (and granted the lock in turn, stalling it for a pickup lease)."""
    kind = locks._kind(FairLockKind)
    keys = locks._keyspace.keys("ghost", "fair")
    holder = other.fair_lock("ghost")
    await holder.acquire()

    def attempt(field: str, void: str) -> Attempt:
        return Attempt(keys, "o", field, 0, 30.0, keys.void(void))

    assert isinstance(await kind.attempt(attempt("A", "a1")), Busy)  # queued first
    log: list[Any] = []
    gate = asyncio.Event()
    second = asyncio.create_task(hold_until(locks.fair_lock("ghost"), gate, log, "b"))
    await until_queued(admin, prefix, "ghost", 2)
    await holder.release()  # granted to A, which is "cancelled" while picking it up
    assert as_text(await admin.hget(lock_key(prefix, "ghost"), "A")) == "1"
    pickup = attempt("A", "a2")
    assert await kind.undo(pickup)  # the undo overtakes the pickup: the grant passes on
    await eventually(lambda: bool(log), what="the next waiter's grant")
    late = await kind.attempt(pickup)  # the pickup arrives late
    assert not isinstance(late, Granted)
    assert await queued(admin, prefix, "ghost") == []  # A stays gone
    gate.set()
    await second
    assert not await admin.exists(lock_key(prefix, "ghost"))


# -- defect 2: a deferred undo of a failed attempt reverted a later one ------------------


async def test_a_deferred_undo_never_reverts_a_later_pickup(
    locks: aiolock.LockManager,
    other: aiolock.LockManager,
    admin: Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pickup whose reply is lost (connection error) is undone; if Redis cannot be
    reached for the undo, it is retried in the background. The waiter retries its own
    attempt meanwhile; the late undo must not touch what that retry acquired.

    Before the fix: the waiter kept its one field for the retry, the retry picked the
    grant up again under it, and the background undo (same field, count 1) then deleted
    the new hold and granted the lock to the next waiter: two holders at once."""
    kind = locks._kind(FairLockKind)
    real_attempt, real_undo = kind.attempt, kind.undo
    holder = other.fair_lock("lost")
    await holder.acquire()
    lost_reply = asyncio.Event()
    down_until = [0.0]

    async def attempt(a: Attempt) -> Granted | Busy:
        outcome = await real_attempt(a)
        if isinstance(outcome, Granted) and not lost_reply.is_set():
            lost_reply.set()  # it ran in Redis, but its reply never arrived
            down_until[0] = time.monotonic() + 0.5
            raise LockConnectionError("connection lost (injected)")
        return outcome

    async def undo(a: Attempt) -> bool:
        if time.monotonic() < down_until[0]:
            raise LockConnectionError("connection lost (injected)")
        return await real_undo(a)

    monkeypatch.setattr(kind, "attempt", attempt)
    monkeypatch.setattr(kind, "undo", undo)
    lock = locks.fair_lock("lost", timeout=10)
    acquired, checked = asyncio.Event(), asyncio.Event()

    async def waiter() -> bool:  # a hold belongs to its task: check it from there
        await lock.acquire()
        acquired.set()
        await checked.wait()
        owned = await lock.owned()
        with contextlib.suppress(aiolock.LockLostError):
            await lock.release()
        return owned

    task = asyncio.create_task(waiter())
    await until_queued(admin, prefix, "lost", 1)
    await holder.release()
    await asyncio.wait_for(acquired.wait(), 10)
    assert lost_reply.is_set()
    # Let the background undo run (Redis is "reachable" again after 0.5 s).
    await asyncio.sleep(max(0.0, down_until[0] - time.monotonic()) + 0.3)
    await eventually(lambda: locks.statistics().pending_cleanups == 0, what="the undo")
    checked.set()
    assert await asyncio.wait_for(task, 5), "the late undo deleted the hold the retry acquired"
    assert not await admin.exists(lock_key(prefix, "lost"))


# -- the storm: 50 waiters in 3 processes, random timeouts and cancellations, kills -----


async def test_storm_of_waiters_in_three_processes_keeps_exclusion_and_leaves_nothing(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    """3 processes x 17 tasks with random timeouts (some None, some 0) and cancellations
    at random moments, plus two more waiter processes SIGKILLed while they wait or
    hold: an independent checker in Redis sees one holder at a time and increasing
    fencing tokens; afterwards the queue is empty and every key left has a TTL."""
    name, check = "storm", f"{prefix}-check"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *sys.path]))
    procs: list[asyncio.subprocess.Process] = []
    try:
        for i in range(3):
            storm_spec = {
                "url": redis_url, "prefix": prefix, "name": name, "check": check,
                "seed": i, "tasks": 17, "rounds": 6, "cancels": 10, "hold": 0.004,
                "lease": 5.0, "claim_ttl": SHORT_CLAIM_TTL, "max_seconds": 25,
            }  # fmt: skip
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests._fair_storm_child", json.dumps(storm_spec),
                cwd=REPO_ROOT, env=env, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            procs.append(proc)
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 20)
            assert line.strip() == b"READY", line
        async with children() as kids:
            for label in ("v1", "v2"):  # waiters that hold a while once granted
                victim = await Child(
                    "wait",
                    spec(redis_url, prefix, name, label=label, order=f"{check}:victims",
                         hold=0.3, claim_ttl=SHORT_CLAIM_TTL),
                ).start()  # fmt: skip
                kids.append(victim)
                await victim.expect("READY")
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            rng = random.Random(5)
            for victim in kids:  # killed at a random moment: waiting, holding or done
                await asyncio.sleep(rng.random() * 1.5)
                await victim.kill()
        reports = []
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line.startswith(b"REPORT "), line
            reports.append(json.loads(line[7:]))
            await asyncio.wait_for(proc.wait(), 10)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    print(reports)  # shown with -s, and on failure
    for report in reports:
        assert report["overlaps"] == 0 and report["fenced"] == 0, report
        assert report["errors"] == [] and report["lost"] == 0, report
        assert report["held_after"] == 0 and report["claims_after"] == 0, report
    assert sum(r["entered"] for r in reports) >= 30, reports
    assert sum(r["cancelled"] for r in reports) >= 10, reports
    # Dead waiters' claims run out within claim_ttl; then nothing is queued.
    deadline = time.monotonic() + 3 * SHORT_CLAIM_TTL
    while await queued(admin, prefix, name) or await admin.exists(lock_key(prefix, name)):
        assert time.monotonic() < deadline, await queued(admin, prefix, name)
        await asyncio.sleep(0.05)
    assert not await admin.exists(f"{lock_key(prefix, name)}:claims")
    async for key in admin.scan_iter(match=f"{prefix}:*", count=1000):
        assert await admin.pttl(key) != -1, f"{as_text(key)} has no TTL"


# -- attacks that held up (kept as tests) ------------------------------------------------


async def test_a_grant_published_while_the_pubsub_connection_is_down_is_picked_up(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    """CLIENT KILL TYPE pubsub, then a release at once: the grant's message is lost, but
    the reconnection wakes the waiter, whose attempt picks the grant up."""
    holder = other.fair_lock("deaf")
    await holder.acquire()
    log: list[Any] = []
    gate = asyncio.Event()
    gate.set()
    waiter = asyncio.create_task(hold_until(locks.fair_lock("deaf"), gate, log, "w"))
    await until_queued(admin, prefix, "deaf", 1)
    await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="subscription")
    assert await admin.client_kill_filter(_type="pubsub")
    started = time.monotonic()
    await holder.release()
    await within(waiter, what="the waiter to pick up the grant whose message was lost")
    # The reconnection's wake-up, with room for a loaded machine: not the holder's 30 s
    # lease, nor the grant's 10 s pickup lease (the default claim_ttl) running out.
    took = time.monotonic() - started
    assert took < 5.0, f"the waiter got the lock {took:.2f} s after the release"
    assert [label for label, _ in log] == ["w"]
    assert await queued(admin, prefix, "deaf") == []


@pytest.mark.parametrize("offset", [-0.004, -0.002, 0.0, 0.002, 0.004])
async def test_a_timeout_as_the_grant_lands_passes_it_on(
    offset: float,
    locks: aiolock.LockManager,
    other: aiolock.LockManager,
    admin: Redis,
    prefix: str,
) -> None:
    """The first waiter's timeout runs out around the moment the release grants it the
    lock: either it takes the lock, or the grant passes to the second waiter at once."""
    name = "edge"
    holder = other.fair_lock(name)
    await holder.acquire()

    async def try_first() -> bool:
        try:
            async with locks.fair_lock(name, timeout=0.3):
                return True
        except aiolock.LockTimeoutError:
            return False

    first = asyncio.create_task(try_first())
    started = time.monotonic()
    await until_queued(admin, prefix, name, 1)
    log: list[Any] = []
    gate = asyncio.Event()
    gate.set()
    second = asyncio.create_task(hold_until(other.fair_lock(name), gate, log, "second"))
    await until_queued(admin, prefix, name, 2)
    await asyncio.sleep(max(0.0, started + 0.3 + offset - time.monotonic()))
    released_at = time.monotonic()
    await holder.release()
    await within(first, what="the first waiter (its lock or its timeout)")
    await within(second, timeout=2 * PATIENCE, what="the second waiter")
    # Granted at once, with room for a loaded machine: not after the first waiter's grant
    # waited out its 10 s pickup lease (the default claim_ttl).
    took = time.monotonic() - released_at
    assert took < 5.0, f"the second waiter got the lock {took:.2f} s after the release"
    assert [label for label, _ in log] == ["second"]
    assert await queued(admin, prefix, name) == []
    assert not await admin.exists(lock_key(prefix, name))


async def test_a_resent_release_after_other_owners_changes_nothing(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    """A final release sent again (same release id) after the lock passed through two
    more owners, one of them still holding and one waiter queued: it answers RELEASED
    and touches neither the holder, nor the queue, nor publishes a grant."""
    kind = locks._kind(FairLockKind)
    lock = locks.fair_lock("resend")
    await lock.acquire()
    hold = next(iter(locks._engine.registry))  # type: ignore[union-attr]
    first_outcome = await kind.release(hold, 1, "rid-1", None, False, False)
    for _ in range(2):  # two more owners come and go, then one holds
        async with other.fair_lock("resend"):
            pass
    holder = other.fair_lock("resend")
    await holder.acquire()
    log: list[Any] = []
    waiter = asyncio.create_task(hold_until(locks.fair_lock("resend"), asyncio.Event(), log, 0))
    await until_queued(admin, prefix, "resend", 1)
    before = await admin.hgetall(lock_key(prefix, "resend"))
    again = await kind.release(hold, 1, "rid-1", None, False, False)
    assert again.status is first_outcome.status is ReleaseStatus.RELEASED
    assert again.value == 0  # no grant, no message
    assert await admin.hgetall(lock_key(prefix, "resend")) == before
    assert len(await queued(admin, prefix, "resend")) == 1
    await holder.release()
    await eventually(lambda: bool(log), what="the waiter's grant")
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    locks._engine.registry.remove(hold)  # type: ignore[union-attr]
