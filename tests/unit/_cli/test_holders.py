"""``aiolock show``/``list``: each holder's fencing token and how long it has held (issue 38).

A plain lock's state keeps its holder's token, the server's clock in microseconds at the
grant (or forced above it), so the command shows that token and the server's ``TIME``
less it as ``held_for``; the other kinds keep no token and no start per hold (``null``).
Everything is read through the command's JSON and text and the handles' public API.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

import aiolock
from aiolock._kinds.lock import inspect
from aiolock.contrib.jobs import Claim, holder_info
from tests._support.helpers import eventually
from tests._support.redlock import redlock, started
from tests.unit._cli.test_main import run_cli


def holders(document: str, kind: str) -> list[dict[str, Any]]:
    """The holders of the object of *kind* in a ``show --json`` document."""
    (obj,) = [obj for obj in json.loads(document)["objects"] if obj["kind"] == kind]
    return list(obj["holders"])


async def test_show_gives_a_plain_holders_token_and_a_held_for_that_grows(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    lock = locks.lock("hot")
    before = time.monotonic()
    async with lock:
        token = lock.fencing_token
        await asyncio.sleep(0.3)
        first = await run_cli(redis_url, prefix, "--json", "show", "hot")
        await asyncio.sleep(0.3)
        second = await run_cli(redis_url, prefix, "--json", "show", "hot")
        table = await run_cli(redis_url, prefix, "show", "hot")
        listed = await run_cli(redis_url, prefix, "--json", "list")
        assert lock.fencing_token == token  # one hold throughout
    elapsed = time.monotonic() - before
    assert first.code == second.code == table.code == listed.code == 0, (first, table)
    (shown,) = holders(first.out, "lock")
    (later,) = holders(second.out, "lock")
    assert isinstance(token, int)
    assert shown["token"] == later["token"] == token
    # held at least 0.3 s before the first show read the server's clock, and never more
    # than the whole test took (server and test share this machine's clock)
    assert 0.3 <= shown["held_for"] <= elapsed + 0.1, (shown, elapsed)
    assert later["held_for"] - shown["held_for"] >= 0.3, (shown, later)
    assert later["held_for"] <= elapsed + 0.1, (later, elapsed)
    (obj,) = [o for o in json.loads(listed.out) if o["name"] == "hot"]
    assert obj["holders"][0]["token"] == token  # list --json: the same fields as show
    assert obj["holders"][0]["held_for"] >= 0.6
    (line,) = [line for line in table.out.splitlines() if line.startswith("    ")]
    assert f", token {token}, " in line and ", held for " in line, table.out
    # the holder's token is on the holder's line, not on a fence line (a plain lock has none)
    assert "fence:" not in table.out


async def test_show_follows_the_token_through_a_re_entry_and_a_hand_over(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    """A re-entry keeps the hold's token (and its start); a local hand-over to a waiting
    task of the same manager is a new hold with a new token."""
    first, second = locks.lock("passed"), locks.lock("passed")
    got: asyncio.Event = asyncio.Event()
    done: asyncio.Event = asyncio.Event()
    tokens: list[int | None] = []

    async def wait_then_hold() -> None:
        async with second:
            tokens.append(second.fencing_token)
            got.set()
            await done.wait()

    async with first:
        async with first:  # re-entered: count 2, the same token
            shown = await run_cli(redis_url, prefix, "--json", "show", "passed")
        (holder,) = holders(shown.out, "lock")
        assert (holder["count"], holder["token"]) == (2, first.fencing_token)
        waiter = asyncio.create_task(wait_then_hold())
        await asyncio.sleep(0.1)  # the waiter is queued in the manager
    try:
        await asyncio.wait_for(got.wait(), 10)
        handed = await run_cli(redis_url, prefix, "--json", "show", "passed")
    finally:
        done.set()
        await waiter
    (holder,) = holders(handed.out, "lock")
    assert tokens[0] is not None and holder["token"] == tokens[0]
    assert holder["owner"] != holders(shown.out, "lock")[0]["owner"]
    assert tokens[0] > holders(shown.out, "lock")[0]["token"]


async def test_kinds_that_keep_no_token_per_hold_show_null(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    """Fair, read-write and semaphore holds: their structure keeps counts and lease ends,
    not the hold's token nor its start (the fence key keeps one token for the name)."""
    fair = locks.fair_lock("kinds")
    read = locks.rw_lock("kinds").read()
    sem = locks.semaphore("kinds", limit=2)
    async with fair, read, sem:
        shown = await run_cli(redis_url, prefix, "--json", "show", "kinds")
        table = await run_cli(redis_url, prefix, "show", "kinds")
        assert fair.fencing_token is not None  # the handles have tokens; Redis keeps none
    assert shown.code == table.code == 0, shown
    for kind in ("fair", "rw", "semaphore"):
        (holder,) = holders(shown.out, kind)
        assert holder["token"] is None and holder["held_for"] is None, (kind, holder)
    assert ", token " not in table.out and "held for" not in table.out, table.out


