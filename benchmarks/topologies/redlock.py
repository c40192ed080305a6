"""Redlock benchmark: aiolock's Redlock against pottery's AIORedlock, over 3 and 5 masters.

``python -m benchmarks.topologies.redlock [--cycles N] [--seconds S] [--repeats R]
[--paused-cycles N] [--out DIR]``

Starts 5 throwaway ``redis-server`` processes (:class:`aiolock.testing.RedisServer`, free
loopback ports, stopped by pid) and measures, in one run, for each master count (3, 5)
and each library, interleaved over ``--repeats`` rounds:

* **solo**: one task, ``--cycles`` acquire+release cycles on one name: cycles/s and the
  p50/p99 latency of one cycle;
* **contended**: two clients (managers / sets of clients) x 4 tasks each on one name for
  ``--seconds``: cycles/s, p99 of the wait for the lock, rounds that failed;
* **one master stopped**: solo cycles while one master is stopped with SIGSTOP (both
  libraries' clients with a 0.25 s socket timeout);
* **commands per acquisition**: the delta of ``INFO commandstats`` (``calls``) summed over
  the masters, divided by the acquisitions of the solo run. Commands run inside a Lua
  script with ``redis.call`` count too (Redis counts them in commandstats), and the
  INFO calls of the harness itself are subtracted.

How each library is driven: aiolock ``LockManager.redlock(clients, lease=30)``,
``async with locks.lock(name)`` (auto-renewed lease; no renewal happens within a cycle);
pottery ``AIORedlock(key=name, masters=set(clients), auto_release_time=30)``, one object
per task, ``acquire()`` (blocking, pottery's own retry with a random 0-0.2 s sleep) and
``release()``. Both use redis-py's asyncio client (hiredis parser), one client per master.

Writes ``<out>/redlock.json`` and a section of ``<out>/RESULTS.md`` between the
``redlock-bench`` markers, leaving the rest of that file as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from redis.asyncio import Redis

import aiolock
from aiolock.testing import RedisServer
from benchmarks.common.sections import write_section

LEASE = 30.0
TASKS_PER_CLIENT = 4
#: the most seconds the one-master-paused run of one library may take
PAUSED_SECONDS = 10.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def commandstats(urls: Sequence[str]) -> Counter[str]:
    """Calls per command name, summed over the masters (one INFO per master)."""
    total: Counter[str] = Counter()
    for url in urls:
        client = redis.Redis.from_url(url)
        try:
            stats: dict[str, Any] = client.info("commandstats")
        finally:
            client.close()
        for name, fields in stats.items():
            total[name.removeprefix("cmdstat_")] += int(fields["calls"])
    return total


def per_acquisition(
    before: Counter[str], after: Counter[str], urls: int, n: int
) -> dict[str, float]:
    delta = after - before
    delta["info"] -= urls  # the harness's own INFO of the "after" snapshot
    return {name: count / n for name, count in sorted(delta.items()) if count > 0}


# -- the two libraries, behind one small interface ------------------------------------


class Library:
    name = ""

    async def open(self, clients: list[Redis], prefix: str) -> None: ...

    async def cycle(self, name: str, hold: Callable[[], Awaitable[None]] | None = None) -> None: ...

    def failed_rounds(self) -> int:
        return 0

    async def close(self) -> None: ...


class Aiolock(Library):
    name = "aiolock Redlock"

    async def open(self, clients: list[Redis], prefix: str) -> None:
        self._manager = await aiolock.LockManager.redlock(
            clients, prefix=prefix, lease=LEASE
        ).open()
        self._locks: dict[str, aiolock.RedlockLock] = {}

    async def cycle(self, name: str, hold: Callable[[], Awaitable[None]] | None = None) -> None:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = self._manager.lock(name, timeout=60)
        async with lock:
            if hold is not None:
                await hold()

    def failed_rounds(self) -> int:
        return self._manager.statistics().failed_rounds

    async def close(self) -> None:
        await self._manager.aclose()


class Pottery(Library):
    name = "pottery AIORedlock"

    async def open(self, clients: list[Redis], prefix: str) -> None:
        import pottery  # the bench extra

        self._mod: Any = pottery
        self._clients = clients
        self._prefix = prefix
        self._failed = 0

    async def cycle(self, name: str, hold: Callable[[], Awaitable[None]] | None = None) -> None:
        lock: Any = self._mod.AIORedlock(
            key=f"{self._prefix}:{name}", masters=set(self._clients), auto_release_time=LEASE
        )
        if not await lock.acquire(blocking=True, timeout=60):
            raise TimeoutError(name)
        try:
            if hold is not None:
                await hold()
        finally:
            await lock.release()

    async def close(self) -> None:
        pass


LIBRARIES: list[type[Library]] = [Aiolock, Pottery]


# -- scenarios ------------------------------------------------------------------------


async def _clients(urls: Sequence[str]) -> list[Redis]:
    return [Redis.from_url(url) for url in urls]


async def solo(lib_type: type[Library], urls: Sequence[str], cycles: int) -> dict[str, Any]:
    clients = await _clients(urls)
    lib = lib_type()
    prefix = f"rb-{uuid.uuid4().hex[:8]}"
    await lib.open(clients, prefix)
    try:
        for _ in range(20):  # warm-up: connections, scripts loaded
            await lib.cycle("solo")
        before = commandstats(urls)
        latencies: list[float] = []
        started = time.perf_counter()
        for _ in range(cycles):
            t0 = time.perf_counter()
            await lib.cycle("solo")
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
        after = commandstats(urls)
    finally:
        await lib.close()
        for client in clients:
            await client.aclose()
    commands = per_acquisition(before, after, len(urls), cycles)
    return {
        "cycles_per_s": cycles / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": _p99(latencies) * 1000,
        "commands_per_acquisition": sum(commands.values()),
        "commands": commands,
    }


async def contended(lib_type: type[Library], urls: Sequence[str], seconds: float) -> dict[str, Any]:
    prefix = f"rb-{uuid.uuid4().hex[:8]}"
    sides = []
    for _ in range(2):
        clients = await _clients(urls)
        lib = lib_type()
        await lib.open(clients, prefix)
        sides.append((lib, clients))
    waits: list[float] = []
    inside = 0
    overlaps = 0

    async def hold() -> None:
        nonlocal inside, overlaps
        inside += 1
        overlaps += inside > 1
        await asyncio.sleep(0)
        inside -= 1

    async def task(lib: Library, stop: float) -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            entered = 0.0

            async def body() -> None:
                nonlocal entered
                entered = time.perf_counter()
                await hold()

            await lib.cycle("hot", body)
            waits.append(entered - t0)

    try:
        stop = time.perf_counter() + seconds
        started = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(task(lib, stop) for lib, _ in sides for _ in range(TASKS_PER_CLIENT))),
            seconds + 90,
        )
        elapsed = time.perf_counter() - started
        failed = sum(lib.failed_rounds() for lib, _ in sides)
    finally:
        for lib, clients in sides:
            await lib.close()
            for client in clients:
                await client.aclose()
    return {
        "cycles_per_s": len(waits) / elapsed,
        "p99_wait_ms": _p99(waits) * 1000,
        "failed_rounds": failed,
        "overlaps": overlaps,
    }


async def one_paused(
    lib_type: type[Library], urls: Sequence[str], server: RedisServer, cycles: int
) -> dict[str, Any]:
    """Solo cycles while one master is stopped (SIGSTOP: it accepts, answers nothing).

    Bounded by *cycles* and PAUSED_SECONDS. pottery's clients get a socket timeout equal
    to aiolock's node_timeout (0.25 s): without one, its acquire never returns.
    """
    clients = [Redis.from_url(url, socket_timeout=0.25) for url in urls]
    lib = lib_type()
    await lib.open(clients, f"rb-{uuid.uuid4().hex[:8]}")
    latencies: list[float] = []
    try:
        for _ in range(5):
            await lib.cycle("paused")
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            stop = time.perf_counter() + PAUSED_SECONDS
            started = time.perf_counter()
            while len(latencies) < cycles and time.perf_counter() < stop:
                t0 = time.perf_counter()
                await lib.cycle("paused")
                latencies.append(time.perf_counter() - t0)
            elapsed = time.perf_counter() - started
        finally:
            os.kill(server.pid, signal.SIGCONT)
    finally:
        await lib.close()
        for client in clients:
            await client.aclose()
    return {
        "cycles_per_s": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": _p99(latencies) * 1000,
    }


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


# -- report ---------------------------------------------------------------------------


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(run[key] for run in runs))


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "## Redlock: aiolock vs pottery's AIORedlock, 3 and 5 masters",
        "",
        f"`python -m benchmarks.topologies.redlock --cycles {doc['cycles']} --seconds "
        f"{doc['seconds']} --repeats {doc['repeats']} --paused-cycles "
        f"{doc.get('paused_cycles', 200)}`; {doc['when']}; Python "
        f"{doc['python']}, redis-py {doc['redis_py']}, pottery {doc['pottery']}, "
        f"redis-server {doc['server']}; all masters on this machine (loopback), 2 shared "
        "cores, so the figures are ratios more than absolutes. Medians over the repeats "
        "(libraries interleaved). Commands per acquisition are counted by the servers "
        "(INFO commandstats, summed over the masters, commands inside scripts included) "
        "for one acquire+release cycle.",
        "",
        "| masters | library | solo cycles/s | solo p50 ms | solo p99 ms | commands per "
        "acquisition | contended cycles/s (2 clients x 4 tasks) | contended p99 wait ms | "
        "failed rounds | one master stopped: cycles/s | one master stopped: p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        lines.append(
            f"| {row['masters']} | {row['library']} | {row['solo_cycles_per_s']:.0f} | "
            f"{row['solo_p50_ms']:.2f} | {row['solo_p99_ms']:.2f} | "
            f"{row['commands_per_acquisition']:.1f} ({row['commands']}) | "
            f"{row['contended_cycles_per_s']:.0f} | {row['contended_p99_wait_ms']:.1f} | "
            f"{row['failed_rounds']} | {row['paused_cycles_per_s']:.1f} | "
            f"{row['paused_p99_ms']:.1f} |"
        )
    lines += [
        "",
        "Method: `benchmarks/topologies/redlock.py` (module docstring). The contended run counts "
        "critical-section overlaps in the process as a sanity check "
        f"(total overlaps seen: {sum(r['overlaps'] for r in doc['rows'])}). "
        '"failed rounds" are aiolock rounds that did not win a majority (split votes '
        'between the two managers); pottery does not report them. "One master stopped": '
        "solo cycles (at most --paused-cycles, or 10 s) while one master is stopped with "
        "SIGSTOP (it accepts connections and answers nothing); pottery's clients get "
        "`socket_timeout=0.25` (aiolock's default node_timeout), without which its acquire "
        "would wait forever. pottery waits for every master on each acquire and release, so "
        "each cycle costs the timeout; aiolock skips a master that did not answer for 1 s, "
        "and asks it again after that: the operation that makes such a probe takes up to "
        "node_timeout, once a second, which a run of a fraction of a second (as here) "
        "leaves out of its p99.",
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace, servers: list[RedisServer]) -> dict[str, Any]:
    urls = [server.url for server in servers]
    results: dict[tuple[int, str], dict[str, list[dict[str, Any]]]] = {}
    for repeat in range(args.repeats):
        for masters in (3, 5):
            for lib_type in LIBRARIES:
                log(f"repeat {repeat + 1}/{args.repeats}: {masters} masters, {lib_type.name}")
                entry = results.setdefault(
                    (masters, lib_type.name), {"solo": [], "cont": [], "paused": []}
                )
                entry["solo"].append(await solo(lib_type, urls[:masters], args.cycles))
                entry["cont"].append(await contended(lib_type, urls[:masters], args.seconds))
                entry["paused"].append(
                    await one_paused(
                        lib_type, urls[:masters], servers[masters - 1], args.paused_cycles
                    )
                )
    rows = []
    for (masters, library), entry in results.items():
        solo_runs, cont_runs = entry["solo"], entry["cont"]
        commands = solo_runs[-1]["commands"]
        rows.append(
            {
                "masters": masters,
                "library": library,
                "solo_cycles_per_s": median_of(solo_runs, "cycles_per_s"),
                "solo_p50_ms": median_of(solo_runs, "p50_ms"),
                "solo_p99_ms": median_of(solo_runs, "p99_ms"),
                "commands_per_acquisition": median_of(solo_runs, "commands_per_acquisition"),
                "commands": ", ".join(f"{k} {v:.1f}" for k, v in commands.items() if v >= 0.05),
                "contended_cycles_per_s": median_of(cont_runs, "cycles_per_s"),
                "contended_p99_wait_ms": median_of(cont_runs, "p99_wait_ms"),
                "failed_rounds": int(median_of(cont_runs, "failed_rounds")),
                "paused_cycles_per_s": median_of(entry["paused"], "cycles_per_s"),
                "paused_p99_ms": median_of(entry["paused"], "p99_ms"),
                "overlaps": sum(run["overlaps"] for run in cont_runs),
                "runs": {"solo": solo_runs, "contended": cont_runs, "paused": entry["paused"]},
            }
        )
    return {"rows": rows}


def rewrite(out: Path) -> None:
    """Write the RESULTS.md section again from ``<out>/redlock.json`` (no measuring)."""
    doc = json.loads((out / "redlock.json").read_text())
    write_section(out / "RESULTS.md", "redlock", markdown(doc))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paused-cycles", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    if not (
        1 <= args.cycles <= 100_000
        and 0.1 <= args.seconds <= 60
        and 1 <= args.repeats <= 10
        and 1 <= args.paused_cycles <= 10_000
    ):
        parser.error("bounded runs only: cycles 1..100000, seconds 0.1..60, repeats 1..10")
    servers = [RedisServer() for _ in range(5)]
    try:
        for server in servers:
            server.start()
        info = redis.Redis.from_url(servers[0].url)
        version = info.info("server")["redis_version"]
        info.close()
        # pottery logs every master error with its traceback; the figures say enough.
        logging.getLogger("pottery").setLevel(logging.CRITICAL)
        doc = asyncio.run(run(args, servers))
    finally:
        for server in servers:
            server.stop()
    import importlib.metadata as md

    doc.update(
        cycles=args.cycles,
        seconds=args.seconds,
        repeats=args.repeats,
        paused_cycles=args.paused_cycles,
        when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        python=sys.version.split()[0],
        redis_py=md.version("redis"),
        pottery=md.version("pottery"),
        server=version,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "redlock.json").write_text(json.dumps(doc, indent=2) + "\n")
    section = markdown(doc)
    write_section(args.out / "RESULTS.md", "redlock", section)
    print(section)
    log(f"wrote {args.out / 'redlock.json'} and the redlock section of {args.out / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
