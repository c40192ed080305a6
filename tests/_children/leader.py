"""A child process of the leader-election tests: ``python -m tests._children.leader JSON``.

Opens a manager (lease ``lease``), campaigns for ``name`` and, while it leads, runs a
periodic job every ``period`` seconds. For a checker independent of the election, every
run of the job is recorded in Redis: ``<prefix>:begin`` gets ``pid token time`` before
the job's work and ``<prefix>:end`` the same after it; each term adds ``pid token time``
to ``<prefix>:terms``. The times are this host's wall clock, shared by the processes.
SIGTERM cancels the campaign (the leadership is released); it stops after ``max_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from redis.asyncio import Redis

import aiolock


async def run(spec: dict[str, Any]) -> None:
    prefix, pid = spec["prefix"], os.getpid()
    records = Redis.from_url(spec["url"])
    manager = aiolock.LockManager.from_url(spec["url"], prefix=prefix, lease=spec["lease"])

    async def record(key: str, entry: str) -> None:
        # Shielded: redis-py 8.1 can lose a cancellation that arrives while a command is
        # in flight (the task goes on as if never cancelled); the shield's own future
        # always delivers it to this task, and the write completes in the background.
        await asyncio.shield(records.rpush(f"{prefix}:{key}", f"{pid} {entry}"))

    async def job(term: aiolock.LeaderTerm) -> None:
        await record("terms", f"{term.fencing_token} {time.time()}")
        while True:
            await record("begin", f"{term.fencing_token} {time.time()}")
            await asyncio.sleep(spec["work"])  # the job's work
            await record("end", f"{term.fencing_token} {time.time()}")
            await asyncio.sleep(spec["period"])

    try:
        async with manager as locks:
            election = locks.leader(spec["name"])
            await records.rpush(f"{prefix}:ready", str(pid))
            # The bound of a test's child; the leadership is released when it runs out.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(election.run(job), spec["max_seconds"])
    finally:
        await records.aclose()


async def main(spec: dict[str, Any]) -> None:
    task = asyncio.create_task(run(spec))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise  # this coroutine itself was cancelled


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
