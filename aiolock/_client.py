"""The one door to Redis: runs scripts and commands, and turns redis-py errors into ours.

Every command aiolock sends goes through :class:`Client`, so error translation, the
optional per-command time limit and EVALSHA's NOSCRIPT fallback live in one place.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import anyio
from redis import exceptions as rex
from redis.asyncio import Redis

from ._errors import (
    LockBackendError,
    LockConnectionError,
    LockError,
    LockKeyTypeError,
    LockPermissionError,
)
from ._scripts import Script

__all__ = ["Client", "as_int", "as_text", "translate"]

T = TypeVar("T")
Arg = str | int | float | bytes


def _send(redis: Redis, *args: Arg) -> Awaitable[Any]:
    # redis-py leaves execute_command untyped; this is the one place that calls it.
    return redis.execute_command(*args)  # type: ignore[no-untyped-call]


def as_text(value: object) -> str:
    """A reply element as str, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def as_int(value: object) -> int:
    if isinstance(value, (int, str, bytes)):
        return int(value)
    raise LockBackendError(f"Redis sent {value!r} where aiolock expected an integer")


def translate(exc: rex.RedisError, what: str, key: str | None = None) -> LockError:
    """Map a redis-py exception to the aiolock error a caller can act on."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, rex.AuthenticationError) or text.startswith(("WRONGPASS", "NOAUTH")):
        return LockPermissionError(
            f"Redis rejected the client's credentials during {what}: {text}. "
            "Check the username and password in the Redis URL or client."
        )
    if isinstance(exc, rex.NoPermissionError) or "NOPERM" in text:
        return LockPermissionError(
            f"Redis refused {what}: {text}. The ACL user needs EVALSHA, EVAL, SCRIPT LOAD, "
            "PUBLISH, SUBSCRIBE, UNSUBSCRIBE, EXISTS, HGET, PTTL and the commands used inside "
            "aiolock's scripts (TYPE, HGET, HSET, HINCRBY, HEXISTS, PEXPIRE, PTTL, DEL, SET, "
            "TIME), on keys and channels under the manager's prefix."
        )
    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError)):
        return LockConnectionError(
            f"{what} failed: Redis could not be reached or did not answer ({text}). "
            "The outcome on the server is unknown; aiolock undoes partial acquisitions "
            "and retries releases in the background."
        )
    if "WRONGTYPE" in text and key is not None:
        return LockKeyTypeError(
            f"Redis key {key!r} holds a value of another type, so it cannot be used as a "
            "lock; rename the lock or delete that key."
        )
    return LockBackendError(f"Redis answered {what} with an error: {text}")


def key_type_error(key: str, kind: object) -> LockKeyTypeError:
    return LockKeyTypeError(
        f"Redis key {key!r} holds a {as_text(kind)}, not an aiolock lock (a hash), so it "
        "cannot be used as a lock; pick another lock name or prefix, or delete that key."
    )


if sys.version_info >= (3, 11):
    from asyncio import timeout as _timeout_cm
else:  # pragma: no cover - Python 3.10
    _timeout_cm = anyio.fail_after


class Client:
    """Runs aiolock's scripts and commands on a ``redis.asyncio.Redis``.

    Args:
        redis: the client; aiolock never changes its settings.
        command_timeout: seconds one command may take before it fails with
            :class:`LockConnectionError`; ``None`` leaves it to the client's
            ``socket_timeout``.
    """

    __slots__ = ("command_timeout", "redis")

    def __init__(self, redis: Redis, command_timeout: float | None = None) -> None:
        self.redis = redis
        self.command_timeout = command_timeout

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """EVALSHA *script*, loading it first if the server does not know it."""
        try:
            try:
                return await self._bounded(
                    _send(self.redis, "EVALSHA", script.sha, len(keys), *keys, *args)
                )
            except rex.NoScriptError:
                await self._bounded(_send(self.redis, "SCRIPT LOAD", script.source))
                return await self._bounded(
                    _send(self.redis, "EVALSHA", script.sha, len(keys), *keys, *args)
                )
        except rex.RedisError as exc:
            raise translate(exc, f"the {script.name} script", keys[0] if keys else None) from exc
        except TimeoutError as exc:
            raise LockConnectionError(
                f"the {script.name} script got no answer from Redis within "
                f"{self.command_timeout} s (command_timeout)"
            ) from exc

    async def call(self, *args: Arg, key: str | None = None) -> Any:
        """Send one plain command."""
        try:
            return await self._bounded(_send(self.redis, *args))
        except rex.RedisError as exc:
            raise translate(exc, f"the {as_text(args[0])} command", key) from exc
        except TimeoutError as exc:
            raise LockConnectionError(
                f"the {as_text(args[0])} command got no answer from Redis within "
                f"{self.command_timeout} s (command_timeout)"
            ) from exc

    async def _bounded(self, awaitable: Awaitable[T]) -> T:
        if self.command_timeout is None:
            return await awaitable
        with _timeout_cm(self.command_timeout):
            return await awaitable
