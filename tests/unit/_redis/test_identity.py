"""Who holds it (issue 20, item 1): every manager's identity record, and the CLI showing it.

A manager keeps ``P:mgr:{<id>}`` (host, pid, process and application name, version, start)
while it is open, refreshed by its watchdog; it is deleted at close and expires within one
lease after the process dies. The ``aiolock`` command resolves holders to it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from redis.asyncio import Redis

import aiolock
import aiolock._redis.identity
from aiolock._keys import LAYOUT
from aiolock.contrib.jobs import Claim
from tests._support.helpers import eventually
from tests._support.paths import REPO_ROOT
from tests.unit._cli.test_main import run_cli

#: the record's size in server memory (MEMORY USAGE) must stay about this small
MAX_RECORD_BYTES = 216

#: A fixed lease that no test here may outlive, however slow the machine.
LONG_LEASE = 600


async def record_of(redis: Redis, manager: aiolock.LockManager) -> dict[str, object]:
    key = f"{manager.prefix}:mgr:{{{manager.id}}}"
    deadline = time.monotonic() + 10
    while (raw := await redis.get(key)) is None:  # written by the watchdog's first round
        assert time.monotonic() < deadline, f"no identity record at {key}"
        await asyncio.sleep(0.01)
    data = json.loads(raw)
    assert isinstance(data, dict)
    return data


async def test_an_open_manager_publishes_its_record_and_deletes_it_at_close(
    redis: Redis, prefix: str
) -> None:
    manager = aiolock.LockManager(redis, prefix=prefix, lease=5, name="billing-worker")
    key = f"{prefix}:mgr:{{{manager.id}}}"
    async with manager:
        record = await record_of(redis, manager)
        assert 0 < await redis.pttl(key) <= 5000
        size = await redis.memory_usage(key)
    assert record["h"] == socket.gethostname()
    assert record["p"] == os.getpid()
    assert record["n"] == "billing-worker"
    assert record["v"] == aiolock.__version__
    assert record["l"] == LAYOUT  # the key layout: managers of another refuse to open
    assert isinstance(record["c"], str) and record["c"]
    assert abs(float(str(record["t"])) - time.time()) < 60
    assert size is not None and size <= MAX_RECORD_BYTES, size
    print(f"identity record: {size} bytes (MEMORY USAGE) for {len(key)}-byte key")
    assert await redis.exists(key) == 0


async def test_the_watchdog_keeps_the_record_alive_beyond_its_lease(
    redis: Redis, prefix: str
) -> None:
    # 1 s, not less: a round a few tenths late on a loaded machine must not let the
    # record lapse between two refreshes
    async with aiolock.LockManager(redis, prefix=prefix, lease=1.0) as manager:
        await record_of(redis, manager)
        key = f"{prefix}:mgr:{{{manager.id}}}"
        rounds = manager.statistics().renewal_rounds
        # Two leases of renewal rounds: the record was written with PX = 1 s, so it
        # exists now only if the rounds refreshed it.
        await eventually(lambda: manager.statistics().renewal_rounds >= rounds + 6, timeout=30)
        assert await redis.exists(key) == 1


async def test_without_the_open_check_the_first_round_writes_it(redis: Redis, prefix: str) -> None:
    # check_on_open=False promises no I/O at open (a pool shared with the application):
    # the record comes with the watchdog's first round, a third of a lease later.
    async with aiolock.LockManager(redis, prefix=prefix, lease=0.6, check_on_open=False) as m:
        record = await record_of(redis, m)
        assert record["p"] == os.getpid()
        assert m.statistics().renewal_rounds >= 1


async def test_a_stalled_record_write_never_holds_back_renewals(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record is refreshed beside the watchdog, not as a step of its rounds: a write
    that hangs (a slow node; the real one gives up after a third of the lease) must not
    keep the watchdog from renewing the holds."""
    stalled = asyncio.Event()

    async def hang(self: object) -> None:
        stalled.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(aiolock._redis.identity.Identity, "publish", hang)
    lease = 3.0  # renewed every second: a round late by two seconds still keeps it
    async with aiolock.LockManager(redis, prefix=prefix, lease=lease, check_on_open=False) as locks:
        lock = locks.lock("renewed-beside-a-stalled-record")
        await lock.acquire()
        await asyncio.wait_for(stalled.wait(), 10)
        await asyncio.sleep(2 * lease)  # two leases: only renewals keep it
        assert await lock.locked()
        assert await lock.owned()
        await lock.release()


