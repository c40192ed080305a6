"""W2's client work per cycle in instructions (callgrind), which a loaded machine cannot move.

``python -m benchmarks.client.instructions [--cycles A,B] [--tasks N] [--clients ...] [--keep DIR]``

:mod:`benchmarks.client.layers` times the client process's CPU per W2 cycle, and on a busy
machine its ratios spread further than the changes they are meant to show (target 2's
ratio: the LockManager's 1.62x-2.58x the minimal batching client's in one afternoon).
This counts instead. For each client (the rows of :mod:`benchmarks.client.layers`, built by
its :func:`~benchmarks.client.layers.client_cycle`, so the same code runs) and each cycle
count, one child process runs exactly that many cycles (``--tasks`` tasks on distinct
names, the same number each, after one warm-up cycle per task) under
``valgrind --tool=callgrind``. The ``redis-server`` (:class:`aiolock.testing.RedisServer`,
started here, stopped by pid) runs outside valgrind, so only the client's instructions are
counted. The difference between two cycle counts, divided by the difference of cycles, is
the instructions per cycle: start-up, imports, connections and warm-up cancel out.

Prints one row per client and the LockManager's ratio to the minimal client (target 2's
<= 2.0x, now in instructions rather than seconds). ``--keep DIR`` keeps the callgrind
files (``callgrind_annotate DIR/<client>-<cycles>.out`` shows where the instructions go).
The child runs with ``PYTHONHASHSEED=0``. Repeated runs of the minimal client agree
within 0.1 %, the LockManager's within about 2 %: how many commands share a pipeline
depends on timing, and with it the work per cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from aiolock.testing import RedisServer
from benchmarks.client.layers import MANAGER, MANAGER_NO_STATS, ROWS, client_cycle

#: short names on the command line for the rows of benchmarks.client.layers, and the
#: LockManager without per-name statistics
CLIENTS = {
    **dict(zip(("minimal", "client", "manager", "redis-py"), ROWS, strict=True)),
    "manager-nostats": MANAGER_NO_STATS,
}


async def _cycles(name: str, host: str, port: int, tasks: int, cycles: int) -> None:
    """Exactly *cycles* cycles of the client *name*, spread evenly over *tasks* tasks."""
    async with client_cycle(name, host, port) as cycle:
        for i in range(tasks):  # warm up: scripts loaded, connections open, names used once
            await cycle(f"w2:{i}")

        async def worker(i: int) -> None:
            lock_name = f"w2:{i}"
            for _ in range(cycles // tasks):
                await cycle(lock_name)

        await asyncio.gather(*(worker(i) for i in range(tasks)))


def _count(client: str, port: int, tasks: int, cycles: int, out: Path) -> int:
    """The instructions callgrind counts in one child that runs *cycles* cycles."""
    command = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--trace-children=no",
        sys.executable, "-m", "benchmarks.client.instructions", "--child", client,
        "--port", str(port), "--tasks", str(tasks), "--cycles", str(cycles),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        command, check=False, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    if done.returncode:
        tail = done.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"the {client} child failed ({done.returncode}):\n{tail}")
    found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction total in {out}: is it a callgrind file?")
    return int(found[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cycles", default="1920,5760", help="two cycle counts A < B, multiples of --tasks"
    )
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--clients", default="minimal,manager", help=",".join(CLIENTS))
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this directory")
    parser.add_argument("--child", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:  # the measured process, under valgrind
        cycles = int(args.cycles)
        asyncio.run(_cycles(CLIENTS[args.child], "127.0.0.1", args.port, args.tasks, cycles))
        return 0
    try:
        low, high = (int(n) for n in args.cycles.split(","))
    except ValueError:
        parser.error("--cycles takes two counts, such as 1920,5760")
    clients = args.clients.split(",")
    if not 0 < low < high or low % args.tasks or high % args.tasks:
        parser.error("--cycles must be two increasing multiples of --tasks")
    if not set(clients) <= set(CLIENTS):
        parser.error(f"--clients takes some of {','.join(CLIENTS)}")
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    keep = Path(tempfile.mkdtemp()) if args.keep is None else args.keep
    keep.mkdir(parents=True, exist_ok=True)
    per_cycle: dict[str, float] = {}
    with RedisServer() as server:
        for client in clients:
            low_count, high_count = (
                _count(client, server.port, args.tasks, n, keep / f"{client}-{n}.out")
                for n in (low, high)
            )
            per_cycle[client] = (high_count - low_count) / (high - low)
            print(
                f"{CLIENTS[client]}: {per_cycle[client]:,.0f} instructions per cycle "
                f"({low_count:,} for {low} cycles, {high_count:,} for {high})",
                flush=True,
            )
    if args.keep is None:
        shutil.rmtree(keep)
    if "minimal" in per_cycle and "manager" in per_cycle:
        ratio = per_cycle["manager"] / per_cycle["minimal"]
        print(f"{MANAGER} / minimal batching client: {ratio:.2f}x (issue 21, target 2: <= 2.0x)")
    if "manager" in per_cycle and "manager-nostats" in per_cycle:
        ratio = per_cycle["manager"] / per_cycle["manager-nostats"]
        print(
            f"{MANAGER} (top_k=20) / the same with top_k=0: {ratio:.3f}x "
            "(issue 38: per-name statistics cost at most 1.03x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
