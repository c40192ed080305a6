"""Private ``redis-server`` processes with ACL users or TLS, built on
:class:`aiolock.testing.RedisServer` (loopback only, stopped by pid).

ACL::

    with acl_server(prefix="aiolock") as server:
        Redis.from_url(server.url_for("locker"))      # every command in AIOLOCK_COMMANDS
        Redis.from_url(server.url_for("noscript"))    # the same minus EVAL / EVALSHA
        Redis.from_url(server.url_for("otherkeys"))   # everything, but only ~other:* keys
        Redis.from_url(server.admin_url)              # the default user: +@all ~* &*

TLS::

    with tempfile.TemporaryDirectory() as d, TlsRedisServer(make_tls_material(d)) as server:
        Redis.from_url(server.url, ssl_ca_certs=server.material.ca_cert)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from aiolock._redis.scripts import REQUIRED_COMMANDS
from aiolock.testing import RedisServer, RedisServerError, find_redis_server, free_port

__all__ = [
    "AIOLOCK_COMMANDS",
    "AclRedisServer",
    "AclUser",
    "TlsMaterial",
    "TlsRedisServer",
    "acl_server",
    "make_tls_material",
    "redis_tls_support",
    "tls_server",
]

#: Commands a client of aiolock may need, for the ACL user that is allowed everything
#: aiolock does. Redis 7 checks ACLs for the commands a Lua script calls too, so the list
#: includes what the scripts may call (``HSET``, ``PEXPIRE``, ...) as well as what the
#: client sends. ``script|load`` style entries name one subcommand. Adjust once the
#: scripts under ``aiolock/_kinds`` and ``aiolock/_redlock`` are final; pass your own list to
#: :func:`acl_server`.
AIOLOCK_COMMANDS: tuple[str, ...] = (
    *REQUIRED_COMMANDS,  # what aiolock itself sends and calls from its scripts
    # what redis-py and the tests' own checks send
    "eval", "info", "echo", "client|id", "client|setname", "client|getname",
)  # fmt: skip

#: what the ``noscript`` user of :func:`acl_server` lacks
NO_SCRIPT_DENIED: tuple[str, ...] = ("evalsha", "eval")


def _secret() -> str:
    return secrets.token_hex(16)


@dataclasses.dataclass(frozen=True)
class AclUser:
    """A Redis ACL user: password-protected, limited to *commands*, to keys starting with
    ``key_prefix:`` and to channels starting with ``channel_prefix:``."""

    name: str
    password: str
    commands: tuple[str, ...]
    key_prefix: str
    channel_prefix: str

    @classmethod
    def make(
        cls,
        name: str,
        *,
        prefix: str,
        commands: Iterable[str] = AIOLOCK_COMMANDS,
        denied: Iterable[str] = (),
        password: str | None = None,
        channel_prefix: str | None = None,
    ) -> AclUser:
        """*commands* minus *denied*, keys ``~prefix:*``, channels ``&prefix:*``."""
        deny = {c.lower() for c in denied}
        allowed = tuple(c for c in commands if c.lower() not in deny)
        return cls(
            name=name,
            password=password or _secret(),
            commands=allowed,
            key_prefix=prefix,
            channel_prefix=prefix if channel_prefix is None else channel_prefix,
        )

    def rules(self) -> list[str]:
        """The ACL rules, as the arguments after ``--user <name>``."""
        for word in (self.name, self.password, self.key_prefix, self.channel_prefix):
            if not word or any(ch.isspace() for ch in word):
                raise ValueError(f"ACL words must be non-empty and unspaced, got {word!r}")
        return [
            "reset",
            "on",
            f">{self.password}",
            f"~{self.key_prefix}:*",
            f"&{self.channel_prefix}:*",
            "-@all",
            *(f"+{command}" for command in self.commands),
        ]


class AclRedisServer(RedisServer):
    """A :class:`RedisServer` whose ``default`` user needs a password, with more users.

    The default user keeps ``+@all ~* &*`` (for set-up and inspection, see
    :attr:`admin_url`); the readiness PING authenticates as it.
    """

    def __init__(
        self,
        users: Sequence[AclUser],
        *,
        admin_password: str | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 10.0,
    ) -> None:
        self.admin_password = admin_password or _secret()
        self.users = {user.name: user for user in users}
        if "default" in self.users:
            raise ValueError("the default user is the admin; name the test users otherwise")
        args = ["--user", "default", "reset", "on", f">{self.admin_password}"]
        args += ["~*", "&*", "+@all"]
        for user in users:
            args += ["--user", user.name, *user.rules()]
        super().__init__(
            [*args, *extra_args],
            password=self.admin_password,
            startup_timeout=startup_timeout,
        )

    def url_for(self, user: str) -> str:
        """``redis://<user>:<password>@127.0.0.1:<port>/0``."""
        acl = self.users[user]
        return f"redis://{acl.name}:{acl.password}@{self.host}:{self.port}/0"

    @property
    def admin_url(self) -> str:
        return f"redis://default:{self.admin_password}@{self.host}:{self.port}/0"

    def __enter__(self) -> AclRedisServer:
        self.start()
        return self


