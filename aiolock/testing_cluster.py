"""A throwaway Redis Cluster for tests and benchmarks: primaries with replicas, on loopback.

:class:`LocalCluster` starts ``primaries * (1 + replicas)`` private ``redis-server``
processes (see :class:`aiolock.testing.RedisServer`) with ``--cluster-enabled yes`` on free
loopback ports, splits the 16384 slots evenly between the primaries, joins the nodes
(``CLUSTER MEET``), attaches the replicas (``CLUSTER REPLICATE``) and waits until every node
reports ``cluster_state:ok``. It stops every process by its pid. It never touches a server
it did not start.

>>> with LocalCluster() as cluster:        # doctest: +SKIP
...     client = redis.asyncio.cluster.RedisCluster.from_url(cluster.url)
"""

from __future__ import annotations

import time
from types import TracebackType

import redis

from aiolock.testing import RedisServer, RedisServerError, free_port

__all__ = ["LocalCluster"]

#: slots of a Redis Cluster
SLOTS = 16384
#: starts of one node on fresh ports before giving up (its ports may be taken meanwhile)
NODE_START_TRIES = 5


class LocalCluster:
    """Private cluster nodes on free loopback ports, stopped by pid on exit.

    Args:
        primaries: primaries, each owning an equal share of the slots (at least 1).
        replicas: replicas per primary.
        node_timeout: ``cluster-node-timeout`` in ms: how long a node may be unreachable
            before the others fail it over (short here so that tests run fast).
        startup_timeout: seconds to wait for the cluster to become ready.
    """

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 1,
        *,
        node_timeout: int = 2000,
        startup_timeout: float = 30.0,
    ) -> None:
        if primaries < 1 or replicas < 0:
            raise ValueError("a cluster needs at least one primary and replicas >= 0")
        self.primaries = primaries
        self.replicas = replicas
        self.node_timeout = node_timeout
        self.startup_timeout = startup_timeout
        self.servers: list[RedisServer] = []
        #: cluster bus port of each node, by its client port
        self._bus: dict[int, int] = {}

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>`` of the first node (any node bootstraps a client)."""
        if not self.servers:
            raise RedisServerError("the cluster is not running")
        return f"redis://{self.servers[0].host}:{self.servers[0].port}"

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.servers if s.pid is not None]

    def start(self) -> LocalCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node by its pid and remove their directories."""
        servers, self.servers = self.servers, []
        for server in servers:
            server.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- administration helpers (synchronous, for tests) --------------------------------

    def node(self, port: int) -> redis.Redis:
        """A plain client of the node on *port* (the caller closes it)."""
        return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)

    def primary_ports(self) -> list[int]:
        """The ports of the nodes that are primaries now."""
        return [p for p, role in self._roles().items() if role == "master"]

    def owner_port(self, slot: int) -> int:
        """The port of the primary that owns *slot* now (asks the first node that answers)."""
        for server in self.servers:
            try:
                with self.node(server.port) as client:
                    for (start, end), owners in self._slots(client).items():
                        if start <= slot <= end:
                            return owners
            except redis.ConnectionError:
                continue
        raise RedisServerError(f"no node of the cluster knows who owns slot {slot}")

    def node_id(self, port: int) -> str:
        with self.node(port) as client:
            return str(client.execute_command("CLUSTER MYID"))

    def wait_ok(self, timeout: float | None = None) -> None:
        """Wait until every running node says ``cluster_state:ok`` and agrees on the slots."""
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        while time.monotonic() < deadline:
            if self._all_ok():
                return
            time.sleep(0.05)
        raise RedisServerError("the cluster did not reach cluster_state:ok in time")

    # -- internals ---------------------------------------------------------------------

    def _start_node(self) -> tuple[RedisServer, int]:
        """One node on a free client port and a free bus port, and the bus port.

        Both ports are picked before the process binds them, so another process (a test
        suite running beside this one starts servers too) may take one meanwhile: the
        node is then started again on two fresh ports, as RedisServer does for its one.
        """
        error: RedisServerError | None = None
        for _ in range(NODE_START_TRIES):
            # The cluster bus defaults to port + 10000, which may be taken or beyond
            # 65535 for a free port picked by the kernel: pick both explicitly.
            bus = free_port()
            args = [
                "--cluster-port", str(bus),
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout),
                # a replica may take over however long it lost its primary (tests
                # kill and fail over nodes on purpose)
                "--cluster-replica-validity-factor", "0",
            ]  # fmt: skip
            server = RedisServer(args, port=free_port())
            try:
                return server.start(), bus
            except RedisServerError as exc:
                error = exc
                server.stop()
        assert error is not None
        raise error

    def _start(self) -> None:
        count = self.primaries * (1 + self.replicas)
        for _ in range(count):
            server, bus = self._start_node()
            self.servers.append(server)
            self._bus[server.port] = bus
        primaries = self.servers[: self.primaries]
        share = SLOTS // self.primaries
        for i, server in enumerate(self.servers):
            with self.node(server.port) as client:
                # distinct epochs, as redis-cli --cluster create sets them
                client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
                if i < self.primaries:
                    first = i * share
                    last = SLOTS - 1 if i == self.primaries - 1 else first + share - 1
                    client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
        with self.node(self.servers[0].port) as client:
            for server in self.servers[1:]:
                client.execute_command(
                    "CLUSTER MEET", server.host, server.port, self._bus[server.port]
                )
        self._wait(lambda: all(len(self._known(s.port)) == count for s in self.servers))
        for i, server in enumerate(self.servers[self.primaries :]):
            primary = primaries[i % self.primaries]
            with self.node(server.port) as client:
                client.execute_command("CLUSTER REPLICATE", self.node_id(primary.port))
        self._wait(lambda: len(self.primary_ports()) == self.primaries and self._synced())
        self.wait_ok()

    def _wait(self, check: object) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if callable(check) and check():
                return
            time.sleep(0.05)
        raise RedisServerError("the cluster nodes did not join in time")

    def _known(self, port: int) -> list[str]:
        with self.node(port) as client:
            nodes = client.execute_command("CLUSTER NODES")  # parsed by redis-py: by address
        return list(nodes)

    @staticmethod
    def _slots(client: redis.Redis) -> dict[tuple[int, int], int]:
        """Slot ranges -> the port of their primary (from CLUSTER SLOTS)."""
        reply = client.execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
        return {(int(r[0]), int(r[1])): int(r[2][1]) for r in reply}

    def _roles(self) -> dict[int, str]:
        roles: dict[int, str] = {}
        for server in self.servers:
            try:
                with self.node(server.port) as client:
                    roles[server.port] = str(client.info("replication")["role"])
            except redis.ConnectionError:
                continue
        return roles

    def _synced(self) -> bool:
        for server in self.servers[self.primaries :]:
            with self.node(server.port) as client:
                info = client.info("replication")
                if info.get("master_link_status") != "up":
                    return False
        return True

    def _all_ok(self) -> bool:
        views = set()
        for server in self.servers:
            try:
                with self.node(server.port) as client:
                    info = client.execute_command("CLUSTER INFO")  # parsed by redis-py
                    if info.get("cluster_state") != "ok":
                        return False
                    slots = self._slots(client)
            except redis.ConnectionError:
                continue
            views.add(tuple(sorted(slots.items())))
        return len(views) == 1
