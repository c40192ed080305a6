"""A protocol model of Redisson's RLock and RFencedLock (Redisson 3.52.0), for interop tests.

A real Redisson (Java) client cannot run here (no JVM artefacts can be fetched), so the
tests pit aiolock against this model instead. It sends what Redisson 3.52.0 sends, with
the same effects (scripts written for these tests from Redisson's documented behaviour;
the facts come from ``RedissonLock``, ``RedissonBaseLock``, ``RedissonFencedLock``,
``LockPubSub`` and ``renewal/LockTask`` of that version):

* owner field ``<client UUID>:<thread id>`` in a hash at the raw lock name;
* acquire: when the hash is absent or has our field, HINCRBY the field and PEXPIRE the
  lease, reply nil; else reply the PTTL. RFencedLock also INCRs
  ``redisson_lock_token:{name}`` and replies ``{-1, token}`` / ``{pttl, -1}``;
* unlock (3.2x+ form): an *unlock latch* ``redisson_unlock_latch:{name}:<request id>``
  makes a resent unlock answer as the first; a field we do not own replies nil; else
  HINCRBY -1, and while > 0 re-PEXPIRE, else DEL and PUBLISH ``0`` on
  ``redisson_lock__channel:{name}``;
* watchdog: every lease / 3, HEXISTS the field and PEXPIRE the lease (30 s by default);
* waiting: subscribe to the channel (one subscription per client and name, a latch fed
  by the messages: ``0`` releases one waiter, ``1`` all of them), then loop: try; on a
  reply ``ttl`` sleep on the latch for at most ``ttl`` ms (forever if ttl < 0).

"Threads" are explicit integers here (one per asyncio task of a test). :meth:`crash`
stops every watchdog without unlocking: the leases then run out, as a killed JVM's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub

#: RedissonLock.tryLockInnerAsync
ACQUIRE = """
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
"""

#: RedissonFencedLock.tryLockInnerAsync
ACQUIRE_FENCED = """
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  local token = redis.call('incr', KEYS[2])
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
"""

#: RedissonLock.unlockInnerAsync (with the unlock latch of 3.2x+)
UNLOCK = """
local done = redis.call('get', KEYS[3])
if done ~= false then
  return tonumber(done)
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return nil
end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[3], 0, 'px', ARGV[5])
  return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[1])
redis.call('set', KEYS[3], 1, 'px', ARGV[5])
return 1
"""

#: renewal/LockTask (one key per call here)
RENEW = """
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
return 0
"""

#: RedissonLock.forceUnlockAsync
FORCE_UNLOCK = """
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
return 0
"""


def prefix_name(prefix: str, name: str) -> str:
    return f"{prefix}:{name}" if "{" in name else f"{prefix}:{{{name}}}"


class IllegalMonitorStateError(RuntimeError):
    """Redisson's IllegalMonitorStateException: unlock by a thread that does not hold."""


@dataclass
class _Entry:
    """RedissonLockEntry: the latch of one channel, shared by the client's waiters."""

    latch: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))
    waiters: int = 0
    subscribed: asyncio.Future[None] | None = None


@dataclass
class WaitStats:
    """How the model's waits ended: by a message, or by sleeping out a ttl."""

    woken: int = 0
    timed_out: int = 0
    longest_sleep: float = 0.0
    #: waits asleep on their latch now (a test waits for this before it releases)
    asleep: int = 0


