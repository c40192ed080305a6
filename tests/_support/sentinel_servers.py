"""A throwaway Sentinel deployment for tests: a primary, replicas and sentinels.

Every process is a ``redis-server`` started here on a free loopback port (the sentinels
with ``--sentinel`` and a generated config file) and stopped by its pid. The timings are
short (``down-after-milliseconds`` 1000, ``failover-timeout`` 4000) so that a failover
takes a few seconds, not a minute.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType

from aiolock.testing import RedisServer, RedisServerError, find_redis_server, free_port

__all__ = ["SERVICE", "SentinelGroup"]

SERVICE = "aiolock-test"

#: Options every data node gets: no delay before a (diskless) full sync, so a replica is
#: in sync within milliseconds of starting, and frequent replication pings.
_NODE_ARGS = ["--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1"]


def _command(port: int, *args: str, timeout: float = 2.0) -> bytes:
    """Send one command over a raw socket and return the raw reply (no client library)."""
    payload = b"*%d\r\n" % len(args)
    for arg in args:
        data = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        reply = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
            if reply.endswith(b"\r\n") and _complete(reply):
                break
        return reply


def _complete(reply: bytes) -> bool:
    try:
        return _parse(reply, 0) is not None
    except (ValueError, IndexError):
        return False


def _parse(data: bytes, pos: int) -> int | None:
    """The end of the RESP value at *pos*, or None if it has not fully arrived."""
    end = data.find(b"\r\n", pos)
    if end < 0:
        return None
    kind, header = data[pos : pos + 1], data[pos + 1 : end]
    pos = end + 2
    if kind in (b"+", b"-", b":"):
        return pos
    if kind == b"$":
        size = int(header)
        if size < 0:
            return pos
        return pos + size + 2 if len(data) >= pos + size + 2 else None
    if kind == b"*":
        for _ in range(max(int(header), 0)):
            next_pos = _parse(data, pos)
            if next_pos is None:
                return None
            pos = next_pos
        return pos
    raise ValueError(f"unexpected RESP type {kind!r}")


class _Sentinel:
    def __init__(self, workdir: str, primary_port: int, quorum: int) -> None:
        self.port = free_port()
        self.dir = os.path.join(workdir, f"sentinel-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.config = os.path.join(self.dir, "sentinel.conf")
        with open(self.config, "w") as f:
            f.write(
                f"port {self.port}\n"
                "bind 127.0.0.1\n"
                "daemonize no\n"
                f"dir {self.dir}\n"
                f"logfile {os.path.join(self.dir, 'sentinel.log')}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 4000\n"
                f"sentinel parallel-syncs {SERVICE} 2\n"
            )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [find_redis_server(), self.config, "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )

    def started(self, timeout: float = 20.0) -> bool:
        """Whether this process came up and serves its port: False as soon as it exits
        (it could not bind the port: another process took it after ``free_port()``
        chose it, issue 25). ``INFO server`` must name this process's pid, so a server of
        another suite that took the port is not mistaken for this sentinel."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            try:
                reply = _command(self.port, "INFO", "server")
            except OSError:
                reply = b""
            if f"process_id:{self.process.pid}\r\n".encode() in reply:
                return True
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class SentinelGroup:
    """A primary, *replicas* replicas and *sentinels* sentinels, all on loopback.

    ``addresses`` is the list to give ``redis.asyncio.sentinel.Sentinel``; ``nodes``
    holds the data nodes (primary first at start); :meth:`primary_port` asks the
    sentinels which node is the primary now.
    """

    def __init__(self, *, replicas: int = 1, sentinels: int = 3) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="aiolock-sentinel-")
        self.primary = RedisServer(_NODE_ARGS)
        self.nodes: list[RedisServer] = [self.primary]
        self._replica_count = replicas
        self._sentinel_count = sentinels
        self.sentinels: list[_Sentinel] = []

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def start(self, timeout: float = 20.0) -> SentinelGroup:
        self.primary.start()
        for _ in range(self._replica_count):
            replica = RedisServer([*_NODE_ARGS, "--replicaof", "127.0.0.1", str(self.primary.port)])
            self.nodes.append(replica.start())
        quorum = self._sentinel_count // 2 + 1
        for _ in range(self._sentinel_count):
            self.sentinels.append(self._start_sentinel(quorum, timeout))
        self.wait_ready(timeout)
        return self

    def _start_sentinel(self, quorum: int, timeout: float, attempts: int = 5) -> _Sentinel:
        """A started sentinel; on a fresh port when the one chosen was taken meanwhile."""
        for _ in range(attempts):
            sentinel = _Sentinel(self._tmp.name, self.primary.port, quorum)
            sentinel.start()
            if sentinel.started(timeout):
                return sentinel
            sentinel.stop()
        raise RedisServerError(
            f"no sentinel started in {attempts} attempts of {timeout} s each; see "
            f"{os.path.join(sentinel.dir, 'sentinel.log')}"
        )

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until every sentinel knows every replica (in sync) and the other sentinels."""
        deadline = time.monotonic() + timeout
        want_replicas = len(self.nodes) - 1
        want_others = len(self.sentinels) - 1
        while time.monotonic() < deadline:
            if all(self._sentinel_ready(s, want_replicas, want_others) for s in self.sentinels):
                return
            time.sleep(0.1)
        raise RedisServerError(
            f"the Sentinel group did not become ready within {timeout} s (every sentinel "
            f"knowing {want_replicas} replica(s) in sync and {want_others} other sentinel(s))"
        )

    def _sentinel_ready(self, sentinel: _Sentinel, replicas: int, others: int) -> bool:
        try:
            reply = _command(sentinel.port, "SENTINEL", "MASTER", SERVICE).decode()
        except OSError:
            return False
        words = reply.split("\r\n")
        values = {words[i]: words[i + 2] for i in range(2, len(words) - 2, 4)}
        try:
            return (
                int(values.get("num-slaves", "0")) >= replicas
                and int(values.get("num-other-sentinels", "0")) >= others
                and values.get("flags") == "master"
            )
        except ValueError:
            return False

    def primary_port(self) -> int:
        """The primary's port as the first sentinel that answers sees it."""
        for sentinel in self.sentinels:
            try:
                reply = _command(
                    sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
                ).decode()
            except OSError:
                continue
            parts = reply.split("\r\n")
            if len(parts) >= 5:
                return int(parts[4])
        raise RedisServerError("no sentinel answered")

    def node(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(port)

    def role(self, port: int) -> str:
        """``master`` or ``slave``, as the node itself reports it (ROLE)."""
        reply = _command(port, "ROLE")
        return reply.split(b"\r\n")[2].decode()

    def failover(self) -> None:
        """``SENTINEL FAILOVER`` on the first sentinel (no agreement needed)."""
        reply = _command(self.sentinels[0].port, "SENTINEL", "FAILOVER", SERVICE)
        if not reply.startswith(b"+OK"):
            raise RedisServerError(f"SENTINEL FAILOVER refused: {reply!r}")

    def wait_for_new_primary(self, old_port: int, timeout: float = 15.0) -> int:
        """Until the sentinels name a primary other than *old_port*, which is returned."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                port = self.primary_port()
            except RedisServerError:
                port = old_port
            if port != old_port:
                return port
            time.sleep(0.05)
        raise RedisServerError(f"no failover away from port {old_port} within {timeout} s")

    def signal(self, port: int, sig: signal.Signals) -> None:
        """Send *sig* (SIGSTOP, SIGCONT, SIGKILL) to the data node on *port*, by pid."""
        process = self.node(port).process
        # poll() first: never signal a pid that may have been reused by another process
        if process is None or process.poll() is not None:
            raise RedisServerError(f"node {port} is not running")
        os.kill(process.pid, sig)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                os.kill(node.process.pid, signal.SIGCONT)  # a stopped process cannot exit
            node.stop()
        self._tmp.cleanup()

    def __enter__(self) -> SentinelGroup:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
