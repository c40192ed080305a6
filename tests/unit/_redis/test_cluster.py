"""Redis Cluster: every kind on a real 3-primary, 3-replica cluster that this module starts.

The cluster (:class:`aiolock.testing_cluster.LocalCluster`) is started once for the module
on free loopback ports and stopped by pid. The tests that change the topology (a slot
migration, a primary failover) come last and leave the cluster serving all slots.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, NamedTuple

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

import aiolock
from aiolock._engine import listeners
from aiolock._engine.engine import Engine
from aiolock._formats.redisson.kind import RELEASE as REDISSON_RELEASE
from aiolock._keys import LAYOUT, identity_key, new_manager_id
from aiolock._kinds.lock.kind import RELEASE
from aiolock._redis.cluster import ClusterClient, sharded
from aiolock._redis.cluster_pubsub import ClusterSubscriptions
from aiolock._redis.identity import Identity
from aiolock.testing import free_port
from aiolock.testing_cluster import LocalCluster
from tests._support.helpers import PATIENCE, closed_port, eventually, unchanged_for, within
from tests.unit._engine.test_listeners import Listening, driven_clock

pytestmark = pytest.mark.skipif(
    not hasattr(PubSub, "ssubscribe"),
    reason="Redis Cluster support needs redis-py >= 8.0.1 (asyncio sharded pub/sub)",
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(primaries=3, replicas=1) as running:
        yield running


@pytest.fixture
def prefix() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


@contextlib.asynccontextmanager
async def two_managers(
    cluster: LocalCluster, prefix: str, **options: Any
) -> AsyncIterator[tuple[aiolock.LockManager, aiolock.LockManager]]:
    async with (
        aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix, **options) as a,
        aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix, **options) as b,
    ):
        yield a, b


def names_on_each_primary(cluster: LocalCluster, stem: str) -> list[str]:
    """One lock name per primary: its slot (the name is the hash tag) lives there."""
    found: dict[int, str] = {}
    for i in range(10_000):
        name = f"{stem}{i}"
        found.setdefault(cluster.owner_port(key_slot(name.encode())), name)
        if len(found) == cluster.primaries:
            return list(found.values())
    raise AssertionError("no names found on every primary")


class Migration(NamedTuple):
    """A slot's move from its owner to another primary, with both nodes' ids."""

    slot: int
    source: int
    target: int
    source_id: str
    target_id: str


def plan_migration(cluster: LocalCluster, slot: int) -> Migration:
    """Where *slot* moves to: the first primary that does not own it."""
    source = cluster.owner_port(slot)
    target = next(p for p in cluster.primary_ports() if p != source)
    return Migration(slot, source, target, cluster.node_id(source), cluster.node_id(target))


def evalsha_calls(cluster: LocalCluster) -> int:
    """EVALSHA calls over all nodes (INFO commandstats): what the managers sent."""
    total = 0
    for port in cluster.primary_ports():
        with cluster.node(port) as node:
            stats = node.info("commandstats")
        total += int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return total


# -- each kind, across two managers, on names owned by different primaries ---------------

Maker = Callable[[aiolock.LockManager, str], Any]
KINDS: dict[str, Maker] = {
    "lock": lambda m, n: m.lock(n),
    "fair_lock": lambda m, n: m.fair_lock(n),
    "rw_write": lambda m, n: m.rw_lock(n).write(),
    "rw_read_blocks_write": lambda m, n: m.rw_lock(n).read(),
    "semaphore": lambda m, n: m.semaphore(n, 1),
}


@pytest.mark.parametrize("kind", list(KINDS))
async def test_each_kind_excludes_and_wakes_by_sharded_pubsub(
    cluster: LocalCluster, prefix: str, kind: str
) -> None:
    make = KINDS[kind]
    # the waiter of a read hold is a writer (readers share)
    waiter_make: Maker = (lambda m, n: m.rw_lock(n).write()) if kind.startswith("rw_read") else make
    tasks: list[asyncio.Task[float]] = []
    async with two_managers(cluster, prefix) as (a, b):
        for i, name in enumerate(names_on_each_primary(cluster, f"{kind}-")):
            entered = asyncio.Event()

            async def waiter(n: str = name, entered: asyncio.Event = entered) -> float:
                entered.set()
                async with waiter_make(b, n):
                    return time.monotonic()

            async with make(a, name):
                task = asyncio.create_task(waiter())
                tasks.append(task)
                await entered.wait()
                await eventually(lambda: b.statistics().hub.subscriptions == 1, what="SSUBSCRIBE")
                if i == 0:  # once per kind (it takes time)
                    # The retry after the confirmation: waited out, not slept on.
                    await eventually(
                        unchanged_for(lambda: evalsha_calls(cluster)),
                        what="the waiter's retry after its subscription",
                    )
                    before = evalsha_calls(cluster)
                    await asyncio.sleep(0.5)
                    # The waiter sleeps on pub/sub: no attempts while it waits (no
                    # polling; slack for a waiter registration refreshed meanwhile, as
                    # the kinds with claims do soon after registering).
                    assert evalsha_calls(cluster) - before <= 2
                assert not task.done(), f"{kind} {name!r}: the second manager got in"
                released_at = time.monotonic()
            woke_at = await asyncio.wait_for(task, 10)
            # The lease is 30 s: only the release message can wake it this fast (5 s: room
            # for a loaded machine, far from the lease).
            assert woke_at - released_at < 5.0
        stats = b.statistics()
        assert stats.hub.messages >= cluster.primaries, stats
        assert stats.acquired, stats


async def test_multi_lock_spans_slots_on_three_primaries(
    cluster: LocalCluster, prefix: str
) -> None:
    names = names_on_each_primary(cluster, "multi-")
    async with two_managers(cluster, prefix) as (a, b):
        got, done = asyncio.Event(), asyncio.Event()

        async def hold_all() -> None:
            async with a.multi_lock(names, timeout=5):
                got.set()
                await done.wait()

        async with b.lock(names[1]):
            assert not await a.multi_lock(names).try_acquire(timeout=0.1)
            task = asyncio.create_task(hold_all())
            await asyncio.sleep(0.1)
            assert not got.is_set()
        await asyncio.wait_for(got.wait(), 5)
        assert (await b.multi_lock(names).locked()) == dict.fromkeys(names, True)
        for name in names:
            assert not await b.lock(name).try_acquire(timeout=0)
        done.set()
        await task
        assert (await b.multi_lock(names).locked()) == dict.fromkeys(names, False)


async def test_renewal_batches_are_grouped_per_slot(cluster: LocalCluster, prefix: str) -> None:
    """Locks in many slots on three nodes are renewed, each batch one slot (a cross-slot
    batch would fail with CROSSSLOT and the holds be lost): two of the watchdog's rounds,
    run here on a lease no stall of a loaded machine ends, not waited for on its timer."""
    names = [f"renew-{i}" for i in range(12)]
    slots = {key_slot(n.encode()) for n in names}
    async with aiolock.LockManager.from_url(
        cluster.url, cluster=True, prefix=prefix, lease=30.0
    ) as locks:
        watchdog = locks._open_engine().watchdog
        assert watchdog.group_by_slot
        async with locks.multi_lock(names):
            before = locks.statistics().renewal_round_trips
            for _ in range(2):
                assert await watchdog.renew_all()  # every batch succeeded
            # one batch per slot a round (the timer's first round is 10 s away)
            sent = locks.statistics().renewal_round_trips - before
            assert sent == 2 * len(slots), (sent, len(slots))
            assert (await locks.multi_lock(names).locked()) == dict.fromkeys(names, True)
        stats = locks.statistics()
        assert stats.lost == {}, stats


async def test_listener_registrations_are_batched_per_slot(
    cluster: LocalCluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager's listener registrations go in batches of one slot each (a cross-slot
    batch would fail with CROSSSLOT and leave them unwritten): five names in one slot take
    three calls of two, twelve names elsewhere one call per slot; a round's withdrawals
    and refreshes likewise."""
    clock = driven_clock(monkeypatch)
    monkeypatch.setattr(listeners, "LISTEN_BATCH", 2)
    names = [*names_in_one_slot("crowd", 5), *(f"spread-{i}" for i in range(12))]
    per_slot = collections.Counter(key_slot(name.encode()) for name in names)
    calls = sum(math.ceil(count / 2) for count in per_slot.values())
    async with aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix) as locks:
        listening = Listening(locks, clock, monkeypatch)

        def registered(name: str) -> bool:
            key = f"{prefix}:lock:{{{name}}}:listeners"
            with cluster.node(cluster.owner_port(key_slot(name.encode()))) as node:
                return node.zscore(key, locks.id) is not None

        listening.wait_on(names)
        await listening.written(len(names), "the registrations sent")
        assert len(listening.calls.sizes) == calls, (listening.calls.sizes, per_slot)
        await eventually(
            lambda: all(registered(name) for name in names), what="every name registered"
        )
        # the next round: the crowded slot's names withdrawn, the others refreshed
        listening.stop_waiting(names[:5])
        listening.calls.sizes.clear()
        listening.next_round()
        listening.wait_on(["one-more"])
        await listening.written(len(names) + 1, "the round sent")
        per_slot[key_slot(b"one-more")] += 1
        calls = sum(math.ceil(count / 2) for count in per_slot.values())
        assert len(listening.calls.sizes) == calls, (listening.calls.sizes, per_slot)
        await eventually(
            lambda: not any(registered(name) for name in names[:5]),
            what="the crowded slot's registrations withdrawn",
        )
        # "sent" is not "applied": the round's other slots may still be in flight
        await eventually(
            lambda: all(registered(name) for name in [*names[5:], "one-more"]),
            what="the other registrations refreshed and the new one written",
        )