def acl_server(
    prefix: str = "aiolock",
    *,
    commands: Iterable[str] = AIOLOCK_COMMANDS,
    denied: Iterable[str] = NO_SCRIPT_DENIED,
) -> AclRedisServer:
    """An (unstarted) ACL server with three users, all limited to ``~prefix:*`` keys and
    ``&prefix:*`` channels unless said otherwise:

    * ``locker``: *commands*;
    * ``noscript``: *commands* minus *denied* (default: ``evalsha``, ``eval``);
    * ``otherkeys``: *commands*, but keys and channels ``other-<prefix>:*`` only.
    """
    commands = tuple(commands)
    return AclRedisServer(
        [
            AclUser.make("locker", prefix=prefix, commands=commands),
            AclUser.make("noscript", prefix=prefix, commands=commands, denied=denied),
            AclUser.make("otherkeys", prefix=f"other-{prefix}", commands=commands),
        ]
    )


# -- TLS -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TlsMaterial:
    """PEM files of a throwaway CA, a server certificate for ``127.0.0.1`` / ``localhost``
    / ``::1`` and a client certificate, all signed by that CA."""

    directory: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_material(directory: str | os.PathLike[str]) -> TlsMaterial:
    """Generate a CA plus server and client certificates (with ``trustme``) in *directory*."""
    import trustme

    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="aiolock tests")
    server = ca.issue_cert("127.0.0.1", "localhost", "::1")
    client = ca.issue_cert("aiolock-test-client@example.org")
    material = TlsMaterial(
        directory=where,
        ca_cert=where / "ca.pem",
        server_cert=where / "server.pem",
        server_key=where / "server.key",
        client_cert=where / "client.pem",
        client_key=where / "client.key",
    )
    ca.cert_pem.write_to_path(str(material.ca_cert))
    server.private_key_pem.write_to_path(str(material.server_key))
    client.private_key_pem.write_to_path(str(material.client_key))
    with material.server_cert.open("wb") as f:
        for blob in server.cert_chain_pems:
            f.write(blob.bytes())
    with material.client_cert.open("wb") as f:
        for blob in client.cert_chain_pems:
            f.write(blob.bytes())
    return material


