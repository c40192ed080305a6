"""Singleton taskiq tasks: duplicates for one resource never run at once.

An ``InMemoryBroker`` (tasks run in this process, concurrently) gets three
``build_report`` tasks for one customer and three ``sync_account`` tasks for one
account, all at once:

* ``build_report`` skips a duplicate, and its result says which task holds the lock;
* ``sync_account`` defers a duplicate (it waits and requeues itself), so all three run,
  one at a time.

The locks are in Redis, so the same holds across worker processes with a real broker
(e.g. taskiq-redis). Run: python examples/taskiq_singleton.py   (uses $REDIS_URL, or
starts a throwaway redis-server). Needs: pip install 'aiolock[taskiq]'
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from taskiq import Context, InMemoryBroker, TaskiqDepends

import aiolock
from aiolock.contrib.jobs import JobBusy
from aiolock.contrib.taskiq import singleton
from aiolock.testing import redis_url_from_env

broker = InMemoryBroker()

# What ran, when: (task, start, end); the tasks run in this process.
RUNS: list[tuple[str, float, float]] = []


def skipped(busy: JobBusy, arguments: Mapping[str, Any]) -> str:
    """The result of a duplicate report task: who holds the lock, instead of a report."""
    return f"skipped: report:{arguments['customer_id']} is held by {busy.holder}"


@broker.task
@singleton("locks", "report:{customer_id}", on_busy=skipped)  # the manager: state.locks
async def build_report(customer_id: int, context: Context = TaskiqDepends()) -> str:  # noqa: B008
    start = time.monotonic()
    await asyncio.sleep(0.5)  # the expensive part
    RUNS.append(("report", start, time.monotonic()))
    return f"report for customer {customer_id}"


@broker.task
@singleton("locks", "sync:{account}", defer=0.2, max_requeues=50)  # requeue after 0.2 s
async def sync_account(account: str, context: Context = TaskiqDepends()) -> str:  # noqa: B008
    start = time.monotonic()
    await asyncio.sleep(0.3)
    RUNS.append(("sync", start, time.monotonic()))
    tries = 1 + int(context.message.labels.get("X-Taskiq-requeue", 0))
    return f"synced {account} on try {tries}"


def most_at_once(kind: str) -> int:
    """How many runs of *kind* overlapped at most."""
    spans = [(start, end) for job, start, end in RUNS if job == kind]
    return max((sum(s < end and start < e for s, e in spans) for start, end in spans), default=0)


async def main(url: str) -> None:
    async with aiolock.LockManager.from_url(url, prefix="taskiq-example") as locks:
        broker.state.locks = locks
        await broker.startup()
        try:
            tasks = [await build_report.kiq(42) for _ in range(3)]
            tasks += [await sync_account.kiq("acme") for _ in range(3)]
            results = [await task.wait_result(timeout=30) for task in tasks]
        finally:
            await broker.shutdown()

    for n, result in enumerate(results):
        if result.is_err:
            raise SystemExit(f"task {n} failed: {result.error!r}")
        print(f"task {n}: {result.return_value}")
    reports = sum(1 for job, *_ in RUNS if job == "report")
    skips = sum(1 for r in results if str(r.return_value).startswith("skipped"))
    syncs = sum(1 for job, *_ in RUNS if job == "sync")
    print(f"report tasks: {reports} ran, {skips} skipped; at most {most_at_once('report')} at once")
    print(f"sync tasks: {syncs} ran; at most {most_at_once('sync')} at once")


if __name__ == "__main__":
    with redis_url_from_env() as url:
        asyncio.run(main(url))
