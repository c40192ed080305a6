"""The ``aiolock`` command line, run as ``python -m aiolock`` against the suite's Redis.

The command runs as a child process while this test's manager holds locks, so the event
loop (and the manager's renewals) keeps running: the child is awaited with asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._cli.inspect import parse_key, scan
from aiolock.testing import RedisServer
from tests._support.helpers import closed_port, eventually, within

#: every child gets at most this long: a hung command fails the test instead of the suite
CHILD_TIMEOUT = 30.0


@dataclass
class Result:
    code: int
    out: str
    err: str


async def run_cli(url: str, prefix: str, *args: str, stdin: str = "") -> Result:
    return await run_raw("--url", url, "--prefix", prefix, *args, stdin=stdin)


async def run_raw(*args: str, stdin: str = "") -> Result:
    """``python -m aiolock`` with exactly *args*."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiolock", *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin.encode()), CHILD_TIMEOUT)
    except asyncio.TimeoutError:  # wait_for's: not the builtin TimeoutError before 3.11
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())


@contextlib.asynccontextmanager
async def holding(locks: aiolock.LockManager, admin: Redis) -> AsyncIterator[None]:
    """Hold a lock, a fair lock with one queued waiter, a rw read and a semaphore permit."""
    lock = locks.lock("orders")
    fair = locks.fair_lock("queue")
    read = locks.rw_lock("config").read()
    sem = locks.semaphore("pool", limit=3)
    await lock.acquire()
    await fair.acquire()
    await read.acquire()
    permit = await sem.acquire()

    async def wait_in_queue() -> None:
        async with fair:
            pass

    waiter = asyncio.create_task(wait_in_queue())
    try:
        queue = f"{locks.prefix}:fair:{{queue}}:queue"

        async def queued() -> bool:
            return bool(await admin.zcard(queue) == 1)

        await eventually(queued, what="the fair lock's waiter in its queue")
        yield
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        # a test may have force-released some of them: those releases report the loss
        for release in (permit.release, read.release, fair.release, lock.release):
            with contextlib.suppress(aiolock.LockNotOwnedError):
                await release()


async def contended(url: str, prefix: str, name: str, **options: Any) -> None:
    """Let another manager find the lock *name* busy: since issue 21 the lock publishes a
    release only when an attempt found its hold busy (its waiter flag)."""
    async with aiolock.LockManager.from_url(url, prefix=prefix, **options) as other:
        assert not await other.lock(name).try_acquire()


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects}


