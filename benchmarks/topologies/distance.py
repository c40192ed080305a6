"""Waits under contention, by distance from Redis: the plain lock beside the fair lock.

Processes at 0, 5, 15 and 30 ms of extra round trip (a latency proxy
each; loopback otherwise), three tasks each, all on one name, holds of 5-30 ms, for the
same seconds per kind. Every process logs what each of its tasks asked for and got; the
parent reads only those logs and reports, per kind and per process, the grants and the
wait's p50, p99 and maximum, and the plain lock's waits as multiples of the fair lock's
(the FIFO queue every waiter of every process joins in Redis).

    python -m benchmarks.topologies.distance                 # 20 s per kind, writes a table
    python -m benchmarks.topologies.distance --seconds 5     # a quick look

The proxy is the test suite's (tests/_support/proxy.py), run from a checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: extra round-trip milliseconds of each process (each way: half)
LATENCIES_MS = (0, 5, 15, 30)
TASKS = 3
HOLD_MS = (5, 30)
KINDS = ("lock", "fair")


async def _worker(
    url: str, kind: str, prefix: str, seconds: float, seed: int
) -> list[dict[str, float]]:
    from redis.asyncio import Redis

    import aiolock

    rng = random.Random(seed)
    client = Redis.from_url(url)
    records: list[dict[str, float]] = []
    start_at = float(os.environ["STARVATION_START"])
    stop_at = start_at + seconds
    async with aiolock.LockManager(client, prefix=prefix, lease=5.0) as locks:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))

        async def task() -> None:
            holds = random.Random(rng.random())
            while time.monotonic() < stop_at:
                make = locks.lock if kind == "lock" else locks.fair_lock
                asked = time.monotonic()
                try:
                    async with make("hot", timeout=60):
                        got = time.monotonic()
                        await asyncio.sleep(holds.uniform(*HOLD_MS) / 1000)
                except aiolock.LockTimeoutError:
                    records.append({"asked": asked, "got": -1.0})
                    continue
                records.append({"asked": asked, "got": got})

        await asyncio.gather(*(task() for _ in range(TASKS)))
    await client.aclose()
    return records


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def _run_kind(kind: str, seconds: float, seed: int, tmp: Path) -> list[dict[str, Any]]:
    from aiolock.testing import RedisServer
    from tests._support.proxy import FaultProxy

    rows = []
    with RedisServer() as server:
        proxies = []
        for latency in LATENCIES_MS:
            proxy = await FaultProxy(server.host, server.port).start()
            proxy.set_latency(latency / 2000)
            proxies.append(proxy)
        env = dict(os.environ, STARVATION_START=str(time.monotonic() + 3.0))
        prefix = f"starve-{kind}-{seed}"
        procs, outs = [], []
        for i, proxy in enumerate(proxies):
            out = tmp / f"{kind}-{i}.json"
            outs.append(out)
            command = [sys.executable, "-m", "benchmarks.topologies.distance", "--worker",
                       proxy.url, kind, prefix, str(seconds), str(seed * 100 + i),
                       str(out)]  # fmt: skip
            procs.append(await asyncio.create_subprocess_exec(*command, env=env))
        for proc in procs:
            await asyncio.wait_for(proc.wait(), seconds + 120)
        for proxy in proxies:
            await proxy.stop()
    for latency, out, proc in zip(LATENCIES_MS, outs, procs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"the {kind} worker at {latency} ms failed ({proc.returncode})")
        records = json.loads(out.read_text())
        waits = [r["got"] - r["asked"] for r in records if r["got"] >= 0]
        rows.append(
            {
                "kind": kind,
                "latency_ms": latency,
                "grants": len(waits),
                "timeouts": sum(1 for r in records if r["got"] < 0),
                "p50_ms": 1000 * _percentile(waits, 0.5),
                "p99_ms": 1000 * _percentile(waits, 0.99),
                "max_ms": 1000 * max(waits, default=0.0),
                "mean_ms": 1000 * (statistics.fmean(waits) if waits else 0.0),
            }
        )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| kind | extra RTT | grants | timeouts | wait p50 | p99 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['latency_ms']} ms | {r['grants']} | {r['timeouts']} | "
            f"{r['p50_ms']:.0f} ms | {r['p99_ms']:.0f} ms | {r['max_ms']:.0f} ms |"
        )
    by = {(r["kind"], r["latency_ms"]): r for r in rows}
    lines += ["", "| extra RTT | lock p99 / fair p99 | lock max / fair max |", "|---|---|---|"]
    for latency in LATENCIES_MS:
        lock, fair = by[("lock", latency)], by[("fair", latency)]
        lines.append(
            f"| {latency} ms | {lock['p99_ms'] / max(fair['p99_ms'], 1e-9):.2f} | "
            f"{lock['max_ms'] / max(fair['max_ms'], 1e-9):.2f} |"
        )
    worst = {k: max(by[(k, lat)]["max_ms"] for lat in LATENCIES_MS) for k in KINDS}
    lines.append("")
    lines.append(
        f"Longest wait of any process: lock {worst['lock']:.0f} ms, fair "
        f"{worst['fair']:.0f} ms ({worst['lock'] / max(worst['fair'], 1e-9):.2f}x)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.topologies.distance")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write rows as JSON here")
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        url, kind, prefix, seconds, seed, out = args.worker
        records = asyncio.run(_worker(url, kind, prefix, float(seconds), int(seed)))
        Path(out).write_text(json.dumps(records))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for kind in KINDS:
            rows += asyncio.run(_run_kind(kind, args.seconds, args.seed, Path(tmp)))
    print(_table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