@pytest.mark.parametrize(
    "options", [{"protocol": 2}, {"protocol": 3, "decode_responses": True}], ids=["resp2", "resp3"]
)
async def test_a_plain_client_on_a_cluster_node_is_refused_when_the_manager_opens(
    cluster: LocalCluster, prefix: str, options: dict[str, Any]
) -> None:
    """Such a client served the locks of that node's slots until a renewal batch spanned
    slots (CROSSSLOT) and every hold was lost: it is refused at open, saying what to use."""
    port = cluster.primary_ports()[0]
    redis = Redis(host="127.0.0.1", port=port, **options)
    try:
        locks = aiolock.LockManager(redis, prefix=prefix)
        with pytest.raises(aiolock.LockBackendError) as caught:
            await locks.open()
        message = str(caught.value)
        assert f"127.0.0.1:{port}" in message and "Redis Cluster" in message, message
        assert "RedisCluster" in message and "cluster=True" in message, message
        with pytest.raises(aiolock.ManagerNotOpenError):
            await locks.lock("x").acquire(timeout=0)  # not open
        await locks.aclose()  # harmless
    finally:
        await redis.aclose()


async def test_keyless_commands_are_refused_and_ping_goes_to_a_primary(
    cluster: LocalCluster, prefix: str
) -> None:
    async with aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix) as locks:
        assert await locks.ping() > 0
        client = locks._client
        assert isinstance(client, ClusterClient)
        with pytest.raises(aiolock.LockError, match="names no key"):
            await client.call("INFO")