async def test_list_json_names_every_kind_with_holders_and_waiters(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    async with holding(locks, admin):
        result = await run_cli(redis_url, prefix, "--json", "list")
    assert result.code == 0, result.err
    objects = json.loads(result.out)
    assert [(o["kind"], o["name"]) for o in objects] == [
        ("rw", "config"),
        ("lock", "orders"),
        ("semaphore", "pool"),
        ("fair", "queue"),
    ]
    kinds = by_kind(objects)
    assert [h["count"] for h in kinds["lock"]["holders"]] == [1]
    assert kinds["lock"]["holders"][0]["owner"].startswith(locks._keyspace.manager_id)
    assert kinds["lock"]["waiters"] == 0
    assert 0 < kinds["lock"]["ttl"] <= 30
    assert len(kinds["fair"]["holders"]) == 1
    assert kinds["fair"]["waiters"] == 1
    assert [h["role"] for h in kinds["rw"]["holders"]] == ["reader"]
    assert kinds["rw"]["waiters"] == 0
    assert kinds["semaphore"]["limit"] == 3
    assert kinds["semaphore"]["held"] == 1
    assert [h["count"] for h in kinds["semaphore"]["holders"]] == [1]
    # the manager's hub listens on the channel of the lock its waiter waits for
    assert kinds["fair"]["listeners"] >= 1


async def test_show_json_and_the_tables(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    async with holding(locks, admin):
        show = await run_cli(redis_url, prefix, "--json", "show", "queue")
        table = await run_cli(redis_url, prefix, "list")
        detail = await run_cli(redis_url, prefix, "show", "pool")
    assert show.code == 0, show.err
    document = json.loads(show.out)
    assert document["name"] == "queue"
    (fair,) = document["objects"]
    assert fair["kind"] == "fair"
    assert len(fair["holders"]) == 1
    assert fair["waiters"] == 1
    assert len(fair["waiting"]) == 1

    assert table.code == 0, table.err
    header, *rows = table.out.splitlines()
    assert header.split() == ["KIND", "NAME", "HOLDERS", "TTL", "WAITERS", "WAITING", "LISTENERS"]
    for label, name in [("lock", "orders"), ("fair lock", "queue"), ("rw lock", "config"),
                        ("semaphore", "pool")]:  # fmt: skip
        assert any(row.startswith(label) and f" {name} " in row for row in rows), table.out

    assert detail.code == 0, detail.err
    assert "semaphore 'pool'" in detail.out
    assert "limit:      3" in detail.out


async def test_show_says_the_fence_is_the_last_token_released_and_a_holders_is_newer(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    """Issue 37: the label said "released or issued" while a holder held a newer token."""
    fair = locks.fair_lock("labelled")
    async with fair:
        released = fair.fencing_token
    async with fair:
        held = fair.fencing_token
        shown = await run_cli(redis_url, prefix, "show", "labelled")
    assert shown.code == 0, shown.err
    assert f"fence:      {released} (the last token released; the holders' tokens are newer)" in (
        shown.out
    ), shown.out
    assert held is not None and released is not None and held > released


async def test_show_of_an_unknown_name_says_so(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    result = await run_cli(redis_url, prefix, "show", "nothing")
    assert result.code == 1
    assert "no lock object named 'nothing'" in result.out
    listed = await run_cli(redis_url, prefix, "--json", "list")
    assert json.loads(listed.out) == []


async def test_force_release_asks_first_and_then_frees_the_lock(
    redis_url: str, prefix: str, redis: Redis
) -> None:
    # (a lease long enough that a loaded machine's late renewal cannot lose the lock while
    # the CLI children run; the renewal, every lease/3, finds the force-release)
    async with aiolock.LockManager(redis, prefix=prefix, lease=3) as locks:
        lock = locks.lock("orders")
        entered = asyncio.Event()

        async def hold() -> None:
            async with lock:
                entered.set()
                await asyncio.sleep(60)

        holder = asyncio.create_task(hold())
        await within(entered.wait(), what="the holder to take the lock")

        refused = await run_cli(redis_url, prefix, "force-release", "orders", stdin="n\n")
        assert refused.code == 1
        assert "Force-release lock 'orders'" in refused.out
        assert "[y/N]" in refused.out
        assert await lock.locked()
        assert not holder.done()

        done = await run_cli(redis_url, prefix, "force-release", "orders", "--yes")
        assert done.code == 0, done.err
        assert "released lock 'orders'" in done.out
        with pytest.raises(aiolock.LockLostError):
            await within(holder, what="the holder to find its lock force-released")
        assert not await lock.locked()


async def test_force_release_of_each_kind(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    async with holding(locks, admin):
        for kind, name in [("fair", "queue"), ("rw", "config"), ("semaphore", "pool")]:
            result = await run_cli(
                redis_url, prefix, "force-release", name, "--kind", kind, "--yes"
            )
            assert result.code == 0, result.err
            assert "released" in result.out
        after = json.loads((await run_cli(redis_url, prefix, "--json", "list")).out)
        held = {o["kind"]: o for o in after if o["holders"]}
        # the fair lock went to its waiter, which left; only the plain lock is still ours
        assert set(held) <= {"lock", "fair"}
        assert "lock" in held
        assert await locks.semaphore("pool", 3).available() == 3


async def start_watch(
    admin: Redis, url: str, prefix: str, *options: str, program: tuple[str, ...] = ("-m", "aiolock")
) -> asyncio.subprocess.Process:
    """``aiolock watch`` as a process, once it has subscribed (killed if it never does)."""
    before = await admin.pubsub_numpat()
    # (the options go after the command: the CLI takes them on either side)
    process = await asyncio.create_subprocess_exec(
        sys.executable, *program, "--url", url, "--prefix", prefix, "watch", "--no-local",
        *options,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + CHILD_TIMEOUT
    while time.monotonic() < deadline:
        if await admin.pubsub_numpat() > before:
            return process
        await asyncio.sleep(0.02)
    process.kill()
    await process.wait()
    pytest.fail(f"watch did not subscribe within {CHILD_TIMEOUT} s")


async def test_watch_prints_release_messages(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    process = await start_watch(
        admin, redis_url, prefix, "--json", "--count", "2", "--duration", "20"
    )
    try:
        async with locks.lock("orders"):
            await contended(redis_url, prefix, "orders")  # an uncontended one is not heard
        async with locks.semaphore("pool", 2):
            pass
        out, err = await asyncio.wait_for(process.communicate(), CHILD_TIMEOUT)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    events = [json.loads(line) for line in out.decode().splitlines()]
    assert [(e["kind"], e["name"]) for e in events] == [("lock", "orders"), ("semaphore", "pool")]
    assert all(e["message"] == locks._keyspace.manager_id for e in events)


async def test_unreachable_redis_is_one_line_and_exit_2(prefix: str) -> None:
    with closed_port() as port:
        url = f"redis://127.0.0.1:{port}/0"
        result = await run_cli(url, prefix, "list")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"aiolock: cannot reach redis at {url}: ")
    assert "Traceback" not in result.err


async def test_a_url_that_is_not_redis_is_exit_2(prefix: str) -> None:
    result = await run_cli("http://127.0.0.1:1/", prefix, "list")
    assert result.code == 2
    assert result.err.startswith("aiolock: cannot reach redis at http://127.0.0.1:1/: ")
    assert "Traceback" not in result.err


def test_parse_key_reads_the_hash_tag_rule() -> None:
    assert parse_key("P", "P:lock:{order:42}") == ("lock", "order:42", "")
    assert parse_key("P", "P:lock:{~}x}") == ("lock", "}x", "")
    assert parse_key("P", "P:lock:{~~a}:released") == ("lock", "~a", ":released")
    assert parse_key("P", "P:fair:{{}}:queue") == ("fair", "{}", ":queue")
    assert parse_key("P", "P:sem:{a}b}:limit") == ("semaphore", "a}b", ":limit")
    assert parse_key("P", "P:other:{x}") is None
    assert parse_key("P", "Q:lock:{x}") is None
    # The layout before issue 18 (no tag for the lock) is not aiolock's any more.
    assert parse_key("P", "P:{x}") is None
    # A key of the prefix "P:sem" is not one of "P" (issue 18: they used to share keys).
    assert parse_key("P", "P:sem:lock:{x}") is None
    assert parse_key("P:sem", "P:sem:lock:{x}") == ("lock", "x", "")
    assert parse_key("P", "P:sem:{x}") == ("semaphore", "x", "")


# -- issue 20: options after the command, errors, passwords, Ctrl-C, hints, batches -------


async def test_global_options_after_the_command(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    async with locks.lock("orders"):
        after = await run_raw("list", "--url", redis_url, "--prefix", prefix, "--json")
        before = await run_raw("--url", redis_url, "--prefix", prefix, "--json", "list")
        mixed = await run_raw("--url", redis_url, "show", "orders", "--prefix", prefix)
    assert after.code == 0, after.err
    assert [o["name"] for o in json.loads(after.out)] == ["orders"]
    assert before.code == 0, before.err
    assert [o["name"] for o in json.loads(before.out)] == ["orders"]
    assert mixed.code == 0, mixed.err
    assert "lock 'orders'" in mixed.out


PASSWORD = "s3cret-Pw-20"


@pytest.fixture(scope="module")
def locked_server() -> Iterator[RedisServer]:
    """A private server that requires a password (stopped by pid)."""
    with RedisServer(extra_args=["--requirepass", PASSWORD], password=PASSWORD) as server:
        yield server


async def test_passwords_are_never_printed(locked_server: RedisServer, prefix: str) -> None:
    port = locked_server.port
    wrong = "Wr0ng-pass-20"
    with closed_port() as dead:
        cases = [
            (f"redis://:{wrong}@127.0.0.1:{port}/0", wrong, 3),  # refused by the server
            (f"redis://default:{wrong}@127.0.0.1:{port}/0", wrong, 3),
            (f"redis://127.0.0.1:{port}/0?password={wrong}", wrong, 3),
            (f"redis://:{PASSWORD}@127.0.0.1:{dead}/0", PASSWORD, 2),  # nobody there
        ]
        for url, secret, code in cases:
            for args in (["list"], ["show", "x"], ["force-release", "x", "--yes"]):
                result = await run_raw("--url", url, "--prefix", prefix, *args)
                assert result.code == code, (url, args, result)
                assert secret not in result.err + result.out, (url, args, result)
                assert "Traceback" not in result.err
                assert result.err.startswith("aiolock: "), result.err
                assert "***" in result.err, result.err


async def test_an_empty_prefix_hints_at_the_prefixes_in_use(
    locked_server: RedisServer, prefix: str
) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{locked_server.port}/0"
    redis = Redis.from_url(url)
    try:
        async with aiolock.LockManager(redis, prefix=prefix) as locks, locks.lock("orders"):
            table = await run_raw("--url", url, "--prefix", "typo", "list")
            as_json = await run_raw("--url", url, "--prefix", "typo", "--json", "list")
            right = await run_raw("--url", url, "--prefix", prefix, "list")
    finally:
        await redis.aclose()
    assert table.code == 0, table.err
    assert "no locks" in table.out
    assert f"aiolock keys exist under {prefix!r}" in table.out
    # the JSON document stays valid: the hint goes to stderr
    assert json.loads(as_json.out) == []
    assert f"{prefix!r}" in as_json.err
    assert "exist under" not in right.out


async def interrupt_watch(process: asyncio.subprocess.Process, limit: float, when: str) -> None:
    """Ctrl-C *process* (a started watch): it must end within *limit* s, cleanly (exit 0
    or 130, nothing on stderr); killed if it does not."""
    try:
        process.send_signal(signal.SIGINT)
        try:
            _out, err = await asyncio.wait_for(process.communicate(), limit)
        except asyncio.TimeoutError:
            pytest.fail(f"watch ran on for {limit:g} s after a Ctrl-C {when}")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode in (0, 130), err.decode()
    assert err.decode() == ""


async def test_ctrl_c_ends_watch_cleanly(redis_url: str, prefix: str, admin: Redis) -> None:
    process = await start_watch(admin, redis_url, prefix)
    await interrupt_watch(process, CHILD_TIMEOUT, "once it had subscribed")


#: ``aiolock`` with two changes that make a rare interleaving certain: the watch stalls
#: for a second right after its subscription (a Ctrl-C lands there), and its reads
#: swallow a cancellation, as redis-py's ``get_message()`` can
_STALLED_WATCH = """
import asyncio, importlib, sys, time
cli = importlib.import_module("aiolock._cli.main")
watch = importlib.import_module("aiolock._cli.watch")
subscribe, get = watch._PatternWatch.subscribe, watch._PatternWatch.get
async def stalled(self, pattern):
    await subscribe(self, pattern)
    time.sleep(1.0)
async def swallowing(self, timeout):
    try:
        return await get(self, timeout)
    except asyncio.CancelledError:
        return None
watch._PatternWatch.subscribe, watch._PatternWatch.get = stalled, swallowing
sys.exit(cli.main(sys.argv[1:]))
"""


async def test_ctrl_c_right_after_the_subscription_ends_watch(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    """Issue 25: a Ctrl-C that came once the subscription was visible but before the watch
    took SIGINT itself went to asyncio.run's handler, whose cancellation the first read
    could swallow: the watch then ran on (a CI run saw it outlive the test's 30 s). The
    watch takes SIGINT before it subscribes, and a swallowed cancellation ends it too."""
    process = await start_watch(admin, redis_url, prefix, program=("-c", _STALLED_WATCH))
    # (sent inside the stall after the subscription)
    await interrupt_watch(process, 10.0, "that came right after its subscription")


async def test_watch_tells_a_fair_grant_from_a_release(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    process = await start_watch(
        admin, redis_url, prefix, "--json", "--count", "2", "--duration", "20"
    )
    try:
        fair = locks.fair_lock("queue")
        await fair.acquire()
        queued = asyncio.Event()

        async def wait_in_queue() -> None:
            queued.set()
            async with locks.fair_lock("queue"):
                pass

        waiter = asyncio.create_task(wait_in_queue())
        await queued.wait()

        async def in_queue() -> bool:
            return bool(await admin.zcard(f"{prefix}:fair:{{queue}}:queue") == 1)

        await eventually(in_queue, what="the waiter in the fair lock's queue")
        await fair.release()  # handed to the waiter: a grant
        await within(waiter, what="the waiter to be granted the fair lock")
        async with locks.lock("orders"):
            await contended(redis_url, prefix, "orders")
        out, err = await asyncio.wait_for(process.communicate(), CHILD_TIMEOUT)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    events = [json.loads(line) for line in out.decode().splitlines()]
    assert [(e["kind"], e["event"]) for e in events] == [("fair", "granted"), ("lock", "released")]


class CountingRedis(Redis):
    """Counts the commands sent one by one (a pipeline is one ``execute``)."""

    single = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        CountingRedis.single += 1
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


async def test_list_reads_a_batch_of_objects_in_one_pipeline(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    held = [locks.lock(f"l{i}") for i in range(40)]
    for lock in held:
        await lock.acquire()
    permits = [await locks.semaphore(f"s{i}", limit=2).acquire() for i in range(40)]
    counting = CountingRedis.from_url(redis_url)
    try:
        CountingRedis.single = 0
        infos = await scan(counting, prefix)
        single = CountingRedis.single
    finally:
        await counting.aclose()
        for lock in held:
            await lock.release()
        for permit in permits:
            await permit.release()
    assert len(infos) == 80
    assert all(info.holders for info in infos)
    # SCAN pages and one MGET: not one round trip (or eight) per object
    assert single <= 10, single  # 482 before issue 20 (80 objects), 2 after


async def test_an_error_reply_is_one_line_and_exit_3(
    locked_server: RedisServer, prefix: str
) -> None:
    admin = Redis.from_url(f"redis://:{PASSWORD}@127.0.0.1:{locked_server.port}/0")
    user = f"ro-{prefix}"
    try:
        # a user that may connect but not SCAN: the server answers NOPERM
        await admin.acl_setuser(user, enabled=True, passwords=["+u-pass-20"],
                                keys=["*"], commands=["-@all", "+ping", "+hello"])  # fmt: skip
        url = f"redis://{user}:u-pass-20@127.0.0.1:{locked_server.port}/0"
        result = await run_raw("--url", url, "--prefix", prefix, "list")
    finally:
        await admin.acl_deluser(user)
        await admin.aclose()
    assert result.code == 3, result
    (line,) = result.err.splitlines()
    assert line.startswith(f"aiolock: redis at redis://{user}:***@127.0.0.1:"), line
    assert "NoPermissionError" in line and "u-pass-20" not in line, line
