"""Leader election: one leader at a time, loss cancels the leader's body, terms fenced."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock.testing import RedisServer
from tests._support.helpers import eventually, lock_held
from tests._support.paths import REPO_ROOT
from tests._support.redlock import paused


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    """A second manager on the same keys: another process, as far as Redis can tell."""
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


class Leader:
    """A task running ``election.run`` whose body records its terms and waits."""

    def __init__(self, election: aiolock.LeaderElection) -> None:
        self.terms: list[aiolock.LeaderTerm] = []
        self.ended: list[BaseException] = []
        self.release = asyncio.Event()
        self.task = asyncio.create_task(election.run(self._body))

    async def _body(self, term: aiolock.LeaderTerm) -> None:
        self.terms.append(term)
        try:
            await self.release.wait()
        except BaseException as exc:
            self.ended.append(exc)
            raise

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_one_leader_at_a_time_and_the_next_term_has_a_larger_token(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    first = Leader(locks.leader("scheduler"))
    await eventually(lambda: bool(first.terms), what="the first leader")
    second = Leader(other.leader("scheduler"))
    await asyncio.sleep(0.2)  # it campaigns, and must not lead
    assert not second.terms
    assert locks.leader("scheduler").is_leader is False  # another object: not leading
    election = locks.leader("other-name")
    assert not election.is_leader and election.term is None
    await first.stop()  # cancelling releases at once: no wait for the lease
    await eventually(lambda: bool(second.terms), timeout=2, what="the second leader")
    assert second.terms[0].fencing_token > first.terms[0].fencing_token
    assert second.terms[0].name == "scheduler"
    await second.stop()
    assert not await locks.lock("scheduler").locked()


async def test_a_lost_leadership_cancels_the_body_and_campaigns_again(
    locks: aiolock.LockManager,
) -> None:
    election = locks.leader("scheduler")
    leader = Leader(election)
    await eventually(lambda: bool(leader.terms), what="leading")
    assert election.is_leader and election.term == leader.terms[0]
    assert f"leading term {leader.terms[0].fencing_token}>" in repr(election)
    assert await locks.lock("scheduler").force_release()  # as if the lease had run out
    await eventually(lambda: len(leader.terms) == 2, timeout=5, what="the second term")
    assert isinstance(leader.ended[0], asyncio.CancelledError)  # the body was cancelled
    assert leader.terms[1].fencing_token > leader.terms[0].fencing_token
    assert election.term == leader.terms[1]
    await leader.stop()
    assert not election.is_leader
    assert not await locks.lock("scheduler").locked()


async def test_every_new_leader_reports_its_fencing_token_as_its_term(
    locks: aiolock.LockManager, other: aiolock.LockManager, caplog: pytest.LogCaptureFixture
) -> None:
    """Two managers (two processes, as far as Redis can tell) lead in turn. Each term is
    numbered by its fencing token, larger than every earlier term's in either process
    (a count per election object made every new leader say ``term 1``)."""
    elections = [locks.leader("scheduler"), other.leader("scheduler")]
    reported: list[int] = []
    with caplog.at_level(logging.INFO, logger="aiolock"):
        for turn in range(4):  # a, b, a, b: each election's second term too
            election = elections[turn % 2]
            caplog.clear()
            async with election.lead() as term:
                (logged,) = [
                    int(found.group(1))
                    for record in caplog.records
                    if (found := re.match(r"leading 'scheduler'\W+term (\d+)", record.message))
                ]
                assert logged == term.fencing_token
                assert str(term) == f"term {term.fencing_token} of 'scheduler'"
                assert repr(election).endswith(f"leading term {term.fencing_token}>")
                reported.append(logged)
    assert reported == sorted(set(reported)), reported  # increasing across both processes


async def test_a_body_that_returns_ends_the_run_and_releases(locks: aiolock.LockManager) -> None:
    election = locks.leader("once")
    seen: list[bool] = []

    async def body(term: aiolock.LeaderTerm) -> None:
        seen.append(election.is_leader)

    await asyncio.wait_for(election.run(body), 5)
    assert seen == [True]
    assert not election.is_leader
    assert not await locks.lock("once").locked()


async def test_an_error_of_the_body_is_raised_after_release(locks: aiolock.LockManager) -> None:
    async def body(term: aiolock.LeaderTerm) -> None:
        raise aiolock.LockLostError("the body's own error about another lock")

    with pytest.raises(aiolock.LockLostError, match="the body's own"):
        await asyncio.wait_for(locks.leader("failing").run(body), 5)
    assert not await locks.lock("failing").locked()


async def test_stopping_and_closing_the_manager_end_the_run(redis_url: str, prefix: str) -> None:
    manager = await aiolock.LockManager.from_url(redis_url, prefix=prefix).open()
    leader = Leader(manager.leader("scheduler"))
    await eventually(lambda: bool(leader.terms), what="leading")
    waiting = Leader(manager.leader("scheduler"))  # campaigns while the first leads
    await asyncio.sleep(0.1)
    manager.stop_acquiring()  # a graceful stop: the campaign ends, the leader keeps leading
    await asyncio.wait_for(waiting.task, 5)
    assert not leader.task.done() and not waiting.terms
    await manager.aclose()
    await asyncio.wait_for(leader.task, 5)  # returns
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as locks:
        assert not await locks.lock("scheduler").locked()


async def test_an_outage_ends_the_term_and_the_campaign_resumes_when_redis_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aiolock")
    with RedisServer() as server:
        # No retries inside redis-py: each attempt fails at once while the server is down.
        client = Redis.from_url(server.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=2)
        try:
            async with aiolock.LockManager(client, prefix="outage", lease=1) as locks:
                election = locks.leader("scheduler")
                leader = Leader(election)
                await eventually(lambda: bool(leader.terms), what="leading")
                server.stop()
                await eventually(lambda: bool(leader.ended), timeout=10, what="the loss")
                assert isinstance(leader.ended[0], asyncio.CancelledError)
                assert not election.is_leader
                assert not leader.task.done()  # the campaign waits through the outage
                # The loss says why: the renewals could not reach Redis.
                token = leader.terms[0].fencing_token
                assert _lost_leadership(caplog) == [(token, "Redis was unreachable")]
                server.start()
                await eventually(lambda: len(leader.terms) == 2, timeout=20, what="a new term")
                assert election.is_leader
                assert leader.terms[1].fencing_token > leader.terms[0].fencing_token
                await leader.stop()
        finally:
            await client.aclose()


def _lost_leadership(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """(term, cause) of each WARNING of a lost leadership; the cause is "unreachable",
    "stood still" or the message's rest (its figures vary)."""
    found = []
    for record in caplog.records:
        lost = re.fullmatch(r"lost the leadership of '\w+' \(term (\d+)\): (.*)", record.message)
        if lost:
            cause = re.match(
                r"the lease ran out while (Redis was unreachable|the event loop stood still)[: ]",
                lost.group(2),
            )
            found.append((int(lost.group(1)), cause.group(1) if cause else lost.group(2)))
    return found


