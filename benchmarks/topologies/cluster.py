"""W1/W2/W3 on a Redis Cluster: aiolock against redis-py's ``Lock``, on one cluster, in one run.

``python -m benchmarks.topologies.cluster [--quick] [--out DIR]`` starts a throwaway cluster of
3 primaries + 3 replicas on loopback ports (:class:`aiolock.testing_cluster.LocalCluster`),
runs each workload for each library ``repeats`` times in this process, alternating the
libraries, and writes ``cluster.json`` and ``cluster.md`` to ``--out`` (default
``benchmarks/results``). Both libraries use one ``RedisCluster`` client made with redis-py's
defaults (``RedisCluster.from_url(url)``), as a user would.

* **W1 uncontended**: one task, acquire + release of one name; cycles/s, p50/p99 cycle.
* **W2 concurrency**: 64 tasks, each on its own name (so spread over the three primaries);
  total cycles/s.
* **W3 contention**: 16 tasks on one name, zero hold time; acquisitions/s and overlaps
  (a counter incremented inside the lock: must stay at most 1).

Every loop is bounded by a cycle count and a deadline; every acquire has a 20 s timeout.
The cluster's processes are stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
from redis.asyncio.cluster import RedisCluster

import aiolock
from aiolock.testing_cluster import LocalCluster
from benchmarks.common.sections import write_section

ACQUIRE_TIMEOUT = 20.0
LEASE = 30.0

Cycle = Callable[[str], Awaitable[None]]


class Library:
    name = ""

    async def setup(self, url: str) -> None: ...

    async def cycle(self, name: str, inside: Callable[[], Awaitable[None]] | None = None) -> None:
        """Acquire *name*, run *inside*, release."""

    async def teardown(self) -> None: ...


class Aiolock(Library):
    name = "aiolock"

    async def setup(self, url: str) -> None:
        self.client = RedisCluster.from_url(url)
        self.locks = aiolock.LockManager(
            self.client, prefix=f"b{uuid.uuid4().hex[:6]}", lease=LEASE
        )
        await self.locks.open()

    async def cycle(self, name: str, inside: Callable[[], Awaitable[None]] | None = None) -> None:
        lock = self.locks.lock(name)
        if not await lock.try_acquire(timeout=ACQUIRE_TIMEOUT):
            raise TimeoutError(name)
        try:
            if inside is not None:
                await inside()
        finally:
            await lock.release()

    async def teardown(self) -> None:
        await self.locks.aclose()
        await self.client.aclose()


class RedisPy(Library):
    name = "redis-py"

    async def setup(self, url: str) -> None:
        self.client = RedisCluster.from_url(url)
        self.prefix = f"r{uuid.uuid4().hex[:6]}"

    async def cycle(self, name: str, inside: Callable[[], Awaitable[None]] | None = None) -> None:
        lock = self.client.lock(
            f"{self.prefix}:{name}", timeout=LEASE, blocking_timeout=ACQUIRE_TIMEOUT
        )
        if not await lock.acquire():
            raise TimeoutError(name)
        try:
            if inside is not None:
                await inside()
        finally:
            await lock.release()

    async def teardown(self) -> None:
        await self.client.aclose()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def w1(lib: Library, cycles: int, seconds: float) -> dict[str, float]:
    times: list[float] = []
    deadline = time.monotonic() + seconds
    for _ in range(50):  # warm-up: scripts loaded, connections open
        await lib.cycle("w1")
    while len(times) < cycles and time.monotonic() < deadline:
        start = time.perf_counter()
        await lib.cycle("w1")
        times.append(time.perf_counter() - start)
    return {
        "cycles_per_s": len(times) / sum(times),
        "p50_ms": pct(times, 0.5) * 1000,
        "p99_ms": pct(times, 0.99) * 1000,
        "cycles": len(times),
    }


async def w2(lib: Library, tasks: int, seconds: float) -> dict[str, float]:
    counts = [0] * tasks
    for i in range(tasks):  # warm-up
        await lib.cycle(f"w2-{i}")
    deadline = time.monotonic() + seconds

    async def worker(i: int) -> None:
        while time.monotonic() < deadline:
            await lib.cycle(f"w2-{i}")
            counts[i] += 1

    start = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    elapsed = time.monotonic() - start
    return {"cycles_per_s": sum(counts) / elapsed, "min_per_task": min(counts)}


async def w3(lib: Library, tasks: int, seconds: float) -> dict[str, float]:
    state = {"inside": 0, "overlaps": 0, "count": 0}
    deadline = time.monotonic() + seconds

    async def inside() -> None:
        state["inside"] += 1
        if state["inside"] > 1:
            state["overlaps"] += 1
        await asyncio.sleep(0)
        state["inside"] -= 1

    async def worker() -> None:
        while time.monotonic() < deadline:
            await lib.cycle("w3", inside)
            state["count"] += 1

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    elapsed = time.monotonic() - start
    return {"acquisitions_per_s": state["count"] / elapsed, "overlaps": state["overlaps"]}


async def measure(url: str, quick: bool, repeats: int) -> dict[str, Any]:
    profile = {
        "w1": (1000, 2.0) if quick else (10000, 6.0),
        "w2": (64, 1.5 if quick else 4.0),
        "w3": (16, 1.5 if quick else 4.0),
    }
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for _ in range(repeats):
        for make in (Aiolock, RedisPy):
            lib = make()
            await lib.setup(url)
            try:
                results = {
                    "w1": await w1(lib, *profile["w1"]),
                    "w2": await w2(lib, *profile["w2"]),
                    "w3": await w3(lib, *profile["w3"]),
                }
            finally:
                await lib.teardown()
            for workload, result in results.items():
                runs.setdefault(lib.name, {}).setdefault(workload, []).append(result)
    return runs


def median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report(runs: dict[str, Any], meta: dict[str, Any]) -> str:
    a, r = runs["aiolock"], runs["redis-py"]
    rows = [
        ("W1 cycles/s", "w1", "cycles_per_s"),
        ("W1 p50 ms", "w1", "p50_ms"),
        ("W1 p99 ms", "w1", "p99_ms"),
        ("W2 cycles/s (64 tasks)", "w2", "cycles_per_s"),
        ("W3 acquisitions/s (16 tasks, 1 name)", "w3", "acquisitions_per_s"),
        ("W3 overlaps", "w3", "overlaps"),
    ]
    lines = [
        "# Redis Cluster: aiolock vs redis-py's Lock (W1/W2/W3, one run)",
        "",
        f"Cluster: {meta['cluster']} ({meta['cpus']} CPUs, load average "
        f"{meta['load_average_after']} at the end); redis-py {meta['redis_py']}, "
        f"Python {meta['python']}; "
        f"{meta['repeats']} repeats per library, alternating; medians. Made by "
        "`python -m benchmarks.topologies.cluster`"
        + (" --quick (not for comparison)." if meta["quick"] else "."),
        "",
        "| metric | aiolock | redis-py | aiolock / redis-py |",
        "|---|---:|---:|---:|",
    ]
    for label, workload, key in rows:
        x, y = median_of(a[workload], key), median_of(r[workload], key)
        ratio = f"{x / y:.2f}x" if y else "-"
        lines.append(f"| {label} | {x:,.2f} | {y:,.2f} | {ratio} |")
    lines += [
        "",
        "redis-py's `Lock` polls (`sleep=0.1` s between attempts) while the lock is held, so "
        "its W3 rate is bound by its polling, and it is not reentrant, renews nothing and "
        "has no fencing; aiolock's cycles run its scripts (fencing, hold counts, release "
        "messages with `SPUBLISH`).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    with LocalCluster(primaries=3, replicas=1) as cluster:
        runs = asyncio.run(measure(cluster.url, args.quick, repeats))
    meta = {
        "cluster": "3 primaries + 3 replicas, redis-server on loopback, one machine",
        # the client and the six servers share the machine's cores: say how busy it was
        "load_average_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "redis_py": redis.__version__,
        "python": sys.version.split()[0],
        "repeats": repeats,
        "quick": args.quick,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cluster.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2))
    text = report(runs, meta)
    (out / "cluster.md").write_text(text)
    # In RESULTS.md the report is a section: its title one level down.
    write_section(out / "RESULTS.md", "cluster", "#" + text if text.startswith("# ") else text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
