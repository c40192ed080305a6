"""A RedlockManager's identity record (issue 20, item 1), and the CLI resolving its holders.

Like a LockManager, a RedlockManager keeps ``P:mgr:{<id>}`` while open, here on every
master: written at open, refreshed every ``lease / 3``, deleted at close, none with
``identity=False``. The ``aiolock`` command pointed at a master lists the Redlock's key
there and resolves its holder (the token ``<manager id>:<n>``) to the record.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock import LockManager, RedlockManager
from aiolock._keys import LAYOUT
from aiolock.testing import RedisServer
from tests._support.helpers import eventually
from tests._support.redlock import redlock, started
from tests.unit._cli.test_main import run_cli
from tests.unit._redis.test_identity import MAX_RECORD_BYTES
from tests.unit._redis.test_layout import manager_of_layout


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    with started(3) as servers:
        yield servers


@pytest.fixture
def prefix() -> str:
    return f"rli-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def clients(servers: list[RedisServer]) -> AsyncIterator[list[Redis]]:
    made = [Redis.from_url(server.url) for server in servers]
    try:
        yield made
    finally:
        for client in made:
            await client.aclose()


def key_of(manager: RedlockManager) -> str:
    return f"{manager.prefix}:mgr:{{{manager.id}}}"


async def test_the_record_is_on_every_master_while_open(
    servers: list[RedisServer], clients: list[Redis], prefix: str
) -> None:
    # node_timeout 3 s (below a third of the lease), not the module's 0.1 s: open()
    # writes the record on the masters that answer within it, and on a loaded machine one
    # may take longer than 0.1 s (the next round, a third of the lease later, would write
    # it there: not what this checks)
    async with redlock(servers, prefix, lease=10, name="billing-worker", node_timeout=3) as manager:
        key = key_of(manager)
        # written by open() itself: there once it returns, on every master that answers
        raws = [await client.get(key) for client in clients]
        ttls = [await client.pttl(key) for client in clients]
        sizes = [await client.memory_usage(key) for client in clients]
    assert manager.name == "billing-worker" and len(manager.id) == 32
    for raw in raws:
        assert raw is not None
        record = json.loads(raw)
        assert record["h"] == socket.gethostname()
        assert record["p"] == os.getpid()
        assert record["n"] == "billing-worker"
        assert record["v"] == aiolock.__version__
    assert all(0 < ttl <= 10_000 for ttl in ttls), ttls
    assert all(size is not None and size <= MAX_RECORD_BYTES for size in sizes), sizes
    print(f"redlock identity record: {sizes[0]} bytes (MEMORY USAGE) per master")
    # deleted at close, from every master
    assert [await client.exists(key) for client in clients] == [0, 0, 0]


async def test_the_record_is_kept_beyond_its_lease(
    servers: list[RedisServer], clients: list[Redis], prefix: str
) -> None:
    # Written with PX = one lease and refreshed every third of it: after two leases it
    # exists only if it was refreshed. 3 s: a refresh round may be two seconds late before
    # the record lapses (with 1.5 s, two CI runs beside a spinning core made one a whole
    # lease late on two masters). A master that does not answer the write at open within
    # node_timeout gets it at the next round (docs/redlock.md), so the check starts once
    # every master has it (two CI runs at once made the writes at open miss 0.1 s on two
    # masters); node_timeout 0.5 s, so that a loaded machine's round rarely misses it.
    async with redlock(servers, prefix, lease=3.0, node_timeout=0.5) as manager:
        key = key_of(manager)

        async def everywhere() -> bool:
            return [await client.exists(key) for client in clients] == [1, 1, 1]

        await eventually(everywhere, what="the record on every master")
        started = time.monotonic()
        while time.monotonic() - started < 6.5:
            assert [await client.exists(key) for client in clients] == [1, 1, 1]
            await asyncio.sleep(0.1)


async def test_identity_false_writes_no_record_and_options_are_checked(
    servers: list[RedisServer], clients: list[Redis], prefix: str
) -> None:
    async with redlock(servers, prefix, identity=False) as manager, manager.lock("quiet"):
        for client in clients:
            assert await client.exists(key_of(manager)) == 0
    with pytest.raises(TypeError, match="identity must be True or False"):
        LockManager.redlock(clients, identity=1)
    with pytest.raises(ValueError, match="1 to 64 printable characters"):
        LockManager.redlock(clients, name="")
    with pytest.raises(TypeError, match="name must be a str or None"):
        LockManager.redlock(clients, name=42)


async def test_a_master_down_at_open_gets_the_record_once_it_answers(
    servers: list[RedisServer], clients: list[Redis], prefix: str
) -> None:
    pid = servers[2].pid
    assert pid
    os.kill(pid, signal.SIGSTOP)  # accepts connections, answers nothing
    try:
        started = time.monotonic()
        async with redlock(servers, prefix, lease=0.9) as manager:
            opened_in = time.monotonic() - started
            key = key_of(manager)

            # open() writes the record on the masters that answer within node_timeout
            # (0.1 s); on a loaded machine one of the two running masters may answer
            # later and get it at the next round, a third of the lease later (a
            # fresh-clone CI run, stop 32, found it missing on master 0 right after open)
            async def on_the_first_two() -> bool:
                return all([await client.exists(key) for client in clients[:2]])

            await eventually(on_the_first_two, timeout=10, what="the record on masters 0, 1")
            os.kill(pid, signal.SIGCONT)

            async def on_the_third() -> bool:
                return bool(await clients[2].exists(key))

            await eventually(on_the_third, timeout=10, what="the record on the resumed master")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert opened_in < 5, opened_in  # bounded by node_timeout, not held up by the master


async def test_the_cli_resolves_a_redlock_holder_on_a_master(
    servers: list[RedisServer], clients: list[Redis], prefix: str
) -> None:
    async with redlock(servers, prefix, lease=20, name="ledger") as manager, manager.lock("books"):
        # open() writes the record on the masters that answer within node_timeout (0.1 s
        # here); on a loaded machine one may answer later and get it at the next round
        # (a fresh-clone CI run listed the holder without its host): wait for both.
        async def recorded() -> bool:
            return all([await client.exists(key_of(manager)) for client in clients[:2]])

        await eventually(recorded, timeout=30, what="the identity record on masters 0 and 1")
        listed = await run_cli(servers[1].url, prefix, "--json", "list")
        shown = await run_cli(servers[0].url, prefix, "show", "books")
        refused = await run_cli(servers[0].url, prefix, "force-release", "books", "--yes")
        still = await manager.lock("books").owned()
    assert listed.code == 0, listed.err
    (obj,) = json.loads(listed.out)
    assert (obj["kind"], obj["name"]) == ("redlock", "books")
    assert obj["key"] == f"{prefix}:redlock:{{books}}"
    (holder,) = obj["holders"]
    assert holder["manager"] == manager.id and holder["owner"].startswith(f"{manager.id}:")
    assert holder["host"] == socket.gethostname()
    assert holder["pid"] == os.getpid()
    assert holder["name"] == "ledger"
    assert 0 < holder["lease_left"] <= 20
    assert shown.code == 0, shown.err
    assert shown.out.startswith("redlock 'books'")
    assert f"ledger@{socket.gethostname()} pid {os.getpid()}" in shown.out
    assert refused.code == 1 and "Redlock" in refused.err
    assert still  # force-release left it alone


async def test_a_manager_of_another_layout_on_one_master_keeps_it_from_opening(
    servers: list[RedisServer], clients: list[Redis], prefix: str
) -> None:
    """The layout check (issue 36) reads every master: a manager of a newer layout on one
    of them is enough to refuse, and the refused manager's records leave every master."""
    async with manager_of_layout(clients[1], prefix, LAYOUT + 1, name="newer-build"):
        # node_timeout 3 s: each master must answer the check on a loaded machine
        with pytest.raises(aiolock.IncompatibleLayoutError) as caught:
            async with redlock(servers, prefix, node_timeout=3):
                raise AssertionError("opened beside a manager of another layout")
        for client in clients:
            found = [k async for k in client.scan_iter(match=f"{prefix}:mgr:*")]
            assert len(found) == (1 if client is clients[1] else 0), found
    message = str(caught.value)
    assert message.startswith("the RedlockManager could not open: newer-build@"), message
    assert f"announces layout {LAYOUT + 1}, newer than this build's" in message, message
    async with redlock(servers, prefix, node_timeout=3) as manager:  # the other one closed
        assert manager.is_open