async def test_a_leader_paused_past_its_lease_says_its_loop_stood_still(
    redis: Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Code that blocks the event loop past the lease (as a stopped process would):
    the loss says the loop stood still, not that Redis could not be reached."""
    caplog.set_level(logging.WARNING, logger="aiolock")
    lease = 1.0
    async with aiolock.LockManager(redis, prefix=prefix, lease=lease) as locks:
        terms: list[aiolock.LeaderTerm] = []

        async def body(term: aiolock.LeaderTerm) -> None:
            terms.append(term)
            if len(terms) == 1:
                # Blocks the loop (a callback of it runs the sleep): no renewal can run.
                asyncio.get_running_loop().call_later(0.01, time.sleep, lease + 0.5)
                await asyncio.sleep(30)  # cancelled by the loss

        await asyncio.wait_for(locks.leader("scheduler").run(body), 20)
        assert len(terms) == 2 and terms[1].fencing_token > terms[0].fencing_token
    assert _lost_leadership(caplog) == [(terms[0].fencing_token, "the event loop stood still")]
    # The loss of the term (a campaign whose grant arrived after its lease, on a loaded
    # machine, logs a loss "before the term began" too: not what this test is about).
    (message,) = [
        r.message for r in caplog.records if re.match(r"lost the lead.*\(term ", r.message)
    ]
    figure = re.search(r"stood still for ([\d.]+) s or more", message)
    assert figure is not None, message
    stood_still = float(figure.group(1))
    # From the renewal that was due (a third of the lease in, or earlier) to the loss.
    assert lease * 2 / 3 - 0.1 <= stood_still <= lease + 0.5 + 0.3, message


@pytest.mark.processes
async def test_a_leader_cut_off_from_redis_says_redis_was_unreachable() -> None:
    """The server stops answering (SIGSTOP: connections stay open, no reply comes) until
    the lease runs out: the loss says Redis was unreachable, with the renewals' error."""
    with RedisServer() as server:
        client = Redis.from_url(server.url)
        try:
            async with aiolock.LockManager(client, prefix="cut-off", lease=1) as locks:
                election = locks.leader("scheduler")
                with pytest.raises(aiolock.LockLostError) as lost:
                    async with election.lead():
                        with paused(server):
                            await asyncio.sleep(10)  # cancelled by the loss
                message = str(lost.value)
                assert "the lease ran out while Redis was unreachable" in message, message
                assert "no reply within 0.333 s" in message, message
                assert "stood still" not in message, message
        finally:
            await client.aclose()


async def test_bad_input_fails_at_the_call(locks: aiolock.LockManager) -> None:
    with pytest.raises(ValueError, match="empty"):
        locks.leader("")
    token = aiolock.LockManager(locks.redis, prefix=locks.prefix, wire="token")
    with pytest.raises(aiolock.WireFormatError, match="fencing tokens"):
        token.leader("a")
    election = locks.leader("a")
    async with election.lead():
        with pytest.raises(RuntimeError, match="one election object per"):
            async with election.lead():
                pass  # pragma: no cover


# -- across processes, with SIGKILL ----------------------------------------------------


def _start_child(spec: dict[str, object]) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(
        [sys.executable, "-m", "tests._children.leader", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO_ROOT),
    )


def _kill(child: subprocess.Popen[str]) -> None:
    """SIGKILL a child of this test (by its pid) if it still runs."""
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(5)


async def until(check: Callable[[], Awaitable[bool]], *, timeout: float, what: str) -> None:
    """Poll Redis until *check* holds; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


async def records(redis: Redis, key: str) -> list[tuple[int, int, float]]:
    """The ``pid token time`` entries of a child's list."""
    found = []
    for raw in await redis.lrange(key, 0, -1):
        pid, token, at = (raw.decode() if isinstance(raw, bytes) else raw).split()
        found.append((int(pid), int(token), float(at)))
    return found


def intervals(
    begins: list[tuple[int, int, float]],
    ends: list[tuple[int, int, float]],
    stopped_at: dict[int, float],
) -> list[tuple[float, float, int]]:
    """(start, end, pid) of every run of the job; a run cut short (SIGKILL, SIGTERM) ends
    when its process was stopped."""
    found = []
    for pid in {pid for pid, _, _ in begins}:
        starts = [at for p, _, at in begins if p == pid]
        stops = [at for p, _, at in ends if p == pid]
        assert len(stops) in (len(starts), len(starts) - 1)
        stops += [stopped_at[pid]] * (len(starts) - len(stops))
        found += [(start, stop, pid) for start, stop in zip(starts, stops, strict=True)]
    return sorted(found)


def overlaps(runs: list[tuple[float, float, int]]) -> list[tuple[int, int]]:
    """The pids of consecutive runs (sorted by start) where one began before the other ended."""
    return [(a[2], b[2]) for a, b in itertools.pairwise(runs) if a[1] > b[0]]


def test_the_overlap_checker_finds_overlaps() -> None:
    runs = intervals([(1, 7, 1.0), (2, 8, 1.5)], [(2, 8, 2.5)], {1: 2.0, 2: 9.0})
    assert runs == [(1.0, 2.0, 1), (1.5, 2.5, 2)]
    assert overlaps(runs) == [(1, 2)]
    assert overlaps([(1.0, 2.0, 1), (2.0, 2.5, 2)]) == []


@pytest.mark.processes
async def test_a_killed_leader_is_replaced_within_the_lease(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    lease = 1.0
    spec = {
        "url": redis_url, "prefix": prefix, "name": "scheduler", "lease": lease,
        "period": 0.05, "work": 0.02, "max_seconds": 60,
    }  # fmt: skip
    first = _start_child(spec)
    children = [first]
    try:
        await until(lambda: _has(admin, f"{prefix}:terms", 1), timeout=30, what="a leader")
        second = _start_child(spec)
        children.append(second)
        await until(lambda: _has(admin, f"{prefix}:ready", 2), timeout=30, what="the 2nd")
        runs = await admin.llen(f"{prefix}:begin")
        # The first keeps leading while the second campaigns.
        await until(lambda: _has(admin, f"{prefix}:begin", runs + 5), timeout=30, what="runs")
        ((leader, first_token, _),) = await records(admin, f"{prefix}:terms")
        assert leader == first.pid
        os.kill(first.pid, signal.SIGKILL)
        killed_at = time.time()
        first.wait(5)

        async def second_ran() -> bool:
            return any(p == second.pid for p, _, _ in await records(admin, f"{prefix}:begin"))

        await until(second_ran, timeout=lease + 20, what="the second to run the job")
        begins = await records(admin, f"{prefix}:begin")
        failover = min(at for p, _, at in begins if p == second.pid) - killed_at
        print(f"failover after SIGKILL with a {lease} s lease: {failover:.3f} s")
        assert failover < lease + 4  # bounded by the lease, plus slack for a loaded machine
        terms = await records(admin, f"{prefix}:terms")
        assert [pid for pid, _, _ in terms] == [first.pid, second.pid]
        assert terms[1][1] > first_token  # the new term is fenced off from the old one
        assert {token for p, token, _ in begins if p == second.pid} == {terms[1][1]}
        await asyncio.sleep(0.3)  # a few more runs of the second
        second.send_signal(signal.SIGTERM)  # a clean stop releases the leadership
        assert second.wait(15) == 0, second.stderr.read() if second.stderr else ""
        stopped = {first.pid: killed_at, second.pid: time.time()}
        begins = await records(admin, f"{prefix}:begin")
        runs_of = intervals(begins, await records(admin, f"{prefix}:end"), stopped)
        assert {pid for _, _, pid in runs_of} == {first.pid, second.pid}
        assert overlaps(runs_of) == []
        key = aiolock.LockManager(admin, prefix=prefix).lock("scheduler").key
        assert not await lock_held(admin, key)
    finally:
        for child in children:
            _kill(child)


async def _has(redis: Redis, key: str, count: int) -> bool:
    return bool(await redis.llen(key) >= count)


@pytest.mark.processes
async def test_a_stopped_leader_process_says_its_loop_stood_still(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    """A leader process stopped (SIGSTOP) past its lease, then continued: its loss says
    the event loop stood still, and it leads again in a later term, with a larger token."""
    lease = 1.0
    spec = {
        "url": redis_url, "prefix": prefix, "name": "scheduler", "lease": lease,
        "period": 0.05, "work": 0.02, "max_seconds": 60,
    }  # fmt: skip
    child = _start_child(spec)
    try:
        await until(lambda: _has(admin, f"{prefix}:terms", 1), timeout=30, what="a leader")
        os.kill(child.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(lease + 1)  # the lease must run out meanwhile
        finally:
            os.kill(child.pid, signal.SIGCONT)
        await until(lambda: _has(admin, f"{prefix}:terms", 2), timeout=30, what="a new term")
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=15)
        assert child.returncode == 0, stderr
        (_, first, _), (_, second, _) = await records(admin, f"{prefix}:terms")
        assert second > first
        # The child configures no logging: Python prints its WARNINGs to stderr.
        # (a campaign whose grant arrived after its lease logs a loss "before the term
        # began": not a term's loss)
        lost = [line for line in stderr.splitlines() if line.startswith("lost the leadership of")]
        lost = [line for line in lost if "before the term began" not in line]
        assert len(lost) == 1, stderr
        assert lost[0].startswith(
            f"lost the leadership of 'scheduler' (term {first}): the lease ran out while the "
            "event loop stood still for "
        ), lost[0]
    finally:
        _kill(child)
