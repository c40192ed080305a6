"""@locks.locked / @locks.limited: a function run under a lock or permit named per call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

import aiolock


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


async def test_the_name_is_formatted_from_the_call(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    seen: list[bool] = []

    @locks.locked("order:{order_id}")
    async def ship(order_id: int, note: str = "") -> str:
        seen.append(await other.lock(f"order:{order_id}").locked())
        seen.append(await other.lock("order:8").locked())
        return f"shipped {order_id}{note}"

    assert await ship(7) == "shipped 7"
    assert await ship(order_id=7, note="!") == "shipped 7!"
    assert seen == [True, False, True, False]
    assert not await other.lock("order:7").locked()
    assert ship.__name__ == "ship"


async def test_skip_returns_none_without_running_and_raise_raises(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    ran: list[str] = []

    @locks.locked("job:{name}", on_busy="skip")
    async def skipping(name: str) -> str:
        ran.append(name)
        return name

    @locks.locked("job:{name}", on_busy="raise")
    async def raising(name: str) -> str:
        ran.append(name)
        return name

    @locks.locked("job:{name}", timeout=0.1)
    async def waiting(name: str) -> str:
        ran.append(name)
        return name

    holder = other.lock("job:a")
    await holder.acquire()
    assert await skipping("a") is None
    with pytest.raises(aiolock.LockTimeoutError):
        await raising("a")
    with pytest.raises(aiolock.LockTimeoutError):
        await waiting("a")
    assert ran == []
    assert await skipping("b") == "b"  # another name is free
    await holder.release()
    assert await raising("a") == "a"
    assert ran == ["b", "a"]


async def test_a_timeout_inside_the_body_is_not_taken_for_a_busy_lock(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    @locks.locked("inner-{n}", on_busy="skip")
    async def body(n: int) -> None:
        await other.lock("outer").acquire(timeout=0)

    holder = other.lock("outer")
    await holder.acquire()

    # Another task of the other manager holds "outer": the body's own LockTimeoutError
    # propagates; "skip" applies to the decorator's lock only.
    async def in_a_task() -> None:
        await body(1)

    with pytest.raises(aiolock.LockTimeoutError, match="outer"):
        await asyncio.create_task(in_a_task())
    await holder.release()


async def test_methods_and_attribute_fields(locks: aiolock.LockManager) -> None:
    @dataclass
    class Account:
        id: int

    class Bank:
        tenant = "acme"

        @locks.locked("{self.tenant}:acct:{account.id}")
        async def audit(self, account: Account) -> str:
            return f"audited {account.id}"

    assert await Bank().audit(Account(3)) == "audited 3"
    assert locks.statistics().acquired["lock"] == 1


async def test_every_kind_and_a_semaphore(locks: aiolock.LockManager) -> None:
    inside = 0
    most = 0

    @locks.limited("api:{region}", limit=2)
    async def call_api(region: str) -> None:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.02)
        inside -= 1

    await asyncio.gather(*(call_api("eu") for _ in range(6)))
    assert most == 2

    @locks.locked("doc:{d}", kind="read")
    async def read(d: int) -> int:
        return d

    @locks.locked("doc:{d}", kind="write")
    async def write(d: int) -> int:
        return d

    @locks.locked("printer:{p}", kind="fair")
    async def print_it(p: int) -> int:
        return p

    @locks.locked(["acct:{src}", "acct:{dst}"])
    async def transfer(src: int, dst: int) -> tuple[int, int]:
        return src, dst

    assert list(await asyncio.gather(read(1), read(1), write(1), print_it(2))) == [1, 1, 1, 2]
    assert await transfer(2, 1) == (2, 1)
    acquired = locks.statistics().acquired
    assert acquired["semaphore"] == 6
    assert (acquired["read lock"], acquired["write lock"], acquired["fair lock"]) == (2, 1, 1)
    assert acquired["lock"] == 2  # the multi-lock's two names


async def test_a_lost_lock_cancels_the_call(redis_url: str, prefix: str) -> None:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=0.6) as short:

        @short.locked("fragile")
        async def work() -> None:
            await short.lock("fragile").force_release()
            await asyncio.sleep(30)  # the loss, not the body's end, must end it

        with pytest.raises(aiolock.LockLostError):
            await work()


def test_mistakes_fail_when_decorating(locks: aiolock.LockManager) -> None:
    with pytest.raises(TypeError, match=r"'order_id'.*parameters are id"):

        @locks.locked("order:{order_id}")
        async def wrong(id: int) -> None: ...

    with pytest.raises(TypeError, match="async def"):

        @locks.locked("x")  # type: ignore[arg-type]
        def not_async() -> None: ...

    with pytest.raises(ValueError, match="positional"):
        locks.locked("order:{}")
    with pytest.raises(ValueError, match="on_busy"):
        locks.locked("x", on_busy="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind"):
        locks.locked("x", kind="semaphore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        locks.locked("x", timeout=-1)
    with pytest.raises(ValueError, match="limit"):
        locks.limited("x", limit=0)


async def test_names_that_format_alike_are_locked_once(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    # A transfer from an account to itself: the multi-lock used to refuse the call with
    # "list each name once", which the caller of transfer() cannot act on.
    @locks.locked(["acct:{src}", "acct:{dst}", "ledger"])
    async def transfer(src: int, dst: int) -> bool:
        return await other.lock("acct:5").locked()

    assert await transfer(5, 5) is True
    assert locks.statistics().acquired["lock"] == 2  # acct:5 and ledger, each once
    assert not await other.lock("acct:5").locked()


def test_a_field_nested_in_a_format_spec_is_refused_when_decorating(
    locks: aiolock.LockManager,
) -> None:
    with pytest.raises(ValueError, match=r"nests a field.*\{a:\{b\}\}"):
        locks.locked("x:{a:{b}}")
    with pytest.raises(ValueError, match="nests a field"):
        locks.limited("x:{a:>{width}}", limit=2)
    locks.locked("x:{a:>4}")  # a spec written out is fine