async def test_an_unreachable_cluster_is_a_connection_error_that_says_so() -> None:
    with closed_port() as port:
        url = f"redis://127.0.0.1:{port}"  # nothing listens there
        async with aiolock.LockManager.from_url(url, cluster=True, check_on_open=False) as locks:
            with pytest.raises(aiolock.LockConnectionError, match="slot map"):
                await locks.lock("x").acquire(timeout=0)
            with pytest.raises(aiolock.LockConnectionError, match="reachable"):
                await locks.ping()


def test_scripts_publish_sharded_on_a_cluster() -> None:
    variant = sharded(RELEASE)
    assert "redis.call('spublish'," in variant.source
    assert "redis.call('publish'," not in variant.source
    assert variant.sha != RELEASE.sha and sharded(RELEASE) is variant
    # the lock's release counts no listeners since issue 21 (its waiter flag); the
    # redisson format's still does
    counting = sharded(REDISSON_RELEASE)
    assert "'pubsub', 'shardnumsub'" in counting.source
    assert "'pubsub', 'numsub'" not in counting.source


async def test_the_identity_record_lives_in_its_own_slot_beside_holds_in_others(
    cluster: LocalCluster, prefix: str
) -> None:
    """The record ``P:mgr:{<id>}`` is written to the primary of its own slot, refreshed
    every lease / 3 beside the rounds that renew holds on every primary (which must not
    batch it with them: CROSSSLOT), and deleted at close. A 3 s lease: a loaded machine
    that stalls the loop for two seconds loses neither the record nor the holds."""
    names = names_on_each_primary(cluster, "who-")
    locks = aiolock.LockManager.from_url(
        cluster.url, cluster=True, prefix=prefix, lease=3.0, name="cluster-app"
    )
    key = f"{prefix}:mgr:{{{locks.id}}}"
    owner = Redis(port=cluster.owner_port(key_slot(key.encode())))
    try:
        async with locks, locks.multi_lock(names):
            await until(lambda: owner.exists(key), what="the record")
            rounds = locks.statistics().renewal_rounds
            last, refreshed = await owner.pttl(key), 0

            async def refreshed_twice() -> bool:  # its TTL went back up: a refresh
                nonlocal last, refreshed
                ttl = await owner.pttl(key)
                assert ttl > 0, f"the record expired (PTTL {ttl})"
                refreshed += ttl > last
                last = ttl
                return refreshed >= 2

            await eventually(refreshed_twice, what="two refreshes of the record on its owner")
            await eventually(
                lambda: locks.statistics().renewal_rounds - rounds >= 2,
                what="two renewal rounds",
            )
            record = await owner.get(key)
            assert record is not None and b'"n":"cluster-app"' in record
            assert locks.statistics().lost == {}
        assert await owner.exists(key) == 0
    finally:
        await owner.aclose()


async def test_a_manager_of_another_layout_on_any_primary_keeps_a_manager_from_opening(
    cluster: LocalCluster, prefix: str
) -> None:
    """The identity records lie in many slots: the layout check (issue 36) scans every
    primary, and reads each record on the primary of its slot. A record of a newer layout
    on each primary in turn (written by the record's own code, as such a manager writes
    it) keeps the manager from opening; without one it opens."""
    redis = RedisCluster.from_url(cluster.url)
    client = ClusterClient(redis)
    locks = aiolock.LockManager(redis, prefix=prefix)
    try:
        for port in cluster.primary_ports():
            other_id = next(
                found
                for found in iter(new_manager_id, None)
                if cluster.owner_port(key_slot(identity_key(prefix, found).encode())) == port
            )
            other = Identity(client, identity_key(prefix, other_id), "newer", 600.0, LAYOUT + 1)
            await other.publish()
            try:
                with pytest.raises(aiolock.IncompatibleLayoutError, match="newer@"):
                    await locks.open()
            finally:
                await other.delete()
        async with locks, locks.lock("opened"):  # not open after a refusal: it opens again
            assert locks.is_open
    finally:
        await client.aclose()
        await redis.aclose()


async def until(check: Callable[[], Awaitable[int]], *, what: str) -> None:
    deadline = time.monotonic() + 10
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_a_cancelled_acquire_leaves_nothing_held(cluster: LocalCluster, prefix: str) -> None:
    """Cancel acquires at growing delays (before, during and after their round trips):
    whatever reached Redis is undone, on whichever node owns the name."""
    names = names_on_each_primary(cluster, "cancel-")
    async with two_managers(cluster, prefix) as (a, b):
        for step in range(24):
            name = names[step % len(names)]

            async def take(n: str = name) -> None:
                async with a.lock(n):
                    await asyncio.sleep(0)

            task = asyncio.create_task(take())
            await asyncio.sleep(step * 0.0002)
            task.cancel()  # in the acquire, the body, or the (shielded) release
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # b gets it at once: nothing of the cancelled attempt is left holding it
            assert await b.lock(name).try_acquire(timeout=2), (step, name)
            await b.lock(name).release()
        assert a.statistics().held == 0


async def test_uncontended_cycles_take_the_fast_path_on_a_cluster(
    cluster: LocalCluster, prefix: str
) -> None:
    """Issue 21: an uncontended acquire and its release take the engine's fast path on a
    Cluster as on one server (the client routes each call to its slot's owner), on names
    owned by each primary; an attempt that finds the lock busy does not grant it."""
    names = names_on_each_primary(cluster, "fast-")
    async with two_managers(cluster, prefix) as (a, b):
        tokens: list[int] = []
        for name in names:
            lock = a.lock(name)
            async with lock:
                token = lock.fencing_token
                assert token is not None
                tokens.append(token)
                assert not await b.lock(name).try_acquire(timeout=0)  # Busy: no hold
        assert fast_counts(a) == (3, 3, 3)
        assert fast_counts(b) == (0, 0, 0)
        assert a.statistics().hub.queues == 0  # the fast path left no queue behind
        async with b.lock(names[0]) as lock:  # freed: b's fast attempt gets it
            assert (lock.fencing_token or 0) > tokens[0]
        assert fast_counts(b) == (1, 1, 1)


