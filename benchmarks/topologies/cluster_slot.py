"""Keys per slot under a steady lock load on a Redis Cluster, and what they cost a migration.

``python -m benchmarks.topologies.cluster_slot [--seconds S]`` starts a throwaway cluster of 3
primaries on loopback ports (:class:`aiolock.testing_cluster.LocalCluster`) and runs, for
each load below, two managers whose tasks take locks of ONE slot in turn (10 ms holds) for
``S`` seconds (default 16). Every 2 s it counts the keys in that slot by kind (the lock
itself, its fence key, release tombstones ``:rel:``, void markers ``:void:``), then it
migrates the slot to another primary twice, the way ``redis-cli --cluster reshard`` does
(``MIGRATE`` in batches of 10 keys), and reports how long each migration took while the
load went on, and the acquisitions that failed.

* ``one name``: 6 tasks on one lock name;
* ``12 names``: 24 tasks on 12 names that share one slot.

Every loop is bounded by its duration; every acquire has a 20 s timeout. The cluster's
processes are stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import time
import uuid

from redis.crc import key_slot

import aiolock
from aiolock.testing_cluster import LocalCluster

#: keys moved per MIGRATE, as redis-cli --cluster reshard's default --cluster-pipeline
BATCH = 10


def names_in_one_slot(stem: str, count: int) -> list[str]:
    slot = key_slot(f"{stem}0".encode())
    names = []
    for i in range(16384 * count * 4):
        if key_slot(f"{stem}{i}".encode()) == slot:
            names.append(f"{stem}{i}")
            if len(names) == count:
                return names
    raise RuntimeError("not enough names in one slot")


def census(cluster: LocalCluster, slot: int) -> collections.Counter[str]:
    """Keys in *slot* by kind: the part of the key after the hash tag."""
    with cluster.node(cluster.owner_port(slot)) as node:
        keys = node.execute_command("CLUSTER GETKEYSINSLOT", slot, 1_000_000)
    kinds: collections.Counter[str] = collections.Counter()
    for key in keys:
        tail = str(key).rsplit("}", 1)[1]
        kinds[tail.split(":")[1] if tail else "lock"] += 1
    return kinds


def migrate(cluster: LocalCluster, slot: int) -> float:
    """Move *slot* to another primary; seconds from IMPORTING to the last SETSLOT NODE."""
    source = cluster.owner_port(slot)
    target = next(p for p in cluster.primary_ports() if p != source)
    source_id, target_id = cluster.node_id(source), cluster.node_id(target)
    started = time.monotonic()
    with cluster.node(source) as src, cluster.node(target) as dst:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        for _ in range(100_000):
            keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, BATCH)
            if not keys:
                break
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        dst.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        src.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    took = time.monotonic() - started
    for port in cluster.primary_ports():
        if port not in (source, target):
            with cluster.node(port) as other:
                other.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    return took


async def run_load(
    cluster: LocalCluster, label: str, names: list[str], tasks: int, seconds: float
) -> None:
    slot = key_slot(names[0].encode())
    prefix = f"residue-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    releases = 0
    errors: collections.Counter[str] = collections.Counter()

    async def worker(locks: aiolock.LockManager) -> None:
        nonlocal releases
        while not stop.is_set():
            try:
                async with locks.lock(random.choice(names), timeout=20):
                    await asyncio.sleep(0.01)
                releases += 1
            except aiolock.LockError as exc:
                errors[type(exc).__name__] += 1
                await asyncio.sleep(0.05)

    async with (
        aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix) as a,
        aiolock.LockManager.from_url(cluster.url, cluster=True, prefix=prefix) as b,
    ):
        running = [asyncio.create_task(worker(m)) for m in (a, b) for _ in range(tasks // 2)]
        try:
            started = time.monotonic()
            for step in range(int(seconds // 2)):
                await asyncio.sleep(2)
                kinds = census(cluster, slot)
                rate = releases / (time.monotonic() - started)
                print(
                    f"{label}: t={2 * step + 2:3d} s  {rate:5.0f} releases/s  "
                    f"{sum(kinds.values()):5d} keys in the slot {dict(kinds)}",
                    flush=True,
                )
            for move in (1, 2):
                keys = sum(census(cluster, slot).values())
                took = await asyncio.to_thread(migrate, cluster, slot)
                print(f"{label}: migration {move}: {keys} keys, {took * 1000:.0f} ms", flush=True)
                await asyncio.sleep(2)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*running), 60)
    print(f"{label}: {releases} releases, failed acquisitions: {dict(errors)}", flush=True)


async def main(seconds: float) -> None:
    with LocalCluster(primaries=3, replicas=0) as cluster:
        await run_load(cluster, "one name", ["residue-hot"], 6, seconds)
        await run_load(cluster, "12 names", names_in_one_slot("residue-", 12), 24, seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=16.0, help="steady load before migrating")
    asyncio.run(main(parser.parse_args().seconds))
