"""Leader election: two worker processes, and only the leader runs the periodic job.

Run: python examples/leader_scheduler.py   (uses $REDIS_URL, or starts a throwaway redis-server)

It starts two workers (this file with ``--worker``). Each campaigns for "report-scheduler";
the leader builds a report every 0.2 s and stores it with its term's fencing token, so a
deposed leader's late write is refused. The demo then kills the leader with SIGKILL (no
release: its lease of 1 s runs out), prints how long the other took to take over, and
stops the survivor with SIGTERM, which releases the leadership at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import aiolock
from aiolock.testing import redis_url_from_env

NAME = "report-scheduler"
PREFIX = "leader-example"
LEASE = 1.0  # a crashed leader is replaced within about this long

#: KEYS: the report's key, the key of the largest token that wrote it. ARGV: token, report.
#: A write with a token smaller than the last writer's is refused: the resource's own fence.
FENCED_SET = """
local last = tonumber(redis.call('get', KEYS[2]) or '0')
if tonumber(ARGV[1]) < last then return 0 end
redis.call('set', KEYS[2], ARGV[1])
redis.call('set', KEYS[1], ARGV[2])
return 1
"""


async def worker(url: str, me: str) -> None:
    """Campaign for the scheduler; while leading, build and store a report every 0.2 s."""
    async with aiolock.LockManager.from_url(url, prefix=PREFIX, lease=LEASE) as locks:
        store = locks.redis.register_script(FENCED_SET)

        async def schedule(term: aiolock.LeaderTerm) -> None:
            print(f"{me} leads (term {term.fencing_token})", flush=True)
            while True:  # cancelled if the leadership is lost; run() campaigns again
                report = f"report by {me} at {time.time():.3f}"
                keys = [f"{PREFIX}:report", f"{PREFIX}:report:token"]
                # Shielded: redis-py can lose a cancellation that arrives while a command
                # is in flight; a lost leadership's is sent again, but a stop signal's
                # is sent once, and it must end this loop too.
                if not await asyncio.shield(store(keys=keys, args=[term.fencing_token, report])):
                    print(f"{me}: a newer leader wrote already; this write was refused", flush=True)
                print(f"{me} ran the job at {time.time():.3f}", flush=True)
                await asyncio.sleep(0.2)

        print(f"{me} campaigns", flush=True)
        await locks.leader(NAME).run(schedule)


async def read_lines(process: asyncio.subprocess.Process, lines: asyncio.Queue[str]) -> None:
    assert process.stdout is not None
    async for raw in process.stdout:
        await lines.put(raw.decode().strip())


async def demo(url: str) -> None:
    lines: asyncio.Queue[str] = asyncio.Queue()
    workers: dict[str, asyncio.subprocess.Process] = {}
    readers = []
    for me in ("worker-A", "worker-B"):
        workers[me] = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", me, env={**os.environ, "REDIS_URL": url},
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        readers.append(asyncio.create_task(read_lines(workers[me], lines)))
    try:
        leader = await next_line(lines, " leads ")
        print(leader)
        leader_name = leader.split()[0]
        follower = "worker-B" if leader_name == "worker-A" else "worker-A"
        for _ in range(3):  # the leader works; the follower waits its turn
            await next_line(lines, f"{leader_name} ran the job")
        workers[leader_name].send_signal(signal.SIGKILL)
        killed_at = time.time()
        print(f"killed {leader_name} (SIGKILL: it releases nothing)")
        print(await next_line(lines, f"{follower} leads "))
        first_run = await next_line(lines, f"{follower} ran the job")
        took = float(first_run.split()[-1]) - killed_at
        print(f"{follower} took over {took:.2f} s after the leader was killed (lease {LEASE} s)")
        workers[follower].send_signal(signal.SIGTERM)  # a clean stop: leadership released
        code = await asyncio.wait_for(workers[follower].wait(), 30)
        print(f"{follower} stopped with exit code {code}")
    finally:
        for process in workers.values():
            if process.returncode is None:
                process.kill()
                await process.wait()
        for reader in readers:
            reader.cancel()


async def next_line(lines: asyncio.Queue[str], containing: str) -> str:
    """The next worker line containing *containing* (bounded: a demo never hangs)."""

    async def find() -> str:
        while True:
            line = await lines.get()
            if containing in line:
                return line

    return await asyncio.wait_for(find(), 30)


async def worker_process(me: str) -> None:
    """A worker until SIGTERM, which cancels the campaign: the leadership is released."""
    task = asyncio.create_task(worker(os.environ["REDIS_URL"], me))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        print(f"{me} stopped; it released the leadership", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        asyncio.run(worker_process(sys.argv[2]))
        return
    with redis_url_from_env() as url:
        asyncio.run(demo(url))


if __name__ == "__main__":
    main()