async def test_identity_false_writes_no_record(redis: Redis, prefix: str) -> None:
    # 1 s, renewed: the hold must outlive a late round until the CLI has read it
    async with aiolock.LockManager(redis, prefix=prefix, lease=1.0, identity=False) as m:
        rounds = m.statistics().renewal_rounds
        async with m.lock("x"):
            await eventually(lambda: m.statistics().renewal_rounds >= rounds + 2, timeout=30)
            assert [k async for k in redis.scan_iter(match=f"{prefix}:mgr:*")] == []
            result = await run_cli_json(redis, prefix, "x")
    objects = result["objects"]
    assert isinstance(objects, list)
    (holder,) = objects[0]["holders"]
    assert holder["host"] is None and holder["pid"] is None and holder["name"] is None
    assert holder["layout"] is None  # no record: nothing announced


async def run_cli_json(redis: Redis, prefix: str, name: str) -> dict[str, object]:
    url = _url(redis)
    result = await run_cli(url, prefix, "--json", "show", name)
    assert result.code == 0, result.err
    document = json.loads(result.out)
    assert isinstance(document, dict)
    return document


def _url(redis: Redis) -> str:
    kwargs = redis.connection_pool.connection_kwargs
    return f"redis://{kwargs.get('host', '127.0.0.1')}:{kwargs['port']}/{kwargs.get('db', 0)}"


def test_name_is_checked_at_the_call(redis_url: str) -> None:
    client = Redis(port=1)
    with pytest.raises(TypeError, match="name must be a str or None"):
        aiolock.LockManager(client, name=42)  # type: ignore[arg-type]
    for bad in ("", "x" * 65, "tab\there"):
        with pytest.raises(ValueError, match="1 to 64 printable characters"):
            aiolock.LockManager(client, name=bad)
    with pytest.raises(TypeError, match="identity must be True or False"):
        aiolock.LockManager(client, identity=1)  # type: ignore[arg-type]
    assert aiolock.LockManager.from_url(redis_url, name="api").name == "api"
    assert aiolock.LockManager(client).name is None


async def test_the_cli_shows_host_pid_and_name_of_another_managers_holder(
    redis: Redis, redis_url: str, prefix: str
) -> None:
    async with (
        aiolock.LockManager(redis, prefix=prefix, name="billing-worker") as holder,
        aiolock.LockManager(redis, prefix=prefix, lease=5) as waiter,
    ):
        await record_of(redis, holder)
        await record_of(redis, waiter)
        fair = holder.fair_lock("invoice")
        # A fixed lease that outlasts three CLI processes on a loaded machine (20 s ran
        # out once under CI's two suites and a CPU hog: the hold was lost mid-test).
        async with holder.lock("orders", lease=LONG_LEASE), fair:
            queued = asyncio.create_task(waiter.fair_lock("invoice").acquire())
            try:
                queue = f"{prefix}:fair:{{invoice}}:queue"
                for _ in range(500):
                    if await redis.zcard(queue) == 1:
                        break
                    await asyncio.sleep(0.01)
                listed = await run_cli(redis_url, prefix, "--json", "list")
                table = await run_cli(redis_url, prefix, "list")
                shown = await run_cli(redis_url, prefix, "show", "invoice")
            finally:
                queued.cancel()
                await asyncio.gather(queued, return_exceptions=True)
    assert listed.code == 0, listed.err
    objects = {o["name"]: o for o in json.loads(listed.out)}
    (lock_holder,) = objects["orders"]["holders"]
    assert lock_holder["host"] == socket.gethostname()
    assert lock_holder["pid"] == os.getpid()
    assert lock_holder["name"] == "billing-worker"
    assert lock_holder["manager"] == holder.id
    assert lock_holder["layout"] == LAYOUT
    assert 0 < lock_holder["lease_left"] <= LONG_LEASE
    # a plain hold's token and age, from its state (issue 38; tests/unit/_cli/test_holders.py)
    assert lock_holder["token"] is not None and lock_holder["held_for"] >= 0
    (who,) = objects["invoice"]["waiting_who"]
    assert who["manager"] == waiter.id and who["pid"] == os.getpid()
    assert who["layout"] == LAYOUT
    assert who["name"]  # no name=: the process name
    assert "billing-worker@" in table.out and f"pid {os.getpid()}" in table.out
    assert shown.code == 0, shown.err
    assert f"billing-worker@{socket.gethostname()} pid {os.getpid()}" in shown.out
    assert f"{waiter.id}:" in shown.out


