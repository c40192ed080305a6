"""Mixed fleets on one lock name: aiolock and other clients in many processes.

The one fleet helper of the foreign wire formats' suites (tests/unit/_formats/token/test_kind.py,
tests/unit/_formats/timestamp/test_kind.py). :func:`run_fleet` starts one
:mod:`tests._children.wire_fleet` per spec, SIGKILLs each crasher (by its pid) once it is
inside its last critical section, waits for the others (bounded), and returns every
process's event log with the checker's verdicts. The checks are independent of the locks:
the checker's counter in Redis (see the child), and the logs' intervals, compared on the
system-wide monotonic clock. On top of it, the two scenarios both suites run with their
own foreign client: :func:`check_mixed_fleet` and :func:`check_crashed_holder_taken_over`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._formats.foreign import POLL_MAX, PollBackoff
from tests._support.helpers import PATIENCE, eventually, within
from tests._support.paths import REPO_ROOT

#: Scheduling and round trips on a loaded 2-core machine, on top of a documented bound
#: (more in a fleet, whose processes compete for the cores).
SLACK = 0.4
FLEET_SLACK = 0.6


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
                sys.executable, "-m", "tests._children.wire_fleet", json.dumps(full),
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


async def check_mixed_fleet(
    url: str, prefix: str, name: str, wire: str, foreign: tuple[str, str], what: str
) -> None:
    """aiolock with *wire* (2 processes, 3 tasks) and two processes of the *foreign*
    roles (``what`` clients), one process of each side SIGKILLed mid-hold after a few
    sections: no overlap by the counter or by the logs, every section ran, and while
    aiolock waited, no foreign release left the lock free longer than the poll bound."""
    common = {"name": name, "prefix": prefix, "lease": 1.0, "hold": 0.02, "yield_to_aiolock": 3}
    role = f"aiolock-{wire}"
    # Two processes crash: after a few sections they hang inside and are killed. The
    # first one contends until the others are done, so that their releases find it waiting.
    specs = [
        {**common, "role": role, "tasks": 2, "until_stop": True, "pause": 0.05},
        {**common, "role": role, "rounds": 3, "pause": 0.1, "crash": True},
        {**common, "role": foreign[0], "rounds": 4, "pause": 0.03, "crash": True},
        {**common, "role": foreign[1], "rounds": 14, "pause": 0.03},
    ]
    fleet = await run_fleet(url, f"{prefix}:check", specs, max_seconds=20)
    assert fleet.overlaps == []
    assert fleet.log_overlaps() == []
    assert fleet.sections(role) >= 3 + 1 + 2
    assert sum(fleet.sections(r) for r in set(foreign)) == 4 + 1 + 14
    gaps = fleet.foreign_release_gaps()
    assert len(gaps) >= 3, f"only {len(gaps)} {what} releases happened while aiolock waited"
    assert max(gaps) <= POLL_MAX + FLEET_SLACK, sorted(gaps)[-5:]
    print(f"\nfleet: {len(gaps)} {what} releases with aiolock waiting, max gap {max(gaps):.3f} s")


async def check_crashed_holder_taken_over(
    locks: aiolock.LockManager, url: str, prefix: str, name: str, role: str, polls: Polls
) -> None:
    """A holder of the foreign *role* in another process (a fleet of one) takes *name*
    with a 30 s lease and dies mid-hold (SIGKILL, by its pid): aiolock finds the lock held
    and polls it, at most :data:`POLL_MAX` apart; the lease then ends (the test's own
    action, as if its time had come: PEXPIRE, or a legacy expiry time in the past) and
    aiolock takes the lock over at its first poll after that."""
    spec = {"role": role, "name": name, "lease": 30.0, "hold": 0, "rounds": 0, "crash": True}
    fleet = await run_fleet(url, f"{prefix}:check-crash", [spec], max_seconds=10)
    [(_, _, killed)] = fleet.logs
    assert killed is not None
    lock = locks.lock(name)
    assert not await lock.try_acquire()  # the dead holder's lease runs on
    waiter = asyncio.create_task(take(lock, timeout=PATIENCE))
    await polls.at_bound()
    assert not waiter.done()
    polled, ended = len(polls.waits), time.monotonic()
    admin = Redis.from_url(url)
    try:
        if role == "legacy":  # its expiry time (ms, server clock) has passed
            seconds, micros = await admin.time()
            await admin.set(name, str(seconds * 1000 + micros // 1000 - 1))
        else:
            assert await admin.pexpire(name, 1)
    finally:
        await admin.aclose()
    took = await within(waiter, what="aiolock to take over the expired lock") - ended
    # At most the poll that was on its way when the lease ended failed: the next one took it.
    assert len(polls.waits) - polled <= 1, polls.waits[polled:]
    polls.check_bound()
    assert took < 5.0, f"aiolock took the lock {took:.2f} s after the lease ended"


class Polls:
    """Every wait :class:`PollBackoff` hands out in this process while installed: one per
    failed poll of a foreign holder, so their number counts those polls and each is the
    time until the next one. The poll bound checked by events and counts, not by a
    stopwatch that a loaded machine can overrun."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.waits: list[float] = []
        original = PollBackoff.next

        def next_wait(
            backoff: PollBackoff, name: str, ttl: float, now: float | None = None
        ) -> float:
            wait = original(backoff, name, ttl, now)
            self.waits.append(wait)
            return wait

        monkeypatch.setattr(PollBackoff, "next", next_wait)

    async def at_bound(self) -> None:
        """Until the backoff has reached :data:`POLL_MAX` (its ramp takes 150 ms)."""
        await eventually(lambda: POLL_MAX in self.waits, what="the poll backoff to reach POLL_MAX")

    def check_bound(self) -> None:
        """No wait between two polls was longer than the bound."""
        assert self.waits and max(self.waits) <= POLL_MAX, self.waits


async def text(client: Redis, key: str) -> str:
    """The string at *key* (it must exist)."""
    value = await client.get(key)
    assert isinstance(value, bytes), (key, value)
    return value.decode()


async def take(lock: aiolock.Lock, timeout: float = 10) -> float:
    """Acquire *lock* in the calling task, release it; when it was acquired (monotonic)."""
    await lock.acquire(timeout=timeout)
    acquired = time.monotonic()
    await lock.release()
    return acquired
