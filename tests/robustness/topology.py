"""The Redis deployments a scenario runs on, with the knobs the nemesis turns.

* ``single``: one ``redis-server`` (with ``aof=True``: ``appendonly yes``, ``appendfsync
  always``, so a SIGKILL loses nothing acknowledged);
* ``redlock``: three independent servers;
* ``sentinel``: a primary, a replica and three sentinels
  (:class:`tests._support.sentinel_servers.SentinelGroup`, down-after 1000 ms);
* ``cluster``: a Redis Cluster of three primaries with a replica each
  (:class:`aiolock.testing_cluster.LocalCluster`, ``cluster-node-timeout`` 2000 ms), with
  the knobs of :mod:`tests.robustness.cluster_ops` (a primary killed and rejoined, a slot
  migrated).

Any data node may get a :class:`~tests._support.proxy.FaultProxy` in front of it (the
workers a scenario says connect through it). Every process is started on a free loopback
port and stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from aiolock.testing import RedisServer
from aiolock.testing_cluster import LocalCluster
from tests._support.proxy import FaultProxy
from tests._support.sentinel_servers import SERVICE, SentinelGroup
from tests.robustness.cluster_ops import CLUSTER_NODE_TIMEOUT, tune_cluster_node

#: options of a server whose writes survive a SIGKILL
AOF_ARGS = ["--appendonly", "yes", "--appendfsync", "always"]


class Topology:
    """Servers (and proxies) of one scenario; :meth:`connect` says how workers reach them."""

    def __init__(
        self, kind: str, *, aof: bool = False, proxied: tuple[int, ...] = (), seed: int = 0
    ) -> None:
        if kind not in ("single", "redlock", "sentinel", "cluster"):
            raise ValueError(f"unknown topology {kind!r}")
        self.kind = kind
        self.aof = aof
        self.proxied = proxied
        self.seed = seed
        self.nodes: list[RedisServer] = []
        self.group: SentinelGroup | None = None
        self.cluster: LocalCluster | None = None
        self.proxies: dict[int, FaultProxy] = {}
        #: nodes stopped with SIGSTOP (so that a stop or a kill continues them first)
        self.paused: set[int] = set()

    # -- lifecycle ---------------------------------------------------------------------

    def start_servers(self) -> None:
        if self.kind == "sentinel":
            self.group = SentinelGroup(replicas=1, sentinels=3)
            self.group.start()
            self.nodes = self.group.nodes
            return
        if self.kind == "cluster":
            self.cluster = LocalCluster(primaries=3, replicas=1, node_timeout=CLUSTER_NODE_TIMEOUT)
            self.cluster.start()
            self.nodes = list(self.cluster.servers)
            for node in self.nodes:
                tune_cluster_node(node.port)
            return
        count = 3 if self.kind == "redlock" else 1
        for _ in range(count):
            self.nodes.append(RedisServer(AOF_ARGS if self.aof else ()).start())

    async def start_proxies(self) -> None:
        for index in self.proxied:
            node = self.nodes[index]
            proxy = FaultProxy("127.0.0.1", node.port, seed=self.seed * 100 + index)
            self.proxies[index] = await proxy.start()

    async def stop(self) -> None:
        for proxy in self.proxies.values():
            await proxy.stop()
        for index in list(self.paused):
            self.resume(index)
        if self.group is not None:
            self.group.stop()
        elif self.cluster is not None:
            self.cluster.stop()
        else:
            for node in self.nodes:
                node.stop()

    # -- how workers connect -------------------------------------------------------------

    def url(self, index: int = 0, *, proxied: bool = False) -> str:
        if proxied:
            return self.proxies[index].url
        return self.nodes[index].url

    def connect(self, *, proxied: bool = False) -> dict[str, Any]:
        """The ``connect`` part of a worker's spec."""
        if self.kind == "redlock":
            urls = [self.url(i, proxied=proxied and i in self.proxies) for i in range(3)]
            return {"redlock": urls}
        if self.kind == "sentinel":
            assert self.group is not None
            return {"sentinel": [list(a) for a in self.group.addresses], "service": SERVICE}
        if self.kind == "cluster":  # every node bootstraps the client's slot map
            return {"cluster": [[node.host, node.port] for node in self.nodes]}
        return {"url": self.url(0, proxied=proxied)}

    # -- knobs ---------------------------------------------------------------------------

    def primary_index(self) -> int:
        if self.cluster is not None:  # a cluster has several: the first one
            ports = set(self.cluster.primary_ports())
            return next(i for i, node in enumerate(self.nodes) if node.port in ports)
        if self.group is None:
            return 0
        port = self.group.primary_port()
        return next(i for i, node in enumerate(self.nodes) if node.port == port)

    def index_of(self, port: int) -> int:
        return next(i for i, node in enumerate(self.nodes) if node.port == port)

    def local_cluster(self) -> LocalCluster:
        if self.cluster is None:
            raise RuntimeError(f"the {self.kind} topology is not a Redis Cluster")
        return self.cluster

    def pid(self, index: int) -> int:
        process = self.nodes[index].process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"node {index} is not running")
        return process.pid

    def pause(self, index: int) -> None:
        os.kill(self.pid(index), signal.SIGSTOP)
        self.paused.add(index)

    def resume(self, index: int) -> None:
        if index in self.paused:
            self.paused.discard(index)
            with contextlib.suppress(RuntimeError, ProcessLookupError):
                os.kill(self.pid(index), signal.SIGCONT)

    def kill(self, index: int) -> None:
        """SIGKILL the node (by pid) and reap it; its port then refuses connections."""
        node = self.nodes[index]
        process = node.process
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGKILL)
        self.paused.discard(index)
        process.wait(timeout=10)

    def restart(self, index: int) -> None:
        """Start a killed node again on its port: from its AOF if it has one (single
        topology with ``aof``), else empty (a cluster node keeps its ``nodes.conf``: its
        id, its peers and its bus port)."""
        node = self.nodes[index]
        node.restart()  # the process is dead: restart() only starts it again
        if self.cluster is not None:
            tune_cluster_node(node.port)

    def wait_for_failover(self, old_index: int, timeout: float = 20.0) -> int:
        assert self.group is not None
        new_port = self.group.wait_for_new_primary(self.nodes[old_index].port, timeout)
        return next(i for i, node in enumerate(self.nodes) if node.port == new_port)

    def failover(self) -> None:
        assert self.group is not None
        self.group.failover()

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "aof": self.aof,
            "nodes": [node.port for node in self.nodes],
            "proxied": list(self.proxied),
            "sentinels": [] if self.group is None else [p for _, p in self.group.addresses],
            "primaries": [] if self.cluster is None else sorted(self.cluster.primary_ports()),
        }


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
