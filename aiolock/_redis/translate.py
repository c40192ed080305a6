"""redis-py's errors as aiolock's: what a caller can act on, with the advice to act.

Every command aiolock sends is answered through :func:`translate` (see
:mod:`aiolock._redis.client`), so an ACL refusal, a refused TLS certificate, an exhausted pool,
a read-only replica or a Cluster node's MOVED reads the same wherever it happens.
"""

from __future__ import annotations

import re
import ssl

from redis import exceptions as rex

from aiolock._errors import (
    LockBackendError,
    LockConnectionError,
    LockError,
    LockKeyTypeError,
    LockPermissionError,
)
from aiolock._redis.reply import as_text
from aiolock._redis.scripts import REQUIRED_COMMANDS, naming

__all__ = ["POOL_EXHAUSTED", "is_permanent", "key_type_error", "translate"]

#: The words of a pool-exhaustion error (a waiter's timeout says which outage it was).
POOL_EXHAUSTED = "the client's connection pool is exhausted"

#: Where Redis points into a script in an error ("script: <sha>, on @user_script:12.";
#: Valkey 9 leaves out the sha): noise for the caller, who did not write the script.
_SCRIPT_POSITION = re.compile(r"\s*script: (?:[0-9a-f]{40}, )?on @user_script:\d+\.?")


def translate(
    exc: rex.RedisError, what: str, key: str | None = None, *, changes: bool = True
) -> LockError:
    """Map a redis-py exception to the aiolock error a caller can act on."""
    what = naming(what, key)
    text = _SCRIPT_POSITION.sub("", str(exc)).strip() or type(exc).__name__
    if isinstance(exc, rex.AuthenticationError) or text.startswith(("WRONGPASS", "NOAUTH")):
        return LockPermissionError(
            f"Redis rejected the client's credentials during {what}: {text}. "
            "Check the username and password in the Redis URL or client."
        )
    if (
        isinstance(exc, rex.NoPermissionError)
        or "NOPERM" in text
        or "can't run this command" in text  # an ACL refusal inside a script (Redis)
        or "ACL failure in script" in text  # the same refusal as Valkey words it
    ):
        needed = ", ".join(c.upper().replace("|", " ") for c in REQUIRED_COMMANDS)
        return LockPermissionError(
            f"Redis refused {what}: {text}. The ACL user needs these commands: {needed}; "
            "on keys (~prefix:*) and channels (&prefix:*) under the manager's prefix."
        )
    if is_permanent(exc):
        return LockBackendError(
            f"{what} failed: the TLS certificate of Redis was refused ({text}). Retrying "
            "cannot mend this: give the client the CA that signed the server's certificate "
            "(ssl_ca_certs=...) and connect by the host name the certificate names."
        )
    if isinstance(exc, rex.MaxConnectionsError) or text == "No connection available.":
        return LockConnectionError(
            f"{what} failed: {POOL_EXHAUSTED} ({text}). aiolock "
            "uses up to max_in_flight connections plus one for pub/sub; make the pool "
            "larger (max_connections) or share it with fewer users."
        )
    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError)):
        return LockConnectionError(
            f"{what} failed: Redis could not be reached or did not answer ({text})."
            + (
                " The outcome on the server is unknown; aiolock undoes partial acquisitions "
                "and retries releases in the background."
                if changes
                else ""
            )
        )
    # (redis-py strips the READONLY code from the text of its ReadOnlyError)
    if isinstance(exc, rex.ReadOnlyError) or text.startswith("READONLY"):
        return LockBackendError(
            f"Redis refused {what}: the server is a read-only replica, not the primary "
            f"({text}). Give aiolock a client of the primary; with Sentinel, use "
            "LockManager.from_sentinel() or Sentinel.master_for(), which follow failovers"
        )
    if text.startswith("NOREPLICAS"):
        return LockBackendError(
            f"Redis refused {what}: the primary accepts no writes while fewer replicas than "
            f"its min-replicas-to-write are in sync ({text}). Check the replicas' link to "
            "the primary (INFO replication), or lower min-replicas-to-write"
        )
    if isinstance(exc, rex.MovedError):
        return LockBackendError(
            f"Redis answered {what} with MOVED ({text}): this server is a Redis Cluster "
            "node, and a plain redis.asyncio.Redis client talks to one node only. Pass a "
            "redis.asyncio.cluster.RedisCluster client to LockManager, or use "
            "LockManager.from_url(url, cluster=True)."
        )
    if "WRONGTYPE" in text and key is not None:
        return LockKeyTypeError(
            f"a Redis key of lock {key!r} holds a value of another type, so it cannot be "
            f"used as a lock; rename the lock or delete that key (Redis said: {text})"
        )
    return LockBackendError(f"Redis answered {what} with an error: {text}")


def is_permanent(exc: BaseException) -> bool:
    """A connection error that no retry mends: the server's TLS certificate was refused.

    redis-py raises its ConnectionError from the handshake's error (as ``__context__``),
    so the chain is searched.
    """
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 8:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def key_type_error(key: str, kind: object) -> LockKeyTypeError:
    text = as_text(kind)
    # a string is the lock's own type: then it holds a value aiolock did not write
    what = "a string that is not an aiolock lock" if text == "string" else f"a {text}"
    return LockKeyTypeError(
        f"Redis key {key!r} holds {what}, not a structure of this aiolock lock, so it "
        "cannot be used as a lock; pick another lock name or prefix, or delete that key."
    )
