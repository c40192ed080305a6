"""``aiolock watch`` and ``aiolock list`` see contention inside one process (issue 38):
a release that hands the lock to another task of its manager publishes nothing, and a
plain lock's waiters wait in their process, so before the managers' contention
summaries, 12 tasks of one process on ``hot`` showed 0 events and WAITERS 0."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys

import aiolock
from tests.unit._cli.test_main import CHILD_TIMEOUT, run_cli

ME = f"local-app@{socket.gethostname()} pid {os.getpid()}"


async def _contend(locks: aiolock.LockManager, until: asyncio.Event) -> None:
    async def task() -> None:
        while not until.is_set():
            async with locks.lock("hot"):
                await asyncio.sleep(0.003)

    await asyncio.gather(*(task() for _ in range(8)))


async def test_watch_sees_hand_overs_inside_one_process(redis_url: str, prefix: str) -> None:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, name="local-app") as locks:
        stop = asyncio.Event()
        work = asyncio.create_task(_contend(locks, stop))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aiolock", "--url", redis_url, "--prefix", prefix,
            "--json", "watch", "--duration", "4",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(process.communicate(), CHILD_TIMEOUT)
        finally:
            stop.set()
            await work
    assert process.returncode == 0, err
    events = [json.loads(line) for line in out.decode().splitlines()]
    local = [e for e in events if e["event"] == "local" and e["name"] == "hot"]
    assert len(local) >= 2, events  # a look a second, after the first (the baseline)
    assert sum(e["grants"] for e in local) > 0 and sum(e["handovers"] for e in local) > 0
    assert {e["who"] for e in events} == {ME}  # never a bare manager id
    assert all(e["kind"] == "lock" for e in local)


async def test_list_counts_the_tasks_waiting_in_a_process(redis_url: str, prefix: str) -> None:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, name="local-app") as locks:
        held = locks.lock("hot")
        await held.acquire()
        waiters = [asyncio.create_task(locks.lock("hot").acquire()) for _ in range(5)]
        await asyncio.sleep(1.5)  # the summary is rewritten within a second of a change
        table = await run_cli(redis_url, prefix, "list")
        document = await run_cli(redis_url, prefix, "list", "--json")
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await held.release()
    assert table.code == 0, table.err
    header, row = table.out.splitlines()
    assert header.split()[5] == "WAITING"
    assert re.search(rf"{re.escape(ME)} x1 .* 5 ", row), row  # named, and 5 waiting
    assert locks.id not in table.out  # never a bare manager id
    (hot,) = json.loads(document.out)
    assert hot["waiting_tasks"] == 5 and hot["waiting_in"] == [{"who": ME, "waiting": 5}]


async def test_a_reader_that_goes_away_ends_watch_quietly(redis_url: str, prefix: str) -> None:
    """``aiolock watch | head -1``: the pipe closes after the first line; the command ends
    with status 0 and no traceback (it printed one for BrokenPipeError before)."""
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, name="local-app") as locks:
        stop = asyncio.Event()
        work = asyncio.create_task(_contend(locks, stop))
        process = await asyncio.create_subprocess_shell(
            f"{sys.executable} -m aiolock --url {redis_url} --prefix {prefix} watch "
            "--duration 20 | head -1",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(process.communicate(), CHILD_TIMEOUT)
        finally:
            stop.set()
            await work
    assert len(out.decode().splitlines()) == 1
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err


async def test_show_gives_the_waiters_per_process(redis_url: str, prefix: str) -> None:
    """Issue 38 item 4: ``show NAME`` names the processes whose tasks wait, and how many."""
    async with (
        aiolock.LockManager.from_url(redis_url, prefix=prefix, name="local-app") as locks,
        aiolock.LockManager.from_url(redis_url, prefix=prefix, name="other-app") as others,
    ):
        held = locks.lock("hot")
        await held.acquire()
        waiters = [asyncio.create_task(locks.lock("hot").acquire()) for _ in range(3)]
        waiters += [asyncio.create_task(others.lock("hot").acquire()) for _ in range(2)]
        await asyncio.sleep(1.5)  # each summary is rewritten within a second of a change
        text = await run_cli(redis_url, prefix, "show", "hot")
        document = await run_cli(redis_url, prefix, "show", "hot", "--json")
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await held.release()
    other = f"other-app@{socket.gethostname()} pid {os.getpid()}"
    assert "  waiting:    5 tasks in processes" in text.out, text.out
    assert f"    {ME}: 3" in text.out and f"    {other}: 2" in text.out
    (hot,) = json.loads(document.out)["objects"]
    assert hot["waiting_tasks"] == 5
    assert sorted((w["who"], w["waiting"]) for w in hot["waiting_in"]) == [(ME, 3), (other, 2)]
