"""Mixed fleets on one lock name: aiolock and other clients in many processes.

:func:`run_fleet` starts one :mod:`tests._wire_fleet_child` per spec, SIGKILLs each
crasher (by its pid) once it is inside its last critical section, waits for the others
(bounded), and returns every process's event log with the checker's verdicts. The
checks are independent of the locks: the checker's counter in Redis (see the child),
and the logs' intervals, compared on the system-wide monotonic clock.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Fleet:
    #: per process: its role, its events, whether the test killed it (and when)
    logs: list[tuple[str, list[dict[str, Any]], float | None]] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)

    def intervals(self) -> list[tuple[float, float, str]]:
        """Every critical section as (enter, exit, who); a killed holder's ends when it
        was killed (its lock outlives it, so nobody may enter before that)."""
        out = []
        for _, events, killed_at in self.logs:
            open_at: dict[str, float] = {}
            for event in events:
                if event["e"] == "enter":
                    open_at[event["who"]] = event["t"]
                elif event["e"] == "exit":
                    out.append((open_at.pop(event["who"]), event["t"], event["who"]))
            for who, start in open_at.items():
                assert killed_at is not None, f"{who} entered and never left"
                out.append((start, killed_at, who))
        return sorted(out)

    def log_overlaps(self) -> list[str]:
        sections = self.intervals()
        return [
            f"{b[2]} entered at {b[0]:.4f} before {a[2]} left at {a[1]:.4f}"
            for a, b in itertools.pairwise(sections)
            if b[0] < a[1]
        ]

    def sections(self, role_prefix: str) -> int:
        return sum(1 for s in self.intervals() if s[2].startswith(role_prefix))

    def foreign_release_gaps(self) -> list[float]:
        """For each release by a non-aiolock client (its logged exit) while an aiolock
        task waited: the time until anyone entered next. While aiolock waits, a free lock
        stays free at most that long: the bound of its poll, plus round trips."""
        waits: list[tuple[float, float]] = []  # aiolock tasks: (wait, enter or inf)
        enters: list[float] = []
        exits: list[float] = []
        for role, events, _ in self.logs:
            started: dict[str, float] = {}
            for event in events:
                if event["e"] == "wait":
                    started[event["who"]] = event["t"]
                elif event["e"] == "enter":
                    enters.append(event["t"])
                    if role.startswith("aiolock"):
                        waits.append((started.pop(event["who"]), event["t"]))
                elif event["e"] == "exit" and not role.startswith("aiolock"):
                    exits.append(event["t"])
            if role.startswith("aiolock"):
                waits += [(t, float("inf")) for t in started.values()]
        enters.sort()
        gaps = []
        for released in exits:
            if not any(w < released < e for w, e in waits):
                continue
            later = [t for t in enters if t > released]
            if later:
                gaps.append(later[0] - released)
        return gaps


async def run_fleet(url: str, check: str, specs: list[dict[str, Any]], max_seconds: float) -> Fleet:
    """Run the children of *specs* (each gets ``url``, ``check``, ``max_seconds``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    admin = Redis.from_url(url)
    procs: list[tuple[dict[str, Any], asyncio.subprocess.Process]] = []
    fleet = Fleet()
    try:
        for spec in specs:
            full = {**spec, "url": url, "check": check, "max_seconds": max_seconds}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests._wire_fleet_child", json.dumps(full),
                stdout=asyncio.subprocess.PIPE, env=env, cwd=str(REPO_ROOT),
            )  # fmt: skip
            procs.append((full, proc))

        # Every child imports its libraries, then waits for the go key: they start together.
        for _, proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert json.loads(line)["e"] == "ready", line
        await admin.set(f"{check}:go", 1, ex=60)

        async def collect(spec: dict[str, Any], proc: asyncio.subprocess.Process) -> None:
            assert proc.stdout is not None
            events: list[dict[str, Any]] = []
            killed_at = None
            async for line in proc.stdout:
                events.append(json.loads(line))
                entered = sum(1 for event in events if event["e"] == "enter")
                if spec.get("crash") and entered == spec["rounds"] + 1 and killed_at is None:
                    await asyncio.sleep(0.1)  # hold a moment, then die mid-hold
                    proc.kill()  # SIGKILL, this child's pid
                    await proc.wait()
                    killed_at = asyncio.get_running_loop().time()
                    # The checker's bookkeeping of the dead holder, as its exit would.
                    if await admin.hdel(f"{check}:inside", str(proc.pid)):
                        await admin.decr(check)
            await proc.wait()
            if killed_at is None:  # a child that failed would leave the test vacuous
                assert proc.returncode == 0, f"{spec['role']} child exited {proc.returncode}"
                assert events and events[-1]["e"] == "done", f"{spec['role']} did not finish"
            fleet.logs.append((spec["role"], events, killed_at))

        async def run_all() -> None:
            # Children with ``until_stop`` keep contending until every other child is done
            # (so that the others' releases happen while they wait); then the stop key.
            finite = [collect(spec, proc) for spec, proc in procs if not spec.get("until_stop")]
            rest = [collect(spec, proc) for spec, proc in procs if spec.get("until_stop")]
            others = asyncio.gather(*rest)
            try:
                await asyncio.gather(*finite)
                await admin.set(f"{check}:stop", 1, ex=60)
                await others
            finally:
                others.cancel()

        await asyncio.wait_for(run_all(), max_seconds + 15)
        fleet.overlaps = [str(o) for o in await admin.lrange(f"{check}:overlaps", 0, -1)]
        return fleet
    finally:
        for _, proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await admin.aclose()