def redis_tls_support(binary: str | None = None) -> tuple[bool, str]:
    """Whether this server build can serve TLS, with the evidence.

    Runs it with a TLS port and certificate files that do not exist: a build with TLS
    exits at once failing to configure TLS, a build without it (Redis: "Bad directive";
    Valkey: "Failed finding TLS support") exits too. Nothing ever listens. A build that
    binds the port before it loads the certificates may find the port taken by another
    suite running at the same time (issue 25): then the probe runs again on a fresh port.
    """
    binary = binary or find_redis_server()
    missing = os.path.join(tempfile.gettempdir(), "aiolock-no-such-dir", "missing.pem")
    for _ in range(5):
        try:
            done = subprocess.run(
                [
                    binary, "--port", "0", "--tls-port", str(free_port()), "--bind", "127.0.0.1",
                    "--save", "", "--tls-cert-file", missing, "--tls-key-file", missing,
                ],
                capture_output=True,
                timeout=10,
                check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return False, "the server did not exit within 10 s when probed for TLS"
        out = (done.stdout + done.stderr).decode(errors="replace")
        if "Address already in use" not in out:
            break
    if "Bad directive" in out or "Failed finding TLS support" in out:
        return False, f"{binary} was built without TLS"
    if "Failed to configure TLS" in out:
        return True, f"{binary} was built with TLS (it tried to load the certificates)"
    return False, f"unexpected answer from the TLS probe: {out[-300:]!r}"


class TlsRedisServer(RedisServer):
    """A :class:`RedisServer` that listens for TLS only (``--port 0 --tls-port P``).

    ``auth_clients`` is ``tls-auth-clients``: ``"no"`` (default; the client only needs
    ``ssl_ca_certs``), ``"optional"`` or ``"yes"`` (the client must present
    ``material.client_cert`` / ``client_key``).

    This subclass overrides two internals of :class:`RedisServer`: ``_base_args`` (move the
    port to ``--tls-port``) and ``_ping`` (ping over TLS). A public hook there, e.g.
    ``RedisServer(tls=TlsFiles(...))`` or an overridable readiness check, would make it
    independent of those internals.
    """

    def __init__(
        self,
        material: TlsMaterial,
        *,
        auth_clients: Literal["no", "optional", "yes"] = "no",
        extra_args: Sequence[str] = (),
        password: str | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        super().__init__(extra_args, password=password, startup_timeout=startup_timeout)
        self.material = material
        self.auth_clients = auth_clients

    @property
    def url(self) -> str:
        """``rediss://127.0.0.1:<tls port>/0``; pass ``ssl_ca_certs=material.ca_cert``."""
        return f"rediss://{self.host}:{self.port}/0"

    @property
    def ca_path(self) -> str:
        return str(self.material.ca_cert)

    def client_ssl_context(self, *, with_client_cert: bool | None = None) -> ssl.SSLContext:
        """A client context trusting the test CA (and presenting the client certificate
        when *with_client_cert*, by default when ``auth_clients == "yes"``)."""
        ctx = ssl.create_default_context(cafile=str(self.material.ca_cert))
        if with_client_cert is None:
            with_client_cert = self.auth_clients == "yes"
        if with_client_cert:
            ctx.load_cert_chain(str(self.material.client_cert), str(self.material.client_key))
        return ctx

    def __enter__(self) -> TlsRedisServer:
        self.start()
        return self

    def _base_args(self) -> list[str]:
        args = super()._base_args()
        where = args.index("--port")
        args[where + 1] = "0"
        m = self.material
        return [
            *args,
            "--tls-port", str(self.port),
            "--tls-cert-file", str(m.server_cert),
            "--tls-key-file", str(m.server_key),
            "--tls-ca-cert-file", str(m.ca_cert),
            "--tls-auth-clients", self.auth_clients,
        ]  # fmt: skip

    def _ping(self) -> bool:
        try:
            ctx = self.client_ssl_context(with_client_cert=True)
            with (
                socket.create_connection((self.host, self.port), timeout=0.5) as raw,
                ctx.wrap_socket(raw, server_hostname=self.host) as sock,
            ):
                if self.password is not None:
                    pw = self.password.encode()
                    sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
                    if not sock.recv(64).startswith(b"+OK"):
                        return False
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return sock.recv(64).startswith(b"+PONG") and self._answers_as_ours(sock)
        except (OSError, ssl.SSLError):
            return False


@contextlib.contextmanager
def tls_server(
    *, auth_clients: Literal["no", "optional", "yes"] = "no"
) -> Iterator[TlsRedisServer]:
    """Certificates in a temporary directory plus a started :class:`TlsRedisServer`.

    Raises :class:`RedisServerError` (with the probe's evidence) when the build lacks TLS.
    """
    supported, why = redis_tls_support()
    if not supported:
        raise RedisServerError(why)
    with tempfile.TemporaryDirectory(prefix="aiolock-tls-") as directory:
        material = make_tls_material(directory)
        with TlsRedisServer(material, auth_clients=auth_clients) as server:
            yield server
