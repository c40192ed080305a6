"""Singleton arq jobs: duplicates for one resource never run at once.

A real arq worker (burst mode, in this process) gets three ``build_report`` jobs for one
customer and three ``sync_account`` jobs for one account, all at once:

* ``build_report`` skips a duplicate, and its result says which job holds the lock;
* ``sync_account`` defers a duplicate (``arq.worker.Retry``), so all three run, one at
  a time.

Run: python examples/arq_singleton.py   (uses $REDIS_URL, or starts a throwaway redis-server)
Needs: pip install 'aiolock[arq]'
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker

import aiolock
from aiolock.contrib.arq import singleton
from aiolock.contrib.jobs import JobBusy
from aiolock.testing import redis_url_from_env

# What ran, when: (job, job id, start, end); the worker runs in this process.
RUNS: list[tuple[str, str, float, float]] = []


def skipped(busy: JobBusy, arguments: Mapping[str, Any]) -> str:
    """The result of a duplicate report job: who holds the lock, instead of a report."""
    return f"skipped: report:{arguments['customer_id']} is held by {busy.holder}"


@singleton("report:{customer_id}", on_busy=skipped)
async def build_report(ctx: dict[str, Any], customer_id: int) -> str:
    start = time.monotonic()
    await asyncio.sleep(0.5)  # the expensive part
    RUNS.append(("report", ctx["job_id"], start, time.monotonic()))
    return f"report for customer {customer_id}"


@singleton("sync:{account}", defer=0.2)  # a duplicate retries in 0.2 s
async def sync_account(ctx: dict[str, Any], account: str) -> str:
    start = time.monotonic()
    await asyncio.sleep(0.3)
    RUNS.append(("sync", ctx["job_id"], start, time.monotonic()))
    return f"synced {account} on try {ctx['job_try']}"


async def startup(ctx: dict[str, Any]) -> None:
    ctx["locks"] = await aiolock.LockManager.from_url(ctx["url"], prefix="arq-example").open()


async def shutdown(ctx: dict[str, Any]) -> None:
    await ctx["locks"].aclose()


def most_at_once(kind: str) -> int:
    """How many runs of *kind* overlapped at most."""
    spans = [(start, end) for job, _, start, end in RUNS if job == kind]
    return max((sum(s < end and start < e for s, e in spans) for start, end in spans), default=0)


async def main(url: str) -> None:
    settings = RedisSettings.from_dsn(url)
    run = uuid.uuid4().hex[:6]
    queue = f"arq:example:{run}"  # a queue (and job ids) of this run's own
    pool = await create_pool(settings, default_queue_name=queue)
    try:
        jobs = [
            await pool.enqueue_job("build_report", 42, _job_id=f"report-{run}-{n}")
            for n in range(3)
        ]
        jobs += [
            await pool.enqueue_job("sync_account", "acme", _job_id=f"sync-{run}-{n}")
            for n in range(3)
        ]
        assert all(job is not None for job in jobs)
        worker = Worker(
            functions=[build_report, sync_account],  # type: ignore[list-item, unused-ignore]
            queue_name=queue,
            redis_settings=settings,
            burst=True,  # stop when the queue is empty
            handle_signals=False,
            poll_delay=0.05,
            max_jobs=10,
            max_tries=50,  # deferrals count as tries
            keep_result=60,
            ctx={"url": url},
            on_startup=startup,
            on_shutdown=shutdown,
        )
        try:
            await asyncio.wait_for(worker.main(), timeout=30)
        finally:
            await worker.close()
        results = {job.job_id: await job.result(timeout=5) for job in jobs if job is not None}
    finally:
        await pool.aclose()

    for job_id, result in sorted(results.items()):
        print(f"{job_id}: {result}")
    reports = sum(1 for job, *_ in RUNS if job == "report")
    skips = sum(1 for r in results.values() if str(r).startswith("skipped"))
    syncs = sum(1 for job, *_ in RUNS if job == "sync")
    print(f"report jobs: {reports} ran, {skips} skipped; at most {most_at_once('report')} at once")
    print(
        f"sync jobs: {syncs} ran, {worker.jobs_retried} deferrals; "
        f"at most {most_at_once('sync')} at once"
    )


if __name__ == "__main__":
    with redis_url_from_env() as url:
        asyncio.run(main(url))