async def test_a_redlocks_holder_has_no_token(prefix: str) -> None:
    """A Redlock has no fencing tokens (its handle's ``fencing_token`` raises): its key
    holds the hold's id, ``<manager id>:<number>``, which is no fencing token."""
    with started(3) as servers:
        async with redlock(servers, prefix, node_timeout=3) as manager:
            lock = manager.lock("rl")
            async with lock:
                url = servers[0].url  # the command reads one master
                shown = await run_cli(url, prefix, "--json", "show", "rl")
                table = await run_cli(url, prefix, "show", "rl")
                with pytest.raises(aiolock.LockError):
                    lock.fencing_token  # noqa: B018
    (holder,) = holders(shown.out, "redlock")
    assert holder["owner"].startswith(manager.id)
    assert holder["token"] is None and holder["held_for"] is None
    assert ", token " not in table.out


async def test_a_job_locks_held_for_is_its_tokens_age(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    """A ``contrib.jobs`` lock is a plain lock: its token is the holder record's, and its
    ``held_for`` the token's age on the server's clock (before: the record's ``since``,
    the holder's clock)."""
    async with Claim(locks, "report:8", job_id="job-8"):

        async def recorded() -> bool:
            return await holder_info(locks, "report:8") is not None

        await eventually(recorded, what="the job's holder record")
        record = await holder_info(locks, "report:8")
        await asyncio.sleep(0.3)
        shown = await run_cli(redis_url, prefix, "--json", "show", "report:8")
    assert record is not None and record.token is not None
    (holder,) = holders(shown.out, "lock")
    assert holder["token"] == record.token
    assert holder["held_for"] >= 0.3


async def test_show_labels_each_kinds_fence(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    """The fence line says what the fence key keeps, apart from the holders' tokens: a
    semaphore's is the last token issued (a holder's own, here), a read-write lock's the
    largest released (a reader still holding may have an older one; a writer's is newer)."""
    sem = locks.semaphore("fences", limit=2)
    permit = await sem.acquire()
    try:
        issued = permit.fencing_token
        first = locks.rw_lock("fences").read()
        await first.acquire()

        async def read_once() -> None:  # another task: a hold of its own, not a re-entry
            async with locks.rw_lock("fences").read():
                pass  # released after the first reader's grant: the fence is newer

        await asyncio.create_task(read_once())
        shown = await run_cli(redis_url, prefix, "show", "fences")
        await first.release()
        writer = locks.rw_lock("fences").write()
        async with writer:
            written = await run_cli(redis_url, prefix, "show", "fences")
    finally:
        await permit.release()
    assert shown.code == written.code == 0, shown
    assert f"fence:      {issued} (the last token issued)" in shown.out, shown.out
    assert "(the largest token released)" in shown.out, shown.out
    assert "newer" not in shown.out, shown.out
    assert "(the largest token released; the writer's token is newer)" in written.out


def test_held_for_is_a_lower_bound_and_never_negative() -> None:
    now_ms = 1_795_000_000_000.0
    assert inspect._held_for(1_795_000_000_000_000 - 2_500_000, now_ms) == 2.5
    # a token forced above the clock (the last one plus one, from a clock that was ahead)
    assert inspect._held_for(1_795_000_000_000_000 + 5_000_000, now_ms) == 0.0
