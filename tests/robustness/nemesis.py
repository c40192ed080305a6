"""The nemesis: faults injected on a seeded schedule, each logged with its window.

A scenario's plan is either a random one (``faults``: weights and parameters per fault,
``gap``: the pause between two faults, drawn from the seed) or a fixed ``schedule`` of
``[seconds after the start, fault, parameters]`` for the scenarios that reproduce one
defect. Faults run one at a time. Each writes a ``begin`` line and, when healed, a
``fault`` line with its window ``t0``..``t1`` (``time.monotonic_ns()``, the workers'
clock) and its class:

* ``disruption``: the deployment keeps every acknowledged write (a client killed or
  stopped, ``CLIENT KILL``, Redis stopped with SIGSTOP, latency, a restart from an
  AOF with ``appendfsync always``, a cluster slot migrated). The library must stay
  safe through it.
* ``state_loss``: Redis forgets or changes lock state behind the holders' backs (a
  restart without persistence, an outage that ends in one, a primary killed or failed
  over, a force-release by an administrator). Exclusion cannot hold until the holders
  learn, so overlaps inside these windows are measured (how late holders learned), not
  counted as violations.

The catalogue (parameters in brackets):

==================  ===========================================================
``kill_client``     SIGKILL a worker [``respawn``: seconds until a new one starts]
``pause_client``    SIGSTOP a worker, SIGCONT after [``seconds``]
``client_kill``     ``CLIENT KILL TYPE normal`` and ``TYPE pubsub`` on every data node
``pause_redis``     SIGSTOP the primary (or [``node``]) for [``seconds``]
``latency``         [``latency``] plus up to [``jitter``] seconds per chunk on the proxy
                    of [``node``] for [``seconds``]; with [``existing_only``] only on the
                    connections open at the start (a slow flow)
``restart_redis``   SIGKILL the server and start it again at once (from its AOF if the
                    topology has one, else empty)
``outage``          SIGKILL the server; connections are refused for [``seconds``]; then
                    start it again
``force_release``   an administrator's ``force_release()`` of the plain lock [``names``]
``failover``        ``SENTINEL FAILOVER``, until the sentinels name the new primary
``kill_primary``    SIGKILL the primary; after the failover, start it again empty
                    [``down``: seconds it stays down]; on a Redis Cluster, the primary
                    of one of [``names``]: its replica is promoted after
                    ``cluster-node-timeout``, the killed node comes back empty with its
                    ``nodes.conf`` and rejoins as the new primary's replica; with
                    [``lag``], the replica is stopped and cut off that many seconds
                    before the kill (promoted without the writes of those seconds); with
                    [``takeover``], it is promoted at once by ``CLUSTER FAILOVER
                    TAKEOVER`` (before the holds of its copy expire)
``migrate_slot``    (Redis Cluster) move the slot of one of [``names``] to another
                    primary: ``SETSLOT IMPORTING``/``MIGRATING``, ``MIGRATE`` of
                    [``batch``] keys at a time after [``pause``] seconds each,
                    ``SETSLOT NODE`` on every primary (:mod:`.cluster_ops`)
==================  ===========================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.crc import key_slot

import aiolock
from tests.robustness import cluster_ops
from tests.robustness.topology import Topology

DISRUPTION = "disruption"
STATE_LOSS = "state_loss"
CONDITION = "condition"


class Fleet(Protocol):
    """The workers, as the runner keeps them."""

    def live(self) -> list[str]: ...
    def kill(self, label: str) -> None: ...
    def respawn(self, label: str) -> str: ...
    def pause(self, label: str) -> None: ...
    def resume(self, label: str) -> None: ...


class Nemesis:
    def __init__(
        self,
        plan: dict[str, Any],
        topology: Topology,
        fleet: Fleet,
        log_path: str,
        seed: int,
        prefix: str,
    ) -> None:
        self.plan = plan
        self.topology = topology
        self.fleet = fleet
        self.rng = random.Random(f"{seed}/nemesis")
        self.fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.prefix = prefix
        self.count = 0
        self.failures: list[str] = []

    def log(self, **fields: Any) -> None:
        record = {"w": time.time(), **fields}
        os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    async def run(self, start_ns: int, stop_ns: int) -> None:
        """Inject faults until *stop_ns* (less the time the next fault needs)."""
        try:
            if "schedule" in self.plan:
                for at, fault, params in self.plan["schedule"]:
                    await _sleep_until(start_ns + int(at * 1e9))
                    if time.monotonic_ns() >= stop_ns:
                        break
                    await self.inject(fault, params)
                return
            faults = self.plan.get("faults", {})
            if not faults:
                return
            names = sorted(faults)
            weights = [faults[n].get("weight", 1.0) for n in names]
            gap = self.plan.get("gap", [1.0, 3.0])
            await _sleep_until(start_ns + int(self.plan.get("start_after", 2.0) * 1e9))
            while True:
                await asyncio.sleep(self.rng.uniform(*gap))
                fault = self.rng.choices(names, weights)[0]
                params = faults[fault]
                room = params.get("seconds", 0) + params.get("down", 0) + 3.0
                if time.monotonic_ns() + room * 1e9 >= stop_ns:
                    break
                await self.inject(fault, params)
        finally:
            os.close(self.fd)

    async def inject(self, fault: str, params: dict[str, Any]) -> None:
        self.count += 1
        number = self.count
        action: Callable[[dict[str, Any]], Awaitable[tuple[str, dict[str, Any]]]]
        action = getattr(self, f"_{fault}")
        t0 = time.monotonic_ns()
        self.log(ev="begin", n=number, fault=fault, t=t0)
        try:
            cls, detail = await action(params)
        except Exception as exc:  # a fault that could not be injected is logged, not fatal
            cls, detail = DISRUPTION, {"failed": f"{type(exc).__name__}: {exc}"}
            self.failures.append(f"{fault}: {type(exc).__name__}: {exc}")
        t1 = time.monotonic_ns()
        self.log(ev="fault", n=number, fault=fault, cls=cls, t0=t0, t1=t1, **detail)

    # -- clients -------------------------------------------------------------------------

    def _pick_worker(self) -> str:
        live = self.fleet.live()
        if not live:
            raise RuntimeError("no live worker")
        return self.rng.choice(sorted(live))

    async def _kill_client(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        label = self._pick_worker()
        self.fleet.kill(label)
        killed_at = time.monotonic_ns()
        await asyncio.sleep(params.get("respawn", 1.0))
        new = self.fleet.respawn(label)
        return DISRUPTION, {"target": label, "killed_at": killed_at, "respawned": new}

    async def _pause_client(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        label = self._pick_worker()
        self.fleet.pause(label)
        try:
            await asyncio.sleep(params.get("seconds", 2.0))
        finally:
            self.fleet.resume(label)
        return DISRUPTION, {"target": label}

    # -- servers -------------------------------------------------------------------------

    def _data_urls(self) -> list[str]:
        return [node.url for node in self.topology.nodes]

    async def _client_kill(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        killed = 0
        for url in self._data_urls():
            admin = Redis.from_url(url, socket_timeout=2.0)
            try:
                with contextlib.suppress(Exception):  # a node that is down is skipped
                    killed += int(await admin.client_kill_filter(_type="normal", skipme=True))
                    killed += int(await admin.client_kill_filter(_type="pubsub"))
            finally:
                await admin.aclose()
        return DISRUPTION, {"connections": killed}

    def _node(self, params: dict[str, Any]) -> int:
        node = params.get("node", "primary")
        return self.topology.primary_index() if node == "primary" else int(node)

    async def _pause_redis(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = self._node(params)
        self.topology.pause(index)
        try:
            await asyncio.sleep(params.get("seconds", 1.0))
        finally:
            self.topology.resume(index)
        # under Sentinel (or on a cluster), a pause past down-after-milliseconds (the
        # node timeout) may end in a failover
        cls = STATE_LOSS if self.topology.kind in ("sentinel", "cluster") else DISRUPTION
        return cls, {"node": index}

    async def _latency(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = int(params.get("node", 0))
        proxy = self.topology.proxies[index]
        latency, jitter = params.get("latency", 0.1), params.get("jitter", 0.0)
        existing_only = params.get("existing_only", False)
        proxy.set_latency(latency, jitter=jitter, existing_only=existing_only)
        try:
            await asyncio.sleep(params.get("seconds", 2.0))
        finally:
            proxy.set_latency(0.0)
        # a latency that lasts the whole run is the scenario's condition, not a fault
        cls = CONDITION if params.get("condition") else DISRUPTION
        return cls, {
            "node": index,
            "latency": latency,
            "jitter": jitter,
            "existing_only": existing_only,
        }

    def _loses_state(self) -> bool:
        return not (self.topology.kind == "single" and self.topology.aof)

    async def _restart_redis(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = self._node(params)
        self.topology.kill(index)
        await asyncio.to_thread(self.topology.restart, index)
        cls = STATE_LOSS if self._loses_state() else DISRUPTION
        return cls, {"node": index, "aof": self.topology.aof}

    async def _outage(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = self._node(params)
        self.topology.kill(index)
        down_at = time.monotonic_ns()
        await asyncio.sleep(params.get("seconds", 5.0))
        up_at = time.monotonic_ns()
        await asyncio.to_thread(self.topology.restart, index)
        cls = STATE_LOSS if self._loses_state() else DISRUPTION
        # the window in which connections were refused, for the outage check
        return cls, {"node": index, "down": [down_at, up_at], "aof": self.topology.aof}

    async def _force_release(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        name = self.rng.choice(params["names"])
        url = self.topology.nodes[self.topology.primary_index()].url
        redis = Redis.from_url(url, socket_timeout=2.0)
        try:
            async with aiolock.LockManager(redis, prefix=self.prefix, identity=False) as admin:
                at = time.monotonic_ns()
                freed = await admin.lock(name).force_release()
        finally:
            await redis.aclose()
        return STATE_LOSS, {"name": name, "res": f"lock:{name}", "freed": freed, "at": at}

    async def _failover(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        old = self.topology.primary_index()
        self.topology.failover()
        new = await asyncio.to_thread(self.topology.wait_for_failover, old)
        return STATE_LOSS, {"old": old, "new": new}

    async def _kill_primary(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if self.topology.kind == "cluster":
            return await self._kill_cluster_primary(params)
        old = self.topology.primary_index()
        self.topology.kill(old)
        new = await asyncio.to_thread(self.topology.wait_for_failover, old, 30.0)
        await asyncio.sleep(params.get("down", 1.0))
        await asyncio.to_thread(self.topology.restart, old)  # empty: it rejoins as a replica
        return STATE_LOSS, {"old": old, "new": new}

    # -- Redis Cluster -------------------------------------------------------------------

    async def _kill_cluster_primary(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """SIGKILL the primary of a name's slot; once the cluster has promoted its
        replica, start it again (empty: no persistence) to rejoin as a replica. With
        ``lag``, the replica is stopped (SIGSTOP) and its link cut (``CLIENT KILL TYPE
        replica`` on the primary) that many seconds before the kill, and continued
        right after it: it lacks the writes of those seconds when promoted (a lagging
        replica, which is how a failover loses acknowledged grants). With
        ``takeover``, the replica is promoted at once (``CLUSTER FAILOVER TAKEOVER``)
        instead of after the cluster's failure detection: its copy of the holds has not
        expired yet, as when leases outlast the failover (``cluster-node-timeout`` is
        15 s by default, leases are often longer)."""
        cluster = self.topology.local_cluster()
        name = self.rng.choice(params["names"])
        slot = key_slot(name.encode())
        old_port = await asyncio.to_thread(cluster_ops.agreed_owner, cluster, slot)
        if old_port is None:
            raise RuntimeError(f"the nodes do not agree on the owner of slot {slot}")
        old = self.topology.index_of(old_port)
        lag, takeover = params.get("lag", 0.0), params.get("takeover", False)
        replica_port = 0
        if lag or takeover:
            replica_port = await asyncio.to_thread(cluster_ops.replica_of, cluster, old_port)
        lagging = self.topology.index_of(replica_port) if lag else None
        try:
            if lagging is not None:
                self.topology.pause(lagging)
                # what the primary sent before this is in the stopped replica's socket
                # and will be read; what it acknowledges from now on never reaches it
                await asyncio.to_thread(cluster_ops.cut_replicas, old_port)
                await asyncio.sleep(lag)
            self.topology.kill(old)
        finally:
            if lagging is not None:
                self.topology.resume(lagging)
        killed_at = time.monotonic_ns()
        try:
            if takeover:  # promoted at once, with its copy as it is (no election)
                await asyncio.to_thread(cluster_ops.take_over, replica_port)
            wait = cluster_ops.wait_for_new_owner
            new_port = await asyncio.to_thread(wait, cluster, slot, old_port)
            agreed_at = time.monotonic_ns()
        finally:  # a failover that did not come still ends with the node started again
            await asyncio.sleep(params.get("down", 1.0))
            await asyncio.to_thread(self.topology.restart, old)
        restarted_at = time.monotonic_ns()
        await asyncio.to_thread(cluster_ops.wait_rejoined, cluster, old_port)
        return STATE_LOSS, {
            "name": name,
            "slot": slot,
            "old": old,
            "new": self.topology.index_of(new_port),
            "lag": lag,
            "takeover": takeover,
            "killed_at": killed_at,
            "agreed_at": agreed_at,
            "restarted_at": restarted_at,
        }

    async def _migrate_slot(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Move the slot of a name to another primary while traffic runs: Redis keeps
        each key on one node throughout, so no state is lost (a disruption)."""
        cluster = self.topology.local_cluster()
        name = self.rng.choice(params["names"])
        slot = key_slot(name.encode())
        owner = await asyncio.to_thread(cluster_ops.agreed_owner, cluster, slot)
        primaries = await asyncio.to_thread(cluster.primary_ports)
        target = self.rng.choice(sorted(p for p in primaries if p != owner))
        done = await asyncio.to_thread(
            cluster_ops.migrate_slot,
            cluster,
            slot,
            target,
            batch=params.get("batch", 1),
            pause=params.get("pause", 0.5),
        )
        done["source"] = self.topology.index_of(done["source"])
        done["target"] = self.topology.index_of(done["target"])
        return DISRUPTION, {"name": name, "slot": slot, **done}


async def _sleep_until(t_ns: int) -> None:
    left = (t_ns - time.monotonic_ns()) / 1e9
    if left > 0:
        await asyncio.sleep(left)
