"""A storm of randomly cancelled lock operations, shared by the in-process test and the
child processes of the cross-process test (:mod:`tests._children.faults`).

Tasks acquire a handful of names in several ways (``async with``, nested re-entry, manual
acquire/release with and without timeouts, ``try_acquire``, fixed leases, two names at
once) and are cancelled at random moments: before they start, after a random delay from
outside, or by themselves at a chosen phase boundary (so that cancellations land inside
acquire, inside the body and inside release, not only where the timing happens to fall).
Every round is bounded in time; a task that does not finish is reported as hung.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
import time
from typing import Any

import aiolock

#: operation kinds, with weights
KINDS: tuple[tuple[str, int], ...] = (
    ("with", 4),
    ("nested", 2),
    ("manual", 3),
    ("try", 2),
    ("fixed", 1),
    ("two", 2),
)
#: phases a task may cancel itself at (None: no self-cancellation)
SELF_CANCEL: tuple[str | None, ...] = (None, None, "acquire", "body", "release", "release")
ROUND_TIMEOUT = 30.0


@dataclasses.dataclass
class Plan:
    kind: str
    names: tuple[str, str]
    hold: float
    timeout: float | None
    self_cancel: str | None
    self_delay: float


@dataclasses.dataclass
class StormReport:
    tasks: int = 0
    #: tasks that ended cancelled (``task.cancelled()``): cancellations actually delivered
    cancelled: int = 0
    completed: int = 0
    #: LockTimeoutError / try_acquire False, expected with finite timeouts
    timeouts: int = 0
    #: where the delivered cancellations landed
    phases: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    unexpected: list[str] = dataclasses.field(default_factory=list)
    hung: int = 0
    max_waiters: int = 0
    seconds: float = 0.0
    warnings: int = 0
    warning_samples: list[str] = dataclasses.field(default_factory=list)
    #: manager statistics after the drain
    final: dict[str, int] = dataclasses.field(default_factory=dict)
    drained: bool = False
    #: tasks alive after the drain that were not alive before the storm (manager open)
    leaked: list[str] = dataclasses.field(default_factory=list)
    #: tasks alive after the manager closed that were not alive before it opened
    after_close: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["phases"] = dict(self.phases)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StormReport:
        fields = dict(data)
        fields["phases"] = collections.Counter(fields["phases"])
        return cls(**fields)

    def add(self, other: StormReport) -> None:
        for name in ("tasks", "cancelled", "completed", "timeouts", "hung", "warnings"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.phases.update(other.phases)
        self.unexpected.extend(other.unexpected)
        self.warning_samples.extend(other.warning_samples[: max(0, 10 - len(self.warning_samples))])
        self.leaked.extend(other.leaked)
        self.after_close.extend(other.after_close)
        self.max_waiters = max(self.max_waiters, other.max_waiters)
        self.seconds = max(self.seconds, other.seconds)


def alive_since(baseline: set[asyncio.Task[Any]]) -> list[str]:
    """Tasks not done now that were not in *baseline* (the current task excluded)."""
    current = asyncio.current_task()
    return [
        repr(task)
        for task in asyncio.all_tasks()
        if task is not current and task not in baseline and not task.done()
    ]


class _Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.samples) < 5:
            self.samples.append(record.getMessage()[:300])


class _Phase:
    __slots__ = ("where",)

    def __init__(self) -> None:
        self.where = "start"


def _plan(rng: random.Random, names: list[str]) -> Plan:
    kinds, weights = zip(*KINDS, strict=True)
    kind = rng.choices(kinds, weights)[0]
    first, second = rng.sample(names, 2) if len(names) > 1 else (names[0], names[0])
    return Plan(
        kind=kind,
        names=(first, second),
        hold=rng.choice((0.0, 0.0, 0.0005, 0.002, 0.005)),
        timeout=rng.choice((None, None, 0.05, 0.2)),
        self_cancel=rng.choice(SELF_CANCEL),
        self_delay=rng.choice((0.0, 0.0, rng.uniform(0, 0.002))),
    )


async def _operation(manager: aiolock.LockManager, plan: Plan, phase: _Phase) -> bool:
    """Run one planned operation; False if it timed out (an expected outcome)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def enter(where: str) -> None:
        phase.where = where
        if plan.self_cancel == where:
            if plan.self_delay:
                loop.call_later(plan.self_delay, task.cancel)
            else:
                loop.call_soon(task.cancel)

    async def body() -> None:
        enter("body")
        await asyncio.sleep(plan.hold)
        enter("release")

    name = plan.names[0]
    lock = manager.lock(name)
    enter("acquire")
    if plan.kind == "with":
        async with lock:
            await body()
    elif plan.kind == "nested":
        async with lock:
            enter("acquire")
            async with lock:
                await body()
            enter("release")
    elif plan.kind == "fixed":
        async with manager.lock(name, lease=10.0):
            await body()
    elif plan.kind == "two":
        first, second = sorted(plan.names)  # a global order: no deadlock
        async with manager.lock(first):
            enter("acquire")
            async with manager.lock(second):
                await body()
            enter("release")
    elif plan.kind == "manual":
        try:
            await lock.acquire(timeout=plan.timeout)
        except aiolock.LockTimeoutError:
            return False
        try:
            await body()
        finally:
            phase.where = "release"
            await lock.release()
    elif plan.kind == "try":
        if not await lock.try_acquire(timeout=0 if plan.timeout is None else plan.timeout):
            return False
        try:
            await body()
        finally:
            phase.where = "release"
            await lock.release()
    else:  # pragma: no cover - a typo in KINDS
        raise AssertionError(plan.kind)
    return True


