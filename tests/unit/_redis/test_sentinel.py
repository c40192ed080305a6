"""Sentinel: a manager on a Sentinel-managed primary, through a real failover.

One Sentinel deployment per module (a primary, two replicas, three sentinels, every one
a redis-server this module starts on loopback and stops by pid). The failover test runs
``SENTINEL FAILOVER`` while tasks of two managers hold and wait, and checks what the
design promises: a holder whose hold the new primary does not have is told (its body
cancelled, ``LockLostError``); holders the new primary has keep their locks; waiters
carry on against the new primary; scripts are loaded there (NOSCRIPT); and nothing keeps
running lock scripts on the demoted primary, which still answers as a primary for ~10 s.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

import aiolock
from aiolock._errors import LockBackendError
from aiolock._redis.sentinel import PrimaryWatch
from tests._support.helpers import lock_held
from tests._support.sentinel_servers import SERVICE, SentinelGroup

LEASE = 3.0


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup(replicas=2, sentinels=3) as started:
        yield started


def _node(port: int) -> Redis:
    return Redis(host="127.0.0.1", port=port)


@pytest.fixture
async def manager(group: SentinelGroup, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager.from_sentinel(
        group.addresses, SERVICE, prefix=prefix, lease=LEASE, socket_timeout=2.0
    ) as locks:
        yield locks


async def test_from_sentinel_locks_on_the_primary(
    group: SentinelGroup, manager: aiolock.LockManager, prefix: str
) -> None:
    primary = _node(group.primary_port())
    try:
        async with manager.lock("a") as lock:
            assert (lock.fencing_token or 0) > 0
            assert await primary.exists(f"{prefix}:lock:{{a}}") == 1
        assert not await lock_held(primary, f"{prefix}:lock:{{a}}")
        assert await manager.ping() > 0
    finally:
        await primary.aclose()


async def test_a_replica_given_as_the_primary_is_named(group: SentinelGroup, prefix: str) -> None:
    replica_port = next(n.port for n in group.nodes if n.port != group.primary_port())
    async with aiolock.LockManager(_node(replica_port), prefix=prefix) as locks:
        with pytest.raises(LockBackendError, match="read-only replica") as caught:
            await locks.lock("a").acquire(timeout=1)
        assert "from_sentinel" in str(caught.value)
        await locks.redis.aclose()


async def test_a_client_made_by_master_for_is_followed_and_swept(
    group: SentinelGroup, prefix: str
) -> None:
    """A connection of the pool open to another node than the primary is closed.

    (One opened while the primary moved could have reached the old primary; here one
    is pointed at a replica by hand.)
    """
    sentinel = Sentinel(group.addresses, socket_timeout=2.0)  # type: ignore[no-untyped-call]
    redis = sentinel.master_for(SERVICE)
    try:
        async with aiolock.LockManager(redis, prefix=prefix) as locks:
            async with locks.lock("a"):
                pass
            replica_port = next(n.port for n in group.nodes if n.port != group.primary_port())
            # Connected to the replica first, then put in the pool's in-use list (the list
            # the sweep reads, as get_connection() would). Not connected from inside the
            # pool: a connection the sweep closes between two commands of its handshake is
            # reopened by redis-py's next send, and the handshake then waits for a reply
            # that never comes (redis-py 5.x: a TimeoutError after socket_timeout, seen
            # beside a spinning core). The test's own race, not the outcome under test.
            pool = redis.connection_pool
            stray = pool.make_connection()
            await stray.connect_to(("127.0.0.1", replica_port))
            pool._in_use_connections.add(stray)
            await _eventually(lambda: not stray.is_connected, 5, "the stray connection closed")
            assert locks.statistics().failovers == 0
            async with locks.lock("a", timeout=1):
                pass
    finally:
        await redis.aclose()
        for client in sentinel.sentinels:
            await client.aclose()


async def test_closing_leaves_no_connection_behind(group: SentinelGroup, prefix: str) -> None:
    """A manager from from_sentinel() closes its sentinel and data connections."""
    watchers = [_node(port) for _, port in group.addresses]
    primary = _node(group.primary_port())

    async def ours() -> list[int]:
        # Connections from this test process's managers, told apart by their name.
        counts = []
        for node in [*watchers, primary]:
            clients = await node.client_list()
            counts.append(sum(1 for c in clients if c.get("name") == prefix))
        return counts

    try:
        locks = aiolock.LockManager.from_sentinel(
            group.addresses,
            SERVICE,
            prefix=prefix,
            client_name=prefix,
            sentinel_kwargs={"client_name": prefix, "socket_timeout": 2.0},
        )
        async with locks, locks.lock("a"):
            # The watch asks and subscribes in the background: waited for (a loaded
            # machine can take longer than the 0.2 s slept here before), not assumed.
            await _eventually(
                lambda: _all_at_least_one(ours()),
                10,
                "a connection of the manager on every sentinel and on the primary",
            )
        await _eventually(lambda: _all_zero(ours()), 5, "every connection of the manager closed")
    finally:
        for node in [*watchers, primary]:
            await node.aclose()


async def _all_zero(counts: Awaitable[list[int]]) -> bool:
    return not any(await counts)


async def _all_at_least_one(counts: Awaitable[list[int]]) -> bool:
    return all(count >= 1 for count in await counts)


def test_from_sentinel_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match=r"\(host, port\) pairs"):
        aiolock.LockManager.from_sentinel("127.0.0.1:26379", SERVICE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        aiolock.LockManager.from_sentinel([], SERVICE)
    with pytest.raises(ValueError, match="port"):
        aiolock.LockManager.from_sentinel([("127.0.0.1", 0)], SERVICE)
    with pytest.raises(ValueError, match="service_name"):
        aiolock.LockManager.from_sentinel([("127.0.0.1", 1)], "")
    with pytest.raises(TypeError, match="service_name"):
        aiolock.LockManager.from_sentinel([("127.0.0.1", 1)], None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no_such_option"):
        aiolock.LockManager.from_sentinel([("127.0.0.1", 1)], SERVICE, no_such_option=1)
    with pytest.raises(ValueError, match="replica_timeout"):
        aiolock.LockManager.from_sentinel(
            [("127.0.0.1", 1)], SERVICE, replicas=1, replica_timeout=0.5, command_timeout=0.5
        )


async def _eventually(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check() if callable(check) else check
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


async def _evalsha_calls(node: Redis) -> int:
    stats = await node.info("commandstats")
    entry = stats.get("cmdstat_evalsha", {})
    return int(entry.get("calls", 0)) if isinstance(entry, dict) else 0


class Holders:
    """Tasks of one manager inside ``async with`` until told to leave, and how it ended."""

    def __init__(self, manager: aiolock.LockManager) -> None:
        self.manager = manager
        self.inside: dict[str, asyncio.Event] = {}
        self.leave = asyncio.Event()
        self.outcome: dict[str, tuple[str, float]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, name: str) -> None:
        self.inside[name] = asyncio.Event()
        self.tasks.append(asyncio.create_task(self._hold(name)))

    async def _hold(self, name: str) -> None:
        try:
            async with self.manager.lock(name, timeout=5):
                self.inside[name].set()
                await self.leave.wait()
            self.outcome[name] = ("released", time.monotonic())
        except aiolock.LockLostError:
            self.outcome[name] = ("lost", time.monotonic())


@pytest.mark.processes
async def test_failover_tells_unconfirmed_holders_and_moves_waiters(
    group: SentinelGroup, prefix: str
) -> None:
    old = group.primary_port()
    replicas = [n.port for n in group.nodes if n.port != old]
    opts: dict[str, Any] = {"prefix": prefix, "lease": LEASE, "socket_timeout": 2.0}
    a = await aiolock.LockManager.from_sentinel(group.addresses, SERVICE, **opts).open()
    b = await aiolock.LockManager.from_sentinel(group.addresses, SERVICE, **opts).open()
    old_node = _node(old)
    replica_nodes = [_node(port) for port in replicas]
    holders = Holders(a)
    waiters: dict[str, asyncio.Task[float]] = {}

    async def wait_for(name: str) -> float:
        async with b.lock(name, timeout=20):
            return time.monotonic()

    try:
        for name in ("kept0", "kept1", "gone"):
            holders.start(name)
        await asyncio.wait_for(
            asyncio.gather(*(e.wait() for e in holders.inside.values())), timeout=10
        )
        for name in ("gone", "kept0"):
            waiters[name] = asyncio.create_task(wait_for(name))
        await _eventually(
            lambda: b.statistics().hub.subscriptions == 2, 10, "B's waiters subscribed"
        )

        # Every replica has the three grants; then make "gone" a grant that never
        # reached them (deleted on the writable replicas), and forget the scripts there,
        # so that the new primary must load them (NOSCRIPT).
        async def replicated() -> bool:
            keys = [f"{prefix}:lock:{{{n}}}" for n in holders.inside]
            counts = [await node.exists(*keys) for node in replica_nodes]
            return all(count == 3 for count in counts)

        await _eventually(replicated, 10, "the grants replicated")
        for node in replica_nodes:
            await node.config_set("replica-read-only", "no")
            await node.delete(f"{prefix}:lock:{{gone}}")
            await node.config_set("replica-read-only", "yes")
            await node.script_flush()

        started = time.monotonic()
        group.failover()
        new = await asyncio.to_thread(group.wait_for_new_primary, old)
        new_node = _node(new)
        try:
            # B's waiter gets "gone" on the new primary, which never had it.
            acquired_at = await asyncio.wait_for(waiters["gone"], timeout=20)
            first_acquisition = acquired_at - started
            # A's holder of "gone" is told: its body was cancelled with LockLostError.
            await _eventually(lambda: "gone" in holders.outcome, 10, "the holder of gone told")
            assert holders.outcome["gone"][0] == "lost"
            told_after = holders.outcome["gone"][1] - started
            # Well inside the ~10 s during which the old primary still takes writes.
            assert first_acquisition < 8.0 and told_after < 8.0
            # Nothing runs lock scripts on the old primary any more, though it still
            # answers as a primary; B's waiter for kept0 listens on the new primary.
            assert group.role(old) == "master"
            before = await _evalsha_calls(old_node)
            for _ in range(10):
                async with a.lock("probe"), b.lock("probe2"):
                    pass
                await asyncio.sleep(0.05)
            assert await _evalsha_calls(old_node) == before
            await _eventually(
                lambda: a.statistics().failovers == 1 and b.statistics().failovers == 1,
                10,
                "both managers followed the failover",
            )
            # The holders the new primary has keep their locks.
            assert "kept0" not in holders.outcome and "kept1" not in holders.outcome
            assert a.statistics().lost == {"lock": 1}
            kept = (f"{prefix}:lock:{{kept0}}", f"{prefix}:lock:{{kept1}}")
            assert await new_node.exists(*kept) == 2

            channel = f"{prefix}:lock:{{kept0}}:released"
            # B's waiter, and A, whose holder listens for a release it did not make
            assert dict(await new_node.pubsub_numsub(channel))[channel.encode()] == 2
            assert dict(await old_node.pubsub_numsub(channel))[channel.encode()] == 0

            # A release on the new primary wakes B's waiter through pub/sub there.
            holders.leave.set()
            await asyncio.wait_for(waiters["kept0"], timeout=10)
            await asyncio.wait_for(asyncio.gather(*holders.tasks), timeout=10)
            assert holders.outcome["kept0"][0] == "released"
            assert holders.outcome["kept1"][0] == "released"
            # The scripts were loaded on the new primary (it had none).
            assert all(await new_node.script_exists(*_shas()))
        finally:
            await new_node.aclose()
        print(
            f"\nfailover: first acquisition on the new primary after {first_acquisition:.2f} s;"
            f" the holder of the unreplicated grant was told after {told_after:.2f} s; "
            f"holders told of a loss: {sum(1 for o in holders.outcome.values() if o[0] == 'lost')}"
            " of 3"
        )
    finally:
        holders.leave.set()
        for task in [*holders.tasks, *waiters.values()]:
            task.cancel()
        await asyncio.gather(*holders.tasks, *waiters.values(), return_exceptions=True)
        await a.aclose()
        await b.aclose()
        for node in [old_node, *replica_nodes]:
            await node.aclose()


def _shas() -> list[str]:
    from aiolock._kinds.lock.kind import ACQUIRE, RELEASE

    return [ACQUIRE.sha, RELEASE.sha]


@pytest.mark.processes
@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL], ids=["SIGSTOP", "SIGKILL"])
async def test_a_stopped_or_killed_primary_is_failed_over(prefix: str, how: signal.Signals) -> None:
    """The primary stopped (connections hang) or killed (connections refused).

    Waiting tasks go on once the sentinels have promoted a replica; a holder whose grant
    replicated keeps its lock, confirmed on the new primary within its lease; when a
    stopped primary comes back (SIGCONT), as a primary for a while, nothing of ours runs
    scripts on it.
    """
    with SentinelGroup(replicas=1, sentinels=3) as group:
        old = group.primary_port()
        # A lease well above the failover's few seconds: the holder is confirmed on the
        # new primary before its lease runs out, and keeps its lock.
        opts: dict[str, Any] = {"prefix": prefix, "lease": 12.0, "socket_timeout": 1.0}
        a = await aiolock.LockManager.from_sentinel(group.addresses, SERVICE, **opts).open()
        b = await aiolock.LockManager.from_sentinel(group.addresses, SERVICE, **opts).open()
        holders = Holders(a)
        probe_ok: list[float] = []
        probe_cancelled: list[str] = []
        stop_probe = asyncio.Event()

        async def probe() -> None:
            # A new name each time: a probe whose release was cut off by the stop may
            # keep its name on the new primary (replicated) until its release is retried
            # there, and that is not what this waits for.
            for n in itertools.count():
                if stop_probe.is_set():
                    return
                try:
                    async with b.lock(f"probe-{n}", timeout=0.5):
                        probe_ok.append(time.monotonic())
                    await asyncio.sleep(0.02)
                except (aiolock.LockConnectionError, aiolock.LockTimeoutError):
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    # Nothing here cancels the probe before stop_probe: keep where such a
                    # cancellation surfaced, for the assertion below to show.
                    # (Python >= 3.11 counts the requests: 0 means nobody asked)
                    asked = getattr(asyncio.current_task(), "cancelling", lambda: "?")()
                    probe_cancelled.append(f"cancel requests: {asked}\n{traceback.format_exc()}")
                    raise

        old_node = _node(old)
        probe_task: asyncio.Task[None] | None = None
        try:
            holders.start("k")
            await asyncio.wait_for(holders.inside["k"].wait(), timeout=10)
            waiter = asyncio.create_task(_take(b, "k"))
            await _eventually(lambda: b.statistics().hub.subscriptions == 1, 10, "subscribed")
            await asyncio.to_thread(_replicated, group, old, f"{prefix}:lock:{{k}}")

            started = time.monotonic()
            group.signal(old, how)
            try:
                probe_task = asyncio.create_task(probe())
                await asyncio.to_thread(group.wait_for_new_primary, old, 20.0)
                assert probe_task is not None
                await _eventually(
                    lambda: probe_ok or probe_task.done(), 15, "an acquisition on the new primary"
                )
                assert not probe_cancelled, f"the probe was cancelled:\n{probe_cancelled[0]}"
                assert probe_ok, f"the probe ended: {probe_task.exception()!r}"
                first_acquisition = probe_ok[0] - started
                await _eventually(
                    lambda: a.statistics().failovers == 1 and b.statistics().failovers == 1,
                    10,
                    "both managers followed",
                )
                holders.leave.set()
                await asyncio.wait_for(waiter, timeout=10)  # woken on the new primary
            finally:
                if how is signal.SIGSTOP:
                    group.signal(old, signal.SIGCONT)
            await asyncio.wait_for(asyncio.gather(*holders.tasks), timeout=10)
            outcome = holders.outcome["k"][0]
            assert outcome == "released"
            print(
                f"\n{how.name} of the primary: first acquisition on the new primary after "
                f"{first_acquisition:.2f} s; the holder (grant replicated) was {outcome}"
            )
            if how is signal.SIGKILL:
                # With every sentinel gone, the watch cannot ask anybody: locks go on
                # working on the primary it knows, and the managers stay open.
                for sentinel in group.sentinels:
                    sentinel.stop()
                # Until each manager's watch has had a whole round without any sentinel
                # answering (up to PrimaryWatch.INTERVAL + ASK_TIMEOUT; a round begun
                # before the last sentinel stopped still had an answer), so that the new
                # connections below go to the known primary without asking. Before that,
                # each costs a bounded lookup (the test after this one).
                await _eventually(
                    lambda: all(m._primary_watch and m._primary_watch._no_sentinel for m in (a, b)),
                    10,
                    "both watches found no sentinel",
                )
                async with a.lock("after", timeout=2), b.lock("after2", timeout=2):
                    pass
                # New connections too (redis-py asks the sentinels for each): every
                # connection of one manager's pool is dropped first. A lookup asked of the
                # gone sentinels anyway would cost the watch's ASK_TIMEOUT: made long
                # here, so that it cannot pass for a slow connection on a loaded machine.
                watch = a._primary_watch
                assert watch is not None
                watch.ASK_TIMEOUT = 20.0
                started = time.monotonic()
                assert isinstance(a.redis, Redis)
                await a.redis.connection_pool.disconnect()
                async with a.lock("after3", timeout=30):
                    pass
                # at once: not after a lookup on the unreachable sentinels
                took = time.monotonic() - started
                assert took < 5.0, f"a new connection took {took:.2f} s"
                assert a.is_open and b.is_open
                return
            # The old primary is back and still answers as a primary for a while; our
            # probes keep running, and none of them reaches it.
            assert group.role(old) == "master"
            before = await _evalsha_calls(old_node)
            acquired = len(probe_ok)
            await asyncio.sleep(1.0)  # the window in which the old primary must stay unused
            # the probe still acquires (waited for: a loaded machine may slow it down)
            await _eventually(lambda: len(probe_ok) > acquired, 10, "the probe to acquire")
            assert await _evalsha_calls(old_node) == before
        finally:
            stop_probe.set()
            holders.leave.set()
            for task in [*holders.tasks, *([probe_task] if probe_task else [])]:
                task.cancel()
            await asyncio.gather(*holders.tasks, return_exceptions=True)
            if probe_task is not None:
                await asyncio.gather(probe_task, return_exceptions=True)
            await a.aclose()
            await b.aclose()
            await old_node.aclose()


async def _take(manager: aiolock.LockManager, name: str) -> None:
    async with manager.lock(name, timeout=30):
        pass


def _replicated(group: SentinelGroup, primary: int, key: str) -> None:
    import redis

    for node in group.nodes:
        if node.port == primary:
            continue
        client = redis.Redis(host=node.host, port=node.port)
        try:
            deadline = time.monotonic() + 10
            while not client.exists(key):
                assert time.monotonic() < deadline, "the grant did not replicate"
                time.sleep(0.02)
        finally:
            client.close()


@pytest.mark.processes
async def test_a_new_connection_does_not_wait_out_redis_py_retries_on_gone_sentinels(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every sentinel stops between two rounds of the watch: a connection opened then asks
    them through redis-py's lookup, which retries each one (redis-py 8: about 10 s for
    three) or fails at once (redis-py 5), and the lock failed with LockConnectionError
    whatever its timeout. The lookup is bounded like one of the watch's questions, a
    failed one is checked by asking every sentinel, and the connection goes to the
    primary last seen."""
    # No round of its own after the first: the window stays open until the test ends it.
    monkeypatch.setattr(PrimaryWatch, "INTERVAL", 60.0)
    with SentinelGroup(replicas=0, sentinels=3) as group:
        async with aiolock.LockManager.from_sentinel(
            group.addresses, SERVICE, prefix=prefix, socket_timeout=1.0
        ) as locks:
            async with locks.lock("before", timeout=2):  # starts the engine and its watch
                pass
            watch = locks._primary_watch
            assert watch is not None
            await _eventually(lambda: watch.primary is not None, 10, "the first round")
            for sentinel in group.sentinels:
                sentinel.stop()
            assert not watch._no_sentinel  # the window: the watch has not noticed yet
            assert isinstance(locks.redis, Redis)
            await locks.redis.connection_pool.disconnect()  # every connection opens anew
            started = time.monotonic()
            async with locks.lock("after", timeout=2):
                pass
            assert time.monotonic() - started < 2 * PrimaryWatch.ASK_TIMEOUT
            # The timed-out lookup woke the watch, whose round found every sentinel gone.
            await _eventually(lambda: watch._no_sentinel, 5, "the watch found no sentinel")
