"""The Redis Cluster knobs of the robustness suite, on a :class:`LocalCluster`.

* :func:`wait_for_new_owner`: after a primary's SIGKILL, until every node that answers
  names another owner of one of its slots (its replica, promoted by the cluster after
  ``cluster-node-timeout``) and says ``cluster_state:ok``;
* :func:`replica_of`: the replica in sync with a primary (the nemesis may stop it and
  :func:`cut_replicas` before killing the primary, so that it is promoted without the
  last writes), and :func:`take_over`: that replica promoted at once;
* :func:`wait_rejoined`: after the killed node is started again (empty, with its
  ``nodes.conf``), until it is a replica in sync with the new owner of its old slots and
  every node agrees on the slot map again;
* :func:`migrate_slot`: a slot moved to another primary by the steps of a resharding
  (``CLUSTER SETSLOT IMPORTING`` on the target, ``MIGRATING`` on the source, ``MIGRATE``
  of its keys a few at a time with a pause between batches, so that traffic meets the
  half-migrated slot, then ``SETSLOT NODE`` on the target, the source and the other
  primaries).

Every step is bounded in time; one that runs out raises :class:`ClusterOpTimeout`, and
the nemesis logs the fault as failed. Nodes are reached with plain synchronous clients
that time out (run these functions in a thread).
"""

from __future__ import annotations

import time
from typing import Any

import redis

from aiolock.testing_cluster import LocalCluster

#: ``cluster-node-timeout`` of the suite's clusters, ms (LocalCluster's default)
CLUSTER_NODE_TIMEOUT = 2000
#: seconds a failover, a rejoin or the agreement after a migration may take
SETTLE_TIMEOUT = 30.0


class ClusterOpTimeout(RuntimeError):
    """A cluster step did not complete in its time."""


def _node(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True, socket_timeout=5.0)


def tune_cluster_node(port: int) -> None:
    """No delay before a diskless full sync (Redis waits 5 s by default): a node started
    again after a kill is in sync within milliseconds of learning its new primary."""
    with _node(port) as client:
        client.config_set("repl-diskless-sync-delay", 0)


def _slot_map(client: redis.Redis) -> list[tuple[int, int, int]]:
    """``(first slot, last slot, port of the primary)`` from ``CLUSTER SLOTS``."""
    reply = client.execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
    return sorted((int(r[0]), int(r[1]), int(r[2][1])) for r in reply)


def _views(cluster: LocalCluster) -> list[list[tuple[int, int, int]]] | None:
    """The slot map of every node that answers; None while one of them says its
    ``cluster_state`` is not ``ok``."""
    views = []
    for server in cluster.servers:
        try:
            with _node(server.port) as client:
                info = client.execute_command("CLUSTER INFO")  # parsed by redis-py
                if info.get("cluster_state") != "ok":
                    return None
                views.append(_slot_map(client))
        except redis.ConnectionError:  # a node killed (and not started yet) is skipped
            continue
    return views


def agreed_owner(cluster: LocalCluster, slot: int) -> int | None:
    """The port of *slot*'s primary when every node that answers is ``ok`` and names
    the same one; else None."""
    views = _views(cluster)
    if not views:
        return None
    owners = {port for view in views for first, last, port in view if first <= slot <= last}
    return owners.pop() if len(owners) == 1 else None


def _until(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value is not None and value is not False:
            return value
        time.sleep(0.05)
    raise ClusterOpTimeout(f"{what}: not within {timeout:g} s")


def wait_for_new_owner(
    cluster: LocalCluster, slot: int, old_port: int, timeout: float = SETTLE_TIMEOUT
) -> int:
    """Until the nodes agree that another primary than *old_port* owns *slot*: its port."""

    def moved() -> int | None:
        owner = agreed_owner(cluster, slot)
        return owner if owner not in (None, old_port) else None

    port: int = _until(f"failover of slot {slot} away from {old_port}", moved, timeout)
    return port


def replica_of(cluster: LocalCluster, port: int) -> int:
    """The port of a replica of the primary on *port* whose link to it is up."""
    for server in cluster.servers:
        try:
            with _node(server.port) as client:
                info = client.info("replication")
        except redis.ConnectionError:
            continue
        if (
            info.get("role") == "slave"
            and int(info.get("master_port", 0)) == port
            and info.get("master_link_status") == "up"
        ):
            return server.port
    raise ClusterOpTimeout(f"the primary on {port} has no replica in sync")


def cut_replicas(port: int) -> None:
    """``CLIENT KILL TYPE replica`` on the primary on *port*: the writes it acknowledges
    from now on reach no replica until one reconnects (a stopped one cannot)."""
    with _node(port) as client:
        client.client_kill_filter(_type="replica")


def take_over(port: int) -> None:
    """``CLUSTER FAILOVER TAKEOVER`` on the replica on *port*: it makes itself the
    primary of its primary's slots at once, without an election."""
    with _node(port) as client:
        client.execute_command("CLUSTER FAILOVER", "TAKEOVER")


def wait_rejoined(cluster: LocalCluster, port: int, timeout: float = SETTLE_TIMEOUT) -> int:
    """Until the node on *port* (started again) is a replica with its link to its primary
    up and every node agrees on the slot map: the port of its primary."""

    def replica_in_sync() -> int | None:
        try:
            with _node(port) as client:
                info = client.info("replication")
        except redis.ConnectionError:
            return None
        if info.get("role") != "slave" or info.get("master_link_status") != "up":
            return None
        views = _views(cluster)
        if not views or any(view != views[0] for view in views):
            return None
        return int(info["master_port"])

    primary: int = _until(f"node {port} back as a replica", replica_in_sync, timeout)
    return primary


def migrate_slot(
    cluster: LocalCluster,
    slot: int,
    target: int,
    *,
    batch: int = 1,
    pause: float = 0.5,
    paced_for: float = 5.0,
) -> dict[str, Any]:
    """Move *slot* from its primary to the primary on port *target*.

    Keys go *batch* at a time with *pause* seconds before each ``MIGRATE`` (traffic
    meanwhile meets the slot half-migrated: ``ASK`` and ``TRYAGAIN``); after *paced_for*
    seconds the rest go without pauses. Keys in a migrating slot only leave the source
    (a command whose keys are all missing there is sent to the target), so the loop ends;
    past :data:`SETTLE_TIMEOUT` it raises, and the slot stays half-migrated.
    """
    source = agreed_owner(cluster, slot)
    if source is None:
        raise ClusterOpTimeout(f"the nodes do not agree on the owner of slot {slot}")
    if source == target:
        raise ValueError(f"slot {slot} is on {target} already")
    source_id, target_id = cluster.node_id(source), cluster.node_id(target)
    moved = 0
    began = time.monotonic()
    with _node(source) as src, _node(target) as dst:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        marked = time.monotonic_ns()
        while True:
            spent = time.monotonic() - began
            if spent > SETTLE_TIMEOUT:  # the slot is left half-migrated: the run says so
                raise ClusterOpTimeout(f"slot {slot}: keys still on {source} after {spent:.0f} s")
            if spent < paced_for:
                time.sleep(pause)
            keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        dst.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        src.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    assigned = time.monotonic_ns()
    for port in cluster.primary_ports():
        if port not in (source, target):
            with _node(port) as other:
                other.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    _until(
        f"slot {slot} owned by {target} everywhere",
        lambda: agreed_owner(cluster, slot) == target,
        SETTLE_TIMEOUT,
    )
    return {
        "source": source,
        "target": target,
        "keys": moved,
        "marked": marked,
        "assigned": assigned,
    }
