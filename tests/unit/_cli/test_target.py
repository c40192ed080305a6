"""The ``aiolock`` command on a real 3-primary Redis Cluster, run as a process.

The cluster (:class:`aiolock.testing_cluster.LocalCluster`, no replicas: the command only
reads primaries) is started once for the module on free loopback ports and stopped by
pid. Locks are held on every primary by a cluster manager of this test; the command is
pointed at one node and must find, show and free the locks the others own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio.client import PubSub
from redis.crc import key_slot

import aiolock
from aiolock.testing_cluster import LocalCluster
from tests._support.helpers import eventually
from tests.unit._cli.test_main import CHILD_TIMEOUT, run_cli

pytestmark = pytest.mark.skipif(
    not hasattr(PubSub, "ssubscribe"),
    reason="Redis Cluster support needs redis-py >= 8.0.1 (asyncio sharded pub/sub)",
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(primaries=3, replicas=0) as running:
        yield running


@pytest.fixture
def prefix() -> str:
    return f"cc-{uuid.uuid4().hex[:10]}"


def names_by_primary(cluster: LocalCluster, stem: str) -> dict[int, str]:
    """One lock name per primary port: the name (its hash tag) hashes to a slot there."""
    found: dict[int, str] = {}
    for i in range(10_000):
        name = f"{stem}{i}"
        found.setdefault(cluster.owner_port(key_slot(name.encode())), name)
        if len(found) == cluster.primaries:
            return found
    raise AssertionError("no names found on every primary")


@contextlib.asynccontextmanager
async def held_on_every_primary(
    cluster: LocalCluster, prefix: str
) -> AsyncIterator[tuple[aiolock.LockManager, dict[int, str]]]:
    names = names_by_primary(cluster, "job-")
    async with aiolock.LockManager.from_url(
        cluster.url, cluster=True, prefix=prefix, name="cluster-cli-test"
    ) as locks:
        held = [locks.lock(name) for name in names.values()]
        for lock in held:
            await lock.acquire()
        # a semaphore permit under each name too: its lease ends live in a zset
        permits = [await locks.semaphore(name, limit=2).acquire() for name in names.values()]
        try:
            yield locks, names
        finally:
            for permit in permits:
                with contextlib.suppress(aiolock.LockNotOwnedError):
                    await permit.release()
            for lock in held:
                with contextlib.suppress(aiolock.LockNotOwnedError):
                    await lock.release()


def _lock_of(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if (o["kind"], o["name"]) == ("lock", name)]
    return found


def node_url(port: int) -> str:
    return f"redis://127.0.0.1:{port}"


async def test_list_finds_the_locks_of_every_primary(cluster: LocalCluster, prefix: str) -> None:
    async with held_on_every_primary(cluster, prefix) as (locks, names):
        url_port, other_port, _ = names
        waiting_for = names[other_port]
        entered = asyncio.Event()

        async def wait() -> None:
            entered.set()
            async with locks.lock(waiting_for):
                pass

        waiter = asyncio.create_task(wait())  # another task: it waits for the lock
        await entered.wait()
        # each held lock's channel (its holder listens for a release it did not make;
        # the waited-for lock's waiter shares its manager's subscription)
        await eventually(
            lambda: locks.statistics().hub.subscriptions == len(names), what="SSUBSCRIBE"
        )
        listed = await run_cli(node_url(url_port), prefix, "--json", "list")
        table = await run_cli(node_url(url_port), prefix, "list")
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
    assert listed.code == 0, listed.err
    objects = json.loads(listed.out)
    assert [(o["name"], o["kind"]) for o in objects] == [
        (name, kind) for name in sorted(names.values()) for kind in ("lock", "semaphore")
    ]
    for obj in objects:
        if obj["kind"] == "semaphore":
            assert (obj["held"], obj["limit"]) == (1, 2)
        # listeners are counted with PUBSUB SHARDNUMSUB on the name's node: the holder's
        # manager listens on each lock's channel (a semaphore's permits are not listened for)
        assert obj["listeners"] == (1 if obj["kind"] == "lock" else 0)
        (holder,) = obj["holders"]
        # the identity records live in other slots than the locks: read through the cluster
        assert holder["name"] == "cluster-cli-test"
        assert holder["pid"] is not None
        assert 0 < holder["lease_left"] <= 30
    assert table.code == 0, table.err
    for name in names.values():
        assert f" {name} " in table.out, table.out


async def test_show_and_force_release_of_a_name_on_another_node(
    cluster: LocalCluster, prefix: str
) -> None:
    async with held_on_every_primary(cluster, prefix) as (locks, names):
        url_port, *others = names
        elsewhere = names[others[0]]
        url = node_url(url_port)
        shown = await run_cli(url, prefix, "--json", "show", elsewhere)
        assert shown.code == 0, shown.err
        lock, sem = json.loads(shown.out)["objects"]
        assert (lock["kind"], lock["name"]) == ("lock", elsewhere)
        assert [h["name"] for h in lock["holders"]] == ["cluster-cli-test"]
        assert sem["kind"] == "semaphore"
        assert 0 < sem["holders"][0]["lease_left"] <= 30

        freed = await run_cli(url, prefix, "force-release", elsewhere, "--kind", "lock", "--yes")
        assert freed.code == 0, freed.err
        assert f"released lock '{elsewhere}'" in freed.out
        assert not await locks.lock(elsewhere).locked()
        # the others are still held
        for port in (url_port, others[1]):
            assert await locks.lock(names[port]).locked()
        gone = await run_cli(url, prefix, "--json", "show", elsewhere)
        assert [o["kind"] for o in json.loads(gone.out)["objects"]] == ["semaphore"]


def shard_listeners(cluster: LocalCluster, channel: str) -> int:
    """PUBSUB SHARDNUMSUB of *channel* on the primary that owns its slot."""
    with cluster.node(cluster.owner_port(key_slot(channel.encode()))) as node:
        reply = node.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1])


async def test_watch_on_a_cluster_prints_the_releases_of_every_primary(
    cluster: LocalCluster, prefix: str
) -> None:
    fresh = names_by_primary(cluster, "later-")
    async with aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix) as locks:
        held = {port: locks.lock(name) for port, name in names_by_primary(cluster, "w-").items()}
        for lock in held.values():
            await lock.acquire()
        url_port = next(iter(held))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aiolock", "--url", node_url(url_port), "--prefix", prefix,
            "--json", "watch", "--no-local", "--count", "4", "--duration", "60",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            channels = [f"{lock.key}:released" for lock in held.values()]
            # subscribed on the node owning each name's slot: by watch, and by the holder's
            # manager, which listens for a release it did not make
            heed = locks._open_engine().heed
            await eventually(lambda: heed.listened == len(held), what="the holder listening")
            await eventually(
                lambda: all(shard_listeners(cluster, c) == 2 for c in channels), what="ssubscribe"
            )
            # since issue 21 a lock publishes only a release its waiter flag asks for
            async with aiolock.LockManager.from_url(
                cluster.url, cluster=True, prefix=prefix
            ) as other:
                for lock in held.values():
                    assert not await other.lock(lock.name).try_acquire()
            for lock in held.values():
                await lock.release()
            # an object that did not exist when watch started: found by a later scan
            name = next(iter(fresh.values()))
            late = locks.lock(name)
            await late.acquire()
            channel = f"{late.key}:released"
            await eventually(lambda: heed.listened == len(held) + 1, what="the holder listening")
            await eventually(lambda: shard_listeners(cluster, channel) == 2, what=channel)
            async with aiolock.LockManager.from_url(
                cluster.url, cluster=True, prefix=prefix
            ) as other:
                assert not await other.lock(name).try_acquire()
            await late.release()
            out, err = await asyncio.wait_for(process.communicate(), CHILD_TIMEOUT)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0, err.decode()
        events = [json.loads(line) for line in out.decode().splitlines()]
        expected = [("lock", lock.name, "released") for lock in held.values()]
        expected.append(("lock", name, "released"))
        # the nodes' messages are read in turn: the order across nodes is not kept
        assert sorted((e["kind"], e["name"], e["event"]) for e in events) == sorted(expected)
        assert all(e["message"] == locks._keyspace.manager_id for e in events)


async def test_an_error_on_a_cluster_is_one_line(cluster: LocalCluster, prefix: str) -> None:
    # a key of the lock's name that is not a hash: the force release refuses it
    port, name = next(iter(names_by_primary(cluster, "wrong-").items()))
    with cluster.node(port) as node:
        node.set(f"{prefix}:lock:{{{name}}}", "not a hash")
    other = next(p for p in cluster.primary_ports() if p != port)
    result = await run_cli(node_url(other), prefix, "force-release", name, "--yes")
    assert result.code == 3, result
    (line,) = result.err.splitlines()
    assert line.startswith("aiolock: ") and "holds a string" in line, line


async def test_show_names_the_listening_managers_on_the_names_node(
    cluster: LocalCluster, prefix: str
) -> None:
    async with held_on_every_primary(cluster, prefix) as (locks, names):
        url_port, other_port, _ = names
        waiting_for = names[other_port]
        listeners_key = f"{prefix}:lock:{{{waiting_for}}}:listeners"
        entered = asyncio.Event()

        async def wait() -> None:
            entered.set()
            async with locks.lock(waiting_for):
                pass

        waiter = asyncio.create_task(wait())
        await entered.wait()
        client = locks.redis

        async def registered() -> bool:
            return bool(await client.zcard(listeners_key))

        await eventually(registered, what="the waiting manager registered as a listener")
        shown = await run_cli(node_url(url_port), prefix, "--json", "show", waiting_for)
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
    assert shown.code == 0, shown.err
    (lock,) = [o for o in json.loads(shown.out)["objects"] if o["kind"] == "lock"]
    (who,) = lock["listening"]
    assert who["manager"] == locks.id and who["name"] == "cluster-cli-test"
    assert lock["listeners"] == 1  # PUBSUB SHARDNUMSUB on the name's primary


async def test_top_on_a_cluster_reads_the_summaries_of_every_primary(
    cluster: LocalCluster, prefix: str
) -> None:
    """Two managers whose summaries live on whichever primary their ids hash to, waiting
    for names on every primary: ``top`` finds them all, holders named."""
    names = names_by_primary(cluster, "hot-")
    async with (
        aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix, name="a") as one,
        aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix, name="b") as two,
    ):
        held = [one.lock(name) for name in names.values()]
        for lock in held:
            await lock.acquire()
        waiting = [asyncio.create_task(two.lock(name).acquire()) for name in names.values()]
        await asyncio.sleep(1.5)  # each summary is written within a second of a change
        result = await run_cli(node_url(next(iter(names))), prefix, "top", "--json", "--once")
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for lock in held:
            await lock.release()
    assert result.code == 0, result.err
    rows = {row["name"]: row for row in json.loads(result.out)["names"]}
    assert set(rows) == set(names.values())
    for row in rows.values():
        assert row["waiting"] == 1 and [w["who"].split("@")[0] for w in row["waiters"]] == ["b"]
        assert [h["who"].split("@")[0] for h in row["holders"]] == ["a"]