# -- topology changes while tasks hold and wait ------------------------------------------


EXCLUSIVE: dict[str, Maker] = {
    "lock": lambda m, n: m.lock(n, timeout=20),
    "fair_lock": lambda m, n: m.fair_lock(n, timeout=20),
    "rw_write": lambda m, n: m.rw_lock(n, timeout=20).write(),
    "semaphore_1": lambda m, n: m.semaphore(n, 1, timeout=20),
}


class Contention:
    """Tasks of two managers taking one lock in turn, checking that none overlap."""

    def __init__(
        self, managers: list[aiolock.LockManager], name: str, make: Maker = EXCLUSIVE["lock"]
    ) -> None:
        self.managers = managers
        self.name = name
        self.make = make
        self.inside = 0
        self.overlaps = 0
        self.cycles = 0
        self.lost = 0
        self.errors: list[BaseException] = []
        self.acquired_at: list[float] = []
        self._stop = asyncio.Event()

    async def worker(self, locks: aiolock.LockManager) -> None:
        while not self._stop.is_set():
            try:
                async with self.make(locks, self.name):
                    self.acquired_at.append(time.monotonic())
                    self.inside += 1
                    if self.inside > 1:
                        self.overlaps += 1
                    await asyncio.sleep(0.01)
                    self.inside -= 1
                    self.cycles += 1
            except aiolock.LockLostError:
                self.inside = max(0, self.inside - 1)
                self.lost += 1
            except aiolock.LockError as exc:  # reported, not fatal: the figures say how many
                self.errors.append(exc)
                await asyncio.sleep(0.05)

    async def run_while(self, change: Callable[[], Awaitable[None]], per_manager: int = 3) -> None:
        tasks = [
            asyncio.create_task(self.worker(m)) for m in self.managers for _ in range(per_manager)
        ]
        try:
            await eventually(lambda: self.cycles >= 10, timeout=10, what="warm-up cycles")
            await change()
            settled = self.cycles
            await eventually(lambda: self.cycles >= settled + 20, timeout=20, what="progress")
        finally:
            self._stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)


@pytest.mark.parametrize("kind", list(EXCLUSIVE))
async def test_slot_migration_while_tasks_hold_and_wait(
    cluster: LocalCluster, prefix: str, kind: str
) -> None:
    name = names_on_each_primary(cluster, f"migrate-{kind}-")[0]
    slot = key_slot(name.encode())
    async with two_managers(cluster, prefix) as (a, b):
        run = Contention([a, b], name, EXCLUSIVE[kind])

        async def migrate() -> None:
            await asyncio.to_thread(move_slot, cluster, slot)

        await run.run_while(migrate)
        assert run.overlaps == 0
        assert run.errors == [], run.errors
        assert run.lost == 0
        moves = sum(h.moves for h in (hub_of(a), hub_of(b)))
        redirects = sum(client_of(m).redirects for m in (a, b))
        print(f"\nmigration {kind}: {run.cycles} cycles, {moves} moves, {redirects} redirects")
        assert redirects >= 1  # the commands followed the slot
        assert moves >= 1  # a waiter's subscription followed it too


def move_slot(cluster: LocalCluster, slot: int) -> None:
    """Migrate *slot* to another primary: SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE."""
    _, source, target, source_id, target_id = plan_migration(cluster, slot)
    with cluster.node(source) as src, cluster.node(target) as dst:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        for _ in range(1000):
            keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
            time.sleep(0.05)  # let the tasks run against a half-migrated slot
        dst.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        src.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    for port in cluster.primary_ports():
        if port not in (source, target):
            with cluster.node(port) as other:
                other.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    assert cluster.owner_port(slot) == target


def names_in_one_slot(stem: str, count: int) -> list[str]:
    """*count* lock names whose keys all live in the slot of ``stem + "0"``."""
    slot = key_slot(f"{stem}0".encode())
    names = [
        f"{stem}{i}" for i in range(16384 * count * 4) if key_slot(f"{stem}{i}".encode()) == slot
    ]
    assert len(names) >= count, "not enough names in one slot"
    return names[:count]


@pytest.mark.parametrize("max_in_flight", [1, 9])
async def test_redirects_inside_a_pipeline_are_followed(
    cluster: LocalCluster, prefix: str, max_in_flight: int
) -> None:
    """The slot of 20 names moves behind an open manager; 20 concurrent acquisitions
    then go to the old owner, most of them queued into pipelines (more commands than
    the old owner's share of max_in_flight: 1 and 3 of 3 primaries): each MOVED reply
    inside a pipeline is followed as if its command had been sent alone, so every
    acquisition succeeds."""
    names = names_in_one_slot(f"{prefix}-piped-", 20)
    slot = key_slot(names[0].encode())
    async with aiolock.LockManager.from_url(
        cluster.url, cluster=True, prefix=prefix, max_in_flight=max_in_flight
    ) as locks:
        async with locks.lock(names[0]):  # the manager knows the old owner of the slot
            pass
        await asyncio.to_thread(move_slot, cluster, slot)

        async def take(name: str) -> bool:
            lock = locks.lock(name)
            await lock.acquire(timeout=10)
            await lock.release()
            return True

        results = await asyncio.gather(*(take(n) for n in names), return_exceptions=True)
        failures = [r for r in results if r is not True]
        assert failures == [], f"{len(names) - len(failures)}/{len(names)}: {failures[:3]}"
        assert client_of(locks).redirects >= 1
        assert client_of(locks).pipelines >= 1  # the commands did go out as pipelines
        # Issue 21: each acquisition and release took the engine's fast path (the names
        # are distinct, nobody waits), whose calls followed MOVED inside the client; no
        # redirect surfaced as an error that the engine's wait then rode out.
        engine = engine_of(locks)
        assert fast_counts(locks) == (len(names) + 1, len(names) + 1, len(names) + 1)
        assert engine.connection_errors == 0