async def test_show_includes_a_job_locks_holder_record(
    redis: Redis, redis_url: str, prefix: str
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix, name="reports") as locks:
        await record_of(redis, locks)
        async with Claim(locks, "report:7", job_id="job-77"):
            key = f"{prefix}:lock:{{report:7}}:job"
            for _ in range(500):
                if await redis.exists(key):
                    break
                await asyncio.sleep(0.01)
            shown = await run_cli(redis_url, prefix, "--json", "show", "report:7")
            table = await run_cli(redis_url, prefix, "show", "report:7")
    (obj,) = json.loads(shown.out)["objects"]
    assert obj["fence"] is None  # nothing released yet (fence state is kept at release)
    assert obj["job"]["job_id"] == "job-77"
    assert obj["job"]["pid"] == os.getpid()
    (holder,) = obj["holders"]
    assert holder["name"] == "reports"
    assert holder["held_for"] is not None and 0 <= holder["held_for"] < 60
    assert f"job:        job-77 on {socket.gethostname()} pid {os.getpid()}" in table.out


async def test_show_prints_the_fence_state(redis: Redis, redis_url: str, prefix: str) -> None:
    """The fence key of a kind that keeps one; none for a held plain lock, whose state
    keeps the holder's token only (issue 36: tokens follow the clock, so the token
    released before it is not the holder's minus one)."""
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        fair, plain = locks.fair_lock("fenced"), locks.lock("fenced")
        async with fair:
            first = fair.fencing_token
        async with plain:
            pass
        async with fair, plain:
            shown = await run_cli(redis_url, prefix, "--json", "show", "fenced")
            table = await run_cli(redis_url, prefix, "show", "fenced")
    fences = {obj["kind"]: obj["fence"] for obj in json.loads(shown.out)["objects"]}
    assert fences == {"fair": first, "lock": None}
    assert table.out.count("fence:") == 1
    assert f"fence:      {first} " in table.out
    assert ": 1 hold, " in table.out  # not "1 holds"


def _start_child(url: str, prefix: str, lease: float) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(
        [sys.executable, "-m", "tests._children.identity", url, prefix, str(lease)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO_ROOT),
    )


@pytest.mark.processes
async def test_a_killed_processs_record_is_gone_within_a_lease(
    redis: Redis, redis_url: str, prefix: str
) -> None:
    lease = 1.0
    child = _start_child(redis_url, prefix, lease)
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
        assert line.startswith("READY "), (line, child.poll())
        _, manager_id, pid = line.split()
        key = f"{prefix}:mgr:{{{manager_id}}}"
        for _ in range(1000):  # the watchdog writes it as it starts, a round trip after open
            if await redis.exists(key):
                break
            await asyncio.sleep(0.01)
        assert await redis.exists(key) == 1
        alive = await run_cli(redis_url, prefix, "--json", "show", "held")
        (holder,) = json.loads(alive.out)["objects"][0]["holders"]
        assert (holder["pid"], holder["name"]) == (int(pid), "child-app")
        assert holder["host"] == socket.gethostname()

        os.kill(child.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        child.wait(10)
        while await redis.exists(key):
            assert time.monotonic() - killed_at < 10 * lease, "the record outlived the process"
            await asyncio.sleep(0.02)
        gone_after = time.monotonic() - killed_at
        # PX = one lease, set at the last round before the kill: within a lease (plus
        # the scheduling noise of a loaded machine)
        assert gone_after <= lease + 0.5, gone_after
        print(f"record gone {gone_after:.2f} s after SIGKILL (lease {lease} s)")
        dead = await run_cli(redis_url, prefix, "--json", "show", "held")
        (holder,) = json.loads(dead.out)["objects"][0]["holders"]
        assert holder["manager"] == manager_id
        assert (holder["host"], holder["pid"], holder["name"]) == (None, None, None)
        assert (
            f"(no record, manager {manager_id[:8]})"
            in (await run_cli(redis_url, prefix, "show", "held")).out
        )
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(5)