async def storm(
    manager: aiolock.LockManager,
    names: list[str],
    *,
    target: int,
    seed: int,
    max_seconds: float,
    batch: int = 64,
) -> StormReport:
    """Run rounds of *batch* tasks until *target* cancellations were delivered (or
    *max_seconds* passed), then drain and report. The manager must be open."""
    report = StormReport()
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    counter = _Counter()
    logger = logging.getLogger("aiolock")
    logger.addHandler(counter)
    async with manager.lock(f"warm-up-{seed}"):  # the manager's background tasks run
        pass
    baseline = set(asyncio.all_tasks())
    started = time.monotonic()

    async def sample_waiters() -> None:
        while True:
            waiters = manager.statistics().hub.waiters
            report.max_waiters = max(report.max_waiters, waiters)
            await asyncio.sleep(0.001)

    sampler = loop.create_task(sample_waiters())
    try:
        while report.cancelled < target and time.monotonic() - started < max_seconds:
            phases: dict[asyncio.Task[bool], _Phase] = {}
            for _ in range(batch):
                plan = _plan(rng, names)
                phase = _Phase()
                task = loop.create_task(_operation(manager, plan, phase))
                phases[task] = phase
                roll = rng.random()
                if roll < 0.08:
                    task.cancel()  # before it ever runs
                elif roll < 0.6:
                    loop.call_later(
                        rng.choice((0.0, rng.uniform(0, 0.003), rng.uniform(0, 0.03))), task.cancel
                    )
            tasks = list(phases)
            done, pending = await asyncio.wait(tasks, timeout=ROUND_TIMEOUT)
            for task in pending:
                report.hung += 1
                report.unexpected.append(f"hung for {ROUND_TIMEOUT} s: {task!r}")
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=10)
            for task in done:
                report.tasks += 1
                if task.cancelled():
                    report.cancelled += 1
                    report.phases[phases[task].where] += 1
                elif task.exception() is not None:
                    exc = task.exception()
                    report.unexpected.append(f"{type(exc).__name__}: {exc}")
                elif task.result():
                    report.completed += 1
                else:
                    report.timeouts += 1
        report.seconds = time.monotonic() - started
        sampler.cancel()
        await asyncio.wait((sampler,))
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            stats = manager.statistics()
            report.final = {
                "held": stats.held,
                "waiters": stats.hub.waiters,
                "queues": stats.hub.queues,
                "pending_cleanups": stats.pending_cleanups,
            }
            if not any(report.final.values()):
                report.drained = True
                break
            await asyncio.sleep(0.02)
        report.leaked = alive_since(baseline)
    finally:
        sampler.cancel()
        logger.removeHandler(counter)
    report.warnings = counter.count
    report.warning_samples = counter.samples
    return report
