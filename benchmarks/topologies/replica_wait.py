"""What ``replicas=1`` (WAIT after each acquisition) costs per acquire/release cycle.

One private primary and one replica on loopback (started here, stopped by pid); one task
acquires and releases one lock ``--cycles`` times without WAIT, then with ``replicas=1``,
alternating for ``--rounds`` rounds in the same run (absolute figures drift on a shared
machine; the difference within a round is the figure to read).

    python -m benchmarks.topologies.replica_wait --cycles 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import aiolock
from aiolock.testing import RedisServer


async def _cycle_us(url: str, cycles: int, **options: Any) -> float:
    async with aiolock.LockManager.from_url(url, prefix="bench-wait", **options) as locks:
        for _ in range(50):  # warm-up: scripts loaded, connections open
            async with locks.lock("x"):
                pass
        started = time.perf_counter()
        for _ in range(cycles):
            async with locks.lock("x"):
                pass
        return (time.perf_counter() - started) / cycles * 1e6


async def _main(cycles: int, rounds: int) -> None:
    with RedisServer(["--repl-diskless-sync-delay", "0"]) as primary:
        replica_args = ["--replicaof", primary.host, str(primary.port)]
        with RedisServer(replica_args):
            await asyncio.sleep(1.0)  # the replica's first sync
            for n in range(rounds):
                plain = await _cycle_us(primary.url, cycles)
                waited = await _cycle_us(primary.url, cycles, replicas=1, replica_timeout=1.0)
                print(
                    f"round {n}: without WAIT {plain:.0f} us/cycle, replicas=1 "
                    f"{waited:.0f} us/cycle (+{waited - plain:.0f} us, x{waited / plain:.2f})"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not (1 <= args.cycles <= 1_000_000 and 1 <= args.rounds <= 100):
        parser.error("--cycles must be 1..1000000 and --rounds 1..100")
    asyncio.run(_main(args.cycles, args.rounds))


if __name__ == "__main__":
    main()
