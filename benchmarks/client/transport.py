"""W2-style throughput of aiolock's Redis transport, before and after, in one run.

64 tasks, each on its own lock name, loop acquire + release for a fixed time. Every client
is made with ``Redis()``'s defaults (``socket_timeout=5``), as users make them. Variants:

* ``before``: aiolock with the ``_client.Client`` of ``--baseline`` (a git revision;
  default c7c504c, the base of engine v2), loaded from git and swapped into the manager;
* ``after``: aiolock as in this tree;
* ``redis-py``: ``redis.asyncio.lock.Lock`` (``Redis.lock()``), same tasks and names;
* ``before-no-timeout`` (only with ``--variants``): ``before`` on a client made with
  ``socket_timeout=None``, the ceiling of removing redis-py's per-read timeout alone.

Variants run in turns (``--rounds``), so a noisy neighbour on the shared cores hits them
alike; each turn lasts ``--seconds``. The default (2 rounds x 2.5 s) is ~5 s per variant.

    python -m benchmarks.client.transport [--seconds 2.5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from types import ModuleType
from typing import Any

from redis.asyncio import Redis

import aiolock
import aiolock._manager
from aiolock._redis.client import Client
from aiolock.testing import RedisServer

TASKS = 64
ACQUIRE_TIMEOUT = 20.0
LEASE = 30.0
ROOT = Path(__file__).resolve().parents[2]


def baseline_client(rev: str) -> type[Any]:
    """``Client`` from ``aiolock/_redis/client.py`` at git revision *rev*, with today's siblings.

    Revisions before the package layout of issue 19 kept it in ``aiolock/_client.py`` with
    relative imports of modules that have moved since: compare those in a checkout of *rev*.
    """
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:aiolock/_redis/client.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader("aiolock._client_baseline", loader=None)
    assert spec is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    module.__package__ = "aiolock._redis"  # so any relative import finds this tree's
    exec(compile(source, f"{rev}:aiolock/_redis/client.py", "exec"), module.__dict__)
    client: type[Any] = module.Client
    return client


Cycle = Callable[[int], Awaitable[None]]


Rate = tuple[float, float]


async def run_workers(cycle: Cycle, seconds: float) -> Rate:
    """Warm every name once, then loop *cycle* on 64 tasks for *seconds*.

    Returns cycles/s and this process's CPU µs per cycle: on shared cores the wall-clock
    rate moves with the neighbours' load, the CPU cost per cycle much less.
    """
    await asyncio.gather(*(cycle(i) for i in range(TASKS)))
    counts = [0] * TASKS
    start, cpu = time.monotonic(), time.process_time()
    deadline = start + seconds

    async def worker(i: int) -> None:
        while time.monotonic() < deadline:
            await cycle(i)
            counts[i] += 1

    await asyncio.gather(*(worker(i) for i in range(TASKS)))
    n = sum(counts)
    return n / (time.monotonic() - start), (time.process_time() - cpu) / n * 1e6


async def aiolock_variant(url: str, seconds: float, client_class: type[Any], **redis: Any) -> Rate:
    # LockManager builds its Client from this module global
    namespace = vars(aiolock._manager)
    original = namespace["Client"]
    namespace["Client"] = client_class
    client = Redis.from_url(url, **redis)
    try:
        async with aiolock.LockManager(client, prefix="tb", lease=LEASE) as locks:

            async def cycle(i: int) -> None:
                lock = locks.lock(f"w2:{i}")
                if not await lock.try_acquire(timeout=ACQUIRE_TIMEOUT):
                    raise RuntimeError(f"w2:{i} not acquired")
                await lock.release()

            return await run_workers(cycle, seconds)
    finally:
        namespace["Client"] = original
        await client.aclose()


async def redis_py_variant(url: str, seconds: float) -> Rate:
    client = Redis.from_url(url)
    try:

        async def cycle(i: int) -> None:
            lock = client.lock(f"rp:w2:{i}", timeout=LEASE, blocking_timeout=ACQUIRE_TIMEOUT)
            if not await lock.acquire():
                raise RuntimeError(f"rp:w2:{i} not acquired")
            await lock.release()

        return await run_workers(cycle, seconds)
    finally:
        await client.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=2.5, help="length of one turn")
    parser.add_argument("--rounds", type=int, default=2, help="turns per variant")
    parser.add_argument("--baseline", default="c7c504c", help="git revision for 'before'")
    parser.add_argument("--variants", default="before,after,redis-py")
    args = parser.parse_args()
    before = baseline_client(args.baseline)
    after = Client
    variants: dict[str, Callable[[str, float], Coroutine[Any, Any, Rate]]] = {
        "before": lambda url, s: aiolock_variant(url, s, before),
        "after": lambda url, s: aiolock_variant(url, s, after),
        "redis-py": redis_py_variant,
        "before-no-timeout": lambda url, s: aiolock_variant(url, s, before, socket_timeout=None),
    }
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in variants]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {sorted(variants)}")
    rates: dict[str, list[Rate]] = {v: [] for v in chosen}
    with RedisServer() as server:
        for _ in range(args.rounds):
            for name in chosen:
                rates[name].append(asyncio.run(variants[name](server.url, args.seconds)))
    print(f"W2: {TASKS} tasks, distinct names, Redis() defaults; median of {args.rounds} turns")
    print(f"  {'variant':18} {'cycles/s':>9} {'CPU us/cycle':>13}   cycles/s per turn")
    rate = {name: statistics.median(x for x, _ in r) for name, r in rates.items()}
    cost = {name: statistics.median(c for _, c in r) for name, r in rates.items()}
    for name, r in rates.items():
        turns = ", ".join(f"{x:,.0f}" for x, _ in r)
        print(f"  {name:18} {rate[name]:>9,.0f} {cost[name]:>13.1f}   ({turns})")
    for a, b in (("after", "before"), ("after", "redis-py"), ("before", "redis-py")):
        if a in rate and b in rate:
            print(
                f"  {a} / {b}: {rate[a] / rate[b]:.2f}x cycles/s, "
                f"{cost[b] / cost[a]:.2f}x less CPU per cycle"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