async def test_a_remembered_route_skips_the_slot_map_and_follows_a_moved_slot(
    cluster: LocalCluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: once a command on a lock's key has run, the next ones go straight to the
    node that ran it (no CRC16, no map lookup). When the slot moves, the remembered node
    answers MOVED: the map is reloaded, which forgets every route, the command lands on
    the new owner, and the commands after it go straight there."""
    name = names_on_each_primary(cluster, "route-")[0]
    slot = key_slot(name.encode())
    async with aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix) as locks:
        client = client_of(locks)
        key = locks.lock(name)._keys.lock
        lookups = 0
        lookup = client.owner

        async def counted(slot: int) -> Any:
            nonlocal lookups
            lookups += 1
            return await lookup(slot)

        monkeypatch.setattr(client, "owner", counted)  # every map lookup goes through it

        async def cycles(count: int) -> None:
            for _ in range(count):
                async with locks.lock(name):
                    pass

        await cycles(1)  # the route is learnt
        lookups, redirects, refreshes = 0, client.redirects, client.refreshes
        await cycles(10)
        assert lookups == 0, f"{lookups} map lookups in 20 commands on a remembered route"
        source = client._routes[key]
        assert (client.redirects, client.refreshes) == (redirects, refreshes)

        await asyncio.to_thread(move_slot, cluster, slot)
        await cycles(1)  # its acquire goes to the old owner: MOVED, reload, new owner
        assert client.redirects == redirects + 1
        assert client.refreshes == refreshes + 1
        target = client._routes[key]
        assert target is not source
        assert target is client._nodes[client.redis.nodes_manager.get_node_from_slot(slot).name]
        lookups = 0
        await cycles(10)  # straight to the new owner
        assert lookups == 0
        assert client.redirects == redirects + 1, "a command went to the old owner again"
        assert fast_counts(locks) == (22, 22, 22)


async def test_max_in_flight_is_shared_by_the_primaries(cluster: LocalCluster, prefix: str) -> None:
    """Issue 21: a manager's max_in_flight is its total on a cluster as on one server;
    each primary's client gets an equal share (at least one), so that concurrent commands
    to a node go out in pipelines as large as on one server."""
    names = names_on_each_primary(cluster, "share-")
    for total, share in ((1, 1), (3, 1), (9, 3)):
        async with aiolock.LockManager.from_url(
            cluster.url, cluster=True, prefix=prefix, max_in_flight=total
        ) as locks:
            for name in names:
                async with locks.lock(name):
                    pass
            shares = [node.max_in_flight for node in client_of(locks)._nodes.values()]
            assert shares == [share] * cluster.primaries, (total, shares)


@pytest.mark.parametrize(
    "options", [{}, {"protocol": 3, "decode_responses": True}], ids=["resp2", "resp3-decoded"]
)
async def test_a_waiter_follows_its_channel_to_the_new_owner_of_the_slot(
    cluster: LocalCluster, prefix: str, options: dict[str, Any]
) -> None:
    """The slot of a held lock with a waiter of another manager moves to another primary.
    The old owner pushes ``sunsubscribe``; the waiter's manager subscribes again on the new
    owner, where the release is published: the waiter wakes at once (no lost wake-up,
    no wait for the 30 s lease)."""
    name = names_on_each_primary(cluster, "follow-")[2]
    slot = key_slot(name.encode())
    async with two_managers(cluster, prefix, **options) as (a, b):
        woke = asyncio.Event()

        async def waiter() -> None:
            async with b.lock(name, timeout=20):
                woke.set()

        async with a.lock(name):
            task = asyncio.create_task(waiter())
            await eventually(lambda: b.statistics().hub.subscriptions == 1, what="SSUBSCRIBE")
            old = cluster.owner_port(slot)
            await asyncio.to_thread(move_slot, cluster, slot)
            assert cluster.owner_port(slot) != old
            await eventually(lambda: hub_of(b).moves >= 1, what="the pushed sunsubscribe")
            await eventually(
                lambda: b.statistics().hub.subscriptions == 1, what="SSUBSCRIBE on the new owner"
            )
            assert not woke.is_set()
            released = time.monotonic()
        await within(woke.wait(), what="the waiter to wake on the slot's new owner")
        # woken by the release's message, not by the 30 s lease (the margin is for a
        # loaded machine)
        waited = time.monotonic() - released
        assert waited < PATIENCE, f"the waiter woke {waited:.1f} s after the release"
        await task


async def test_a_held_lock_mid_migration_follows_ask_and_tryagain(
    cluster: LocalCluster, prefix: str
) -> None:
    """A held lock's slot is MIGRATING/IMPORTING and its keys were moved: single-key reads,
    the renewal script and the release (all their keys present on the target) follow ASK.
    (Before issue 21 the release also named its tombstone key, which did not exist yet:
    Redis answers TRYAGAIN to any multi-key command with missing keys in a migrating slot,
    and the client retried until the migration completed.)"""
    name = names_on_each_primary(cluster, "ask-")[1]
    slot, source, target, source_id, target_id = plan_migration(cluster, key_slot(name.encode()))

    def finish() -> None:
        time.sleep(0.3)
        for port in cluster.primary_ports():
            with cluster.node(port) as node:
                node.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)

    async with two_managers(cluster, prefix) as (a, b):
        lock = a.lock(name, lease=30)  # a fixed lease, so that extend() applies
        await lock.acquire()
        with cluster.node(source) as src, cluster.node(target) as dst:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
            keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
            assert f"{prefix}:lock:{{{name}}}" in keys
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        finishing = asyncio.create_task(asyncio.to_thread(finish))
        try:
            assert await b.lock(name).locked()  # EXISTS: ASK, then ASKING + EXISTS there
            await lock.extend(30)  # the renewal script: every key is on the target
            assert client_of(a).asks >= 1 and client_of(b).asks >= 1
            await lock.release()  # one key, on the target: ASK (or MOVED once it is done)
        finally:
            await finishing
        assert cluster.owner_port(slot) == target
        assert await b.lock(name).try_acquire(timeout=5)
        await b.lock(name).release()
        assert a.statistics().pending_cleanups == 0


async def test_the_fast_path_through_a_slot_migration_step_by_step(
    cluster: LocalCluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: the fast path on a slot being migrated. A hold the fast path took is
    released by it through ASK (its key was moved to the importing node). Acquisitions
    meanwhile get TRYAGAIN (their script names a void marker that exists nowhere: a
    multi-key command with a missing key, in a slot being migrated), which the client
    retries until its window ends and then reports as a LockConnectionError: each such
    fast attempt continues in the engine's wait (undone there, ridden out) instead of
    failing its caller. Once the migration completes, the waiters of both managers get
    the lock in turn, with larger tokens, and the fast path serves the new owner."""
    # The client retries TRYAGAIN for 5 s: shortened, so that it surfaces in a moment.
    monkeypatch.setattr("aiolock._redis.cluster.RETRY_WINDOW", 0.2)
    name = names_on_each_primary(cluster, "fastmove-")[0]
    slot, source, target, source_id, target_id = plan_migration(cluster, key_slot(name.encode()))
    entered: list[tuple[str, int]] = []
    inside = [0]

    async def take(locks: aiolock.LockManager, who: str) -> None:
        handle = locks.lock(name)
        await handle.acquire(timeout=20)
        inside[0] += 1
        token = handle.fencing_token
        assert token is not None
        entered.append((who, token))
        await asyncio.sleep(0.05)  # room for an overlap, if exclusion failed
        assert inside[0] == 1, "two holders at once"
        inside[0] -= 1
        await handle.release()  # confirmed: it raises otherwise

    async with two_managers(cluster, prefix) as (a, b):
        lock = a.lock(name)
        await lock.acquire()
        assert fast_counts(a) == (1, 0, 1)
        first = lock.fencing_token
        assert first is not None
        try:
            with cluster.node(source) as src, cluster.node(target) as dst:
                dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
                src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
                keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
                assert lock.key in keys
                src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
            # b's fast attempt: ASK to the importing node, TRYAGAIN there until the
            # window ends; the error goes on in b's wait, which keeps retrying.
            assert fast_idle(b, name)
            waiting = asyncio.create_task(take(b, "b"))
            await eventually(
                lambda: engine_of(b).connection_errors >= 1, what="b's attempt to fail over"
            )
            assert not waiting.done()
            assert client_of(b).asks >= 1 and client_of(b).retries >= 1
            await lock.release()  # the fast path: ASK, released on the importing node
            assert fast_counts(a) == (1, 1, 1)
            assert client_of(a).asks >= 1
            # a's next acquisition starts on the fast path too, and fails over the same way
            assert fast_idle(a, name)
            again = asyncio.create_task(take(a, "a"))
            await eventually(
                lambda: engine_of(a).connection_errors >= 1, what="a's attempt to fail over"
            )
            assert not again.done() and not waiting.done()  # nobody holds it mid-migration
            assert entered == []
        finally:
            await asyncio.to_thread(finish_migration, cluster, slot, source, target)
        await within(asyncio.gather(waiting, again), what="both waiters to get the lock")
        assert sorted(who for who, _ in entered) == ["a", "b"]
        assert first < entered[0][1] < entered[1][1], entered
        # Both were granted by the engine's wait, not by a fast attempt.
        assert (engine_of(a).fast_acquired, engine_of(b).fast_acquired) == (1, 0)
        assert (engine_of(a).acquired["lock"], engine_of(b).acquired["lock"]) == (2, 1)
        # The undos of the failed fast attempts, retried in the background, landed.
        await eventually(
            lambda: a.statistics().pending_cleanups == 0 == b.statistics().pending_cleanups,
            what="the undos of the failed attempts",
        )
        assert a.statistics().held == 0 == b.statistics().held
        assert a.statistics().lost == {} == b.statistics().lost
        # On the slot's new owner, an uncontended cycle takes the fast path again.
        await eventually(lambda: fast_idle(b, name), what="b's queue to be forgotten")
        acquired, released, _ = fast_counts(b)
        async with b.lock(name, timeout=5) as again_held:
            assert (again_held.fencing_token or 0) > entered[1][1]
        assert fast_counts(b)[:2] == (acquired + 1, released + 1)
        assert cluster.owner_port(slot) == target


async def test_fast_path_cycles_stay_exclusive_while_their_slot_migrates(
    cluster: LocalCluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: one task per manager, so that each acquisition starts on the fast path
    unless the lock is busy or yielded, takes one lock in turn while its slot migrates;
    the client's TRYAGAIN window is short, so redirects surface as errors, which the
    engine's wait rides out. No two holders at once, every release confirmed (none
    raises), fencing tokens strictly increasing, and the fast path took part."""
    monkeypatch.setattr("aiolock._redis.cluster.RETRY_WINDOW", 0.05)
    name = names_on_each_primary(cluster, "fastrun-")[1]
    slot, source, target, source_id, target_id = plan_migration(cluster, key_slot(name.encode()))
    tokens: list[int] = []
    inside = [0, 0]  # holders now, overlaps seen
    released = [0]
    stop = asyncio.Event()

    async def worker(locks: aiolock.LockManager) -> None:
        handle = locks.lock(name, timeout=20)
        while not stop.is_set():
            await handle.acquire()
            inside[0] += 1
            if inside[0] > 1:
                inside[1] += 1
            token = handle.fencing_token
            assert token is not None
            tokens.append(token)
            await asyncio.sleep(0.005)
            inside[0] -= 1
            await handle.release()  # raises unless Redis confirmed it
            released[0] += 1

    def errors(managers: tuple[aiolock.LockManager, ...]) -> int:
        return sum(engine_of(m).connection_errors for m in managers)

    async with two_managers(cluster, prefix) as managers:
        tasks = [asyncio.create_task(worker(m)) for m in managers]
        try:
            await eventually(lambda: len(tokens) >= 10, what="warm-up cycles")
            try:
                with cluster.node(source) as src, cluster.node(target) as dst:
                    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
                    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
                    # attempts on the source: TRYAGAIN (the state exists, the void
                    # marker does not), surfaced, ridden out in the wait
                    await eventually(lambda: errors(managers) >= 1, what="a surfaced TRYAGAIN")
                    keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
                    assert managers[0].lock(name).key in keys
                    src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
                # now ASK to the target, TRYAGAIN there
                asks = sum(client_of(m).asks for m in managers)
                await eventually(
                    lambda: sum(client_of(m).asks for m in managers) > asks, what="ASK"
                )
            finally:
                await asyncio.to_thread(finish_migration, cluster, slot, source, target)
            moved = len(tokens)
            await eventually(lambda: len(tokens) >= moved + 20, what="progress after the move")
        finally:
            stop.set()
            await within(asyncio.gather(*tasks), what="the workers to stop")
        fast = [fast_counts(m) for m in managers]
        print(
            f"\nfast path through a migration: {len(tokens)} cycles, fast (acq, rel, all) "
            f"{fast}, connection errors ridden out {errors(managers)}, redirects "
            f"{sum(client_of(m).redirects for m in managers)}, retries "
            f"{sum(client_of(m).retries for m in managers)}"
        )
        assert inside[1] == 0, "two holders at once"
        assert tokens == sorted(set(tokens)), "fencing tokens not strictly increasing"
        assert released[0] == len(tokens)
        assert sum(f[0] for f in fast) >= 1 and sum(f[1] for f in fast) >= 1
        assert errors(managers) >= 1
        for locks in managers:
            stats = locks.statistics()
            assert stats.lost == {} and stats.held == 0, stats
        await eventually(
            lambda: all(m.statistics().pending_cleanups == 0 for m in managers),
            what="the undos of the failed attempts",
        )
    assert cluster.owner_port(slot) == target


@pytest.mark.processes
async def test_primary_failover_while_tasks_hold_and_wait(
    cluster: LocalCluster, prefix: str
) -> None:
    name = names_on_each_primary(cluster, "failover-")[0]
    slot = key_slot(name.encode())
    async with two_managers(cluster, prefix, lease=3.0) as (a, b):
        run = Contention([a, b], name)
        figures: dict[str, float] = {}

        async def failover() -> None:
            old = cluster.owner_port(slot)
            replica = replica_of(cluster, old)
            started = time.monotonic()
            with cluster.node(replica) as node:
                node.execute_command("CLUSTER FAILOVER")
            await eventually(
                lambda: cluster.owner_port(slot) == replica, timeout=15, what="failover"
            )
            promoted = time.monotonic()
            count = len(run.acquired_at)
            await eventually(lambda: len(run.acquired_at) > count, timeout=15, what="acquire")
            first = next(t for t in run.acquired_at[count:] if t >= promoted)
            figures["promoted_s"] = promoted - started
            figures["first_acquire_after_promotion_s"] = first - promoted
            figures["first_acquire_after_failover_s"] = first - started

        await run.run_while(failover)
        print(f"\nfailover: {figures} lost={run.lost} errors={len(run.errors)} cycles={run.cycles}")
        assert run.overlaps == 0
        assert figures["first_acquire_after_failover_s"] < 15
    cluster.wait_ok()


def replica_of(cluster: LocalCluster, primary: int) -> int:
    primary_id = cluster.node_id(primary)
    for server in cluster.servers:
        with cluster.node(server.port) as node:
            info = node.info("replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary:
                return server.port
    raise AssertionError(f"no replica of {primary} ({primary_id})")


def hub_of(manager: aiolock.LockManager) -> ClusterSubscriptions:
    """The source of the manager's hub: its sharded subscriptions (and their moves)."""
    engine = manager._engine
    assert engine is not None and isinstance(engine.hub.source, ClusterSubscriptions)
    return engine.hub.source


def client_of(manager: aiolock.LockManager) -> ClusterClient:
    client = manager._client
    assert isinstance(client, ClusterClient)
    return client


def engine_of(manager: aiolock.LockManager) -> Engine:
    engine = manager._engine
    assert engine is not None
    return engine


def fast_counts(manager: aiolock.LockManager) -> tuple[int, int, int]:
    """(fast acquisitions, fast releases, all new holds of the 'lock' kind): see
    tests/behaviour/test_fast_path.py."""
    engine = engine_of(manager)
    return engine.fast_acquired, engine.fast_released, engine.acquired["lock"]


def fast_idle(manager: aiolock.LockManager, name: str) -> bool:
    """Whether the manager's next acquisition of lock *name* may take the fast path (no
    local queue for it, not yielded to other clients)."""
    handle = manager.lock(name)
    return engine_of(manager).hub.idle(handle._keys.channel)


def finish_migration(cluster: LocalCluster, slot: int, source: int, target: int) -> None:
    """Complete a migration of *slot* from *source* to *target* begun by hand: MIGRATE
    what keys are left, then SETSLOT NODE on the target, the source and the others.
    Harmless if it was complete already (each step is then a no-op)."""
    target_id = cluster.node_id(target)
    with cluster.node(source) as src:
        for _ in range(1000):
            keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
    ports = [target, source] + [p for p in cluster.primary_ports() if p not in (source, target)]
    for port in ports:
        with cluster.node(port) as node:
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    assert cluster.owner_port(slot) == target


@pytest.mark.processes
async def test_primary_crash_while_tasks_hold_and_wait(cluster: LocalCluster, prefix: str) -> None:
    """The primary of a contended lock is killed (SIGKILL, by pid): its replica takes over
    after cluster-node-timeout (2 s here); the tasks carry on there. Runs last: the cluster
    is left with one primary without a replica."""
    name = names_on_each_primary(cluster, "crash-")[0]
    slot = key_slot(name.encode())
    async with two_managers(cluster, prefix, lease=3.0) as (a, b):
        run = Contention([a, b], name)
        figures: dict[str, float] = {}

        async def crash() -> None:
            old = cluster.owner_port(slot)
            server = next(s for s in cluster.servers if s.port == old)
            count = len(run.acquired_at)
            killed = time.monotonic()
            server.stop()  # SIGTERM then SIGKILL, by pid
            await eventually(
                lambda: any(t > killed for t in run.acquired_at[count:]),
                timeout=30,
                what="an acquisition after the crash",
            )
            first = next(t for t in run.acquired_at[count:] if t > killed)
            figures["first_acquire_after_kill_s"] = first - killed

        await run.run_while(crash)
        retries = sum(client_of(m).retries for m in (a, b))
        print(f"\ncrash: {figures} lost={run.lost} errors={len(run.errors)} retries={retries}")
        assert run.overlaps == 0
        assert run.errors == [], run.errors


@pytest.mark.processes
async def test_replicas_are_acknowledged_by_the_node_that_took_the_write(
    cluster: LocalCluster, prefix: str
) -> None:
    """replicas= on a cluster: WAIT goes on the owning primary's connection, for names on
    every primary that has a replica now (the failover tests of this module change the
    topology); asking for more replicas than a primary has is a ReplicaAckError, and the
    acquisition is undone."""
    names = names_on_each_primary(cluster, "ack")
    with_replica = []
    for name in names:
        with cluster.node(cluster.owner_port(key_slot(name.encode()))) as node:
            if int(node.info("replication").get("connected_slaves", 0)) >= 1:
                with_replica.append(name)
    assert with_replica, "no primary has a replica"
    async with two_managers(cluster, prefix, replicas=1, replica_timeout=2.0) as (a, b):
        for name in with_replica:
            async with a.lock(name, timeout=5):
                with pytest.raises(aiolock.LockTimeoutError):
                    await b.lock(name).acquire(timeout=0)
    async with two_managers(cluster, prefix, replicas=2, replica_timeout=0.2) as (a, _):
        with pytest.raises(aiolock.ReplicaAckError, match="of the 2 replicas"):
            await a.lock(names[0]).acquire(timeout=0)
        assert a.statistics().held == 0
    # Undone: free for a manager without replicas=.
    async with two_managers(cluster, prefix) as (plain, _), plain.lock(names[0], timeout=0):
        pass


@pytest.mark.parametrize("wire", ["token", "timestamp"])
async def test_shared_string_formats_exclude_and_wake_on_a_cluster(
    cluster: LocalCluster, prefix: str, wire: str
) -> None:
    """The token and timestamp formats keep their own keys in the slot of the raw name,
    so their scripts run on a cluster; a release wakes the other manager's waiter."""
    name = f"{prefix}-{wire}"
    async with two_managers(cluster, prefix, wire=wire) as (a, b):
        async with a.lock(name):
            with pytest.raises(aiolock.LockTimeoutError):
                await b.lock(name).acquire(timeout=0)
            entered = asyncio.Event()

            async def take() -> None:
                async with b.lock(name, timeout=10):
                    entered.set()

            waiter = asyncio.create_task(take())
            await asyncio.sleep(0.2)
            assert not entered.is_set()
        await asyncio.wait_for(waiter, timeout=10)
        assert entered.is_set()


async def test_the_redisson_format_is_refused_on_a_cluster(
    cluster: LocalCluster, prefix: str
) -> None:
    async with two_managers(cluster, prefix) as (a, _):
        with pytest.raises(aiolock.WireFormatError, match="not supported on a Redis Cluster"):
            a.lock("x", wire="redisson")
    with pytest.raises(aiolock.WireFormatError, match="not supported on a Redis Cluster"):
        aiolock.LockManager.from_url(cluster.url, cluster=True, wire="redisson")


def test_a_node_whose_port_is_taken_meanwhile_starts_on_fresh_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port picked free may be taken before the node binds it: CI's suites run side by
    side and start servers too (a fresh-clone run failed so, 4 tests of a module whose
    cluster did not start). The node is started again on fresh ports."""
    import aiolock.testing_cluster as local

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        real = free_port
        picks = iter([real(), port])  # the first node's bus port, then its taken port
        monkeypatch.setattr(
            local, "free_port", lambda host="127.0.0.1": next(picks, 0) or real(host)
        )
        with LocalCluster(primaries=1, replicas=0) as cluster:
            assert [server.port for server in cluster.servers] != [port]
            with cluster.node(cluster.servers[0].port) as client:
                assert client.ping()