class RedissonModel:
    """One Redisson client (one ``RedissonClient``, one UUID) against one Redis."""

    def __init__(self, redis: Redis, *, watchdog_ms: int = 30_000, fenced: bool = False) -> None:
        self.redis = redis
        self.id = str(uuid.uuid4())
        #: lockWatchdogTimeout: the lease of a lock taken without a lease time
        self.watchdog_ms = watchdog_ms
        self.fenced = fenced
        self.stats = WaitStats()
        self._entries: dict[str, _Entry] = {}
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._watchdogs: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._acquire = redis.register_script(ACQUIRE_FENCED if fenced else ACQUIRE)
        self._unlock = redis.register_script(UNLOCK)
        self._renew = redis.register_script(RENEW)
        self._force = redis.register_script(FORCE_UNLOCK)
        #: the last fencing token drawn (RFencedLock only)
        self.token: int | None = None

    def field(self, thread: int) -> str:
        """getLockName(threadId)."""
        return f"{self.id}:{thread}"

    @staticmethod
    def channel(name: str) -> str:
        return prefix_name("redisson_lock__channel", name)

    # -- acquire -------------------------------------------------------------------------

    async def try_acquire(self, name: str, thread: int, lease_ms: int | None = None) -> int | None:
        """One run of the acquire script: None if acquired, else the holder's PTTL."""
        keys = [name, prefix_name("redisson_lock_token", name)] if self.fenced else [name]
        lease = self.watchdog_ms if lease_ms is None else lease_ms
        reply: Any = await self._acquire(keys=keys, args=[lease, self.field(thread)])
        if self.fenced:
            ttl, token = int(reply[0]), int(reply[1])
            if ttl != -1:
                return ttl
            self.token = token
            reply = None
        if reply is None and lease_ms is None:
            self._start_watchdog(name, thread)
        return None if reply is None else int(reply)

    async def lock(
        self, name: str, thread: int, *, wait: float | None = None, lease_ms: int | None = None
    ) -> bool:
        """lock() (wait None) or tryLock(wait): subscribe, then retry on message or ttl."""
        ttl = await self.try_acquire(name, thread, lease_ms)
        if ttl is None:
            return True
        loop = asyncio.get_running_loop()
        deadline = None if wait is None else loop.time() + wait
        entry = await self._subscribe(name)
        try:
            while True:
                ttl = await self.try_acquire(name, thread, lease_ms)
                if ttl is None:
                    return True
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return False
                sleep = None if ttl < 0 else ttl / 1000
                if left is not None:
                    sleep = left if sleep is None else min(sleep, left)
                started = loop.time()
                self.stats.asleep += 1
                try:
                    if sleep is None:
                        await entry.latch.acquire()
                    else:
                        await asyncio.wait_for(entry.latch.acquire(), sleep)
                    self.stats.woken += 1
                # asyncio's own TimeoutError: before 3.11 it is not the builtin one.
                except asyncio.TimeoutError:
                    self.stats.timed_out += 1
                finally:
                    self.stats.asleep -= 1
                self.stats.longest_sleep = max(self.stats.longest_sleep, loop.time() - started)
        finally:
            await self._unsubscribe(name, entry)

    # -- release -------------------------------------------------------------------------

    async def unlock(self, name: str, thread: int) -> bool:
        """unlock(): True if this freed the lock, False if holds are left."""
        latch = prefix_name("redisson_unlock_latch", name) + ":" + uuid.uuid4().hex
        reply = await self._unlock(
            keys=[name, self.channel(name), latch],
            args=[0, self.watchdog_ms, self.field(thread), "publish", 10_000],
        )
        if reply is None:
            self._stop_watchdog(name, thread)
            raise IllegalMonitorStateError(
                f"attempt to unlock lock {name!r}, not locked by current thread by node id: "
                f"{self.id} thread-id: {thread}"
            )
        if int(reply) == 1:
            self._stop_watchdog(name, thread)
            return True
        return False

    async def force_unlock(self, name: str) -> bool:
        return int(await self._force(keys=[name, self.channel(name)], args=[0])) == 1

    async def hold_count(self, name: str, thread: int) -> int:
        value = await self.redis.hget(name, self.field(thread))
        return 0 if value is None else int(value)

    # -- watchdog ------------------------------------------------------------------------

    def _start_watchdog(self, name: str, thread: int) -> None:
        if (name, thread) not in self._watchdogs:
            task = asyncio.create_task(self._watch(name, thread))
            self._watchdogs[(name, thread)] = task

    def _stop_watchdog(self, name: str, thread: int) -> None:
        task = self._watchdogs.pop((name, thread), None)
        if task is not None:
            task.cancel()

    async def _watch(self, name: str, thread: int) -> None:
        while True:
            await asyncio.sleep(self.watchdog_ms / 3000)
            held = await self._renew(keys=[name], args=[self.watchdog_ms, self.field(thread)])
            if int(held) == 0:
                self._watchdogs.pop((name, thread), None)
                return

    # -- pub/sub -------------------------------------------------------------------------

    async def _subscribe(self, name: str) -> _Entry:
        channel = self.channel(name)
        entry = self._entries.get(channel)
        if entry is None:
            entry = self._entries[channel] = _Entry()
            entry.subscribed = asyncio.get_running_loop().create_future()
            if self._pubsub is None:
                self._pubsub = self.redis.pubsub()
            await self._pubsub.subscribe(channel)
            if self._reader is None:
                self._reader = asyncio.create_task(self._read())
        entry.waiters += 1
        assert entry.subscribed is not None
        await asyncio.shield(entry.subscribed)  # Redisson waits for the confirmation
        return entry

    async def _unsubscribe(self, name: str, entry: _Entry) -> None:
        entry.waiters -= 1
        channel = self.channel(name)
        if entry.waiters == 0 and self._entries.get(channel) is entry:
            del self._entries[channel]
            if self._pubsub is not None:
                await self._pubsub.unsubscribe(channel)

    async def _read(self) -> None:
        assert self._pubsub is not None
        while True:
            message = await self._pubsub.get_message(timeout=1.0)
            if message is None:
                continue
            channel = message["channel"].decode()
            entry = self._entries.get(channel)
            if entry is None:
                continue
            if message["type"] == "subscribe":
                if entry.subscribed is not None and not entry.subscribed.done():
                    entry.subscribed.set_result(None)
            elif message["type"] == "message":
                data = message["data"].decode()
                if data == "0":  # UNLOCK_MESSAGE: one waiter
                    entry.latch.release()
                elif data == "1":  # READ_UNLOCK_MESSAGE: all of them
                    for _ in range(max(entry.waiters, 1)):
                        entry.latch.release()

    # -- lifecycle -----------------------------------------------------------------------

    def crash(self) -> None:
        """Stop every watchdog without unlocking: the leases run out."""
        for task in self._watchdogs.values():
            task.cancel()
        self._watchdogs.clear()

    async def aclose(self) -> None:
        self.crash()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._pubsub is not None:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]
