"""A worker process of the robustness suite: tasks that take locks and log what they do.

Run as ``python -m tests.robustness.traffic '<json spec>'`` (the runner does it). The
spec names the Redis deployment (one server, Redlock's masters, Sentinel, or a Redis
Cluster's nodes), the manager's options, the store's port, the log file, when to stop,
and the *groups* of tasks: each group is one kind of lock (``lock``, ``fair``, ``rw``,
``semaphore``, ``multi``, ``redlock``, ``leader``, ``handoff``, or ``none``, the
unlocked control) on a few names. Every task loops until the stop time:
wait for its lock (with a timeout), run a body, let go, pause a little.

A body reads the unfenced counter of each of its resources, takes *steps* (each step a
fenced write to the store with the hold's fencing token), and writes the counter back
plus one. Holds are short (5-30 ms by default), one in eight long (0.5-3 s).

Every event goes to the worker's log as one JSON line, written with one ``write(2)`` on
a file opened for appending, so a SIGKILL loses nothing already logged: ``t`` is
``time.monotonic_ns()`` (one clock for every process of a Linux host), ``w`` the wall
time, ``p`` the worker, ``k`` the task, ``b`` the body (one acquisition), ``ev`` the
event: ``wait``, ``acquired`` (one per resource, with its token ``tok``), ``step`` (its
time is taken *before* the write is sent), ``counted``, ``end`` (the body finished; the
release follows), ``released``, ``cancelled`` (the body was cancelled: a loss, or the
run's end), ``lost``, ``timeout``, ``error``, ``abandoned`` (a wait cut by the run's
end), and for hand-offs ``detached``, ``adopt_cancelled``, ``adopted``, ``adopt_dead``.
The checker believes these lines and the store's tables, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

import aiolock
from tests.robustness.store import StoreClient

#: the resource family of each kind: kinds of one family on one name share one lock
FAMILY = {
    "lock": "lock",
    "multi": "lock",
    "leader": "lock",
    "handoff": "lock",
    "fair": "fair",
    "read": "rw",
    "write": "rw",
    "semaphore": "sem",
    "redlock": "redlock",
    "none": "none",
}

#: kinds whose holds are shared (several at once): no fenced write, no counter
SHARED = frozenset({"read", "semaphore"})


@dataclasses.dataclass
class Hold:
    """How long bodies hold, and how often they step."""

    short_ms: tuple[float, float] = (5.0, 30.0)
    long_ms: tuple[float, float] = (500.0, 3000.0)
    #: one body in this many is long (0: never)
    long_every: int = 8
    #: pause between steps (short bodies step at least twice: at start and end)
    step_ms: float = 10.0
    long_step_ms: float = 50.0
    #: pause between a task's bodies
    think_ms: tuple[float, float] = (0.0, 5.0)

    def draw(self, rng: random.Random) -> tuple[float, float]:
        """(seconds to hold, seconds between steps)."""
        if self.long_every and rng.randrange(self.long_every) == 0:
            return rng.uniform(*self.long_ms) / 1000, self.long_step_ms / 1000
        return rng.uniform(*self.short_ms) / 1000, self.step_ms / 1000


@dataclasses.dataclass
class Group:
    """Tasks of one kind on a few names."""

    kind: str
    tasks: int
    names: list[str]
    #: the acquire's timeout, seconds
    timeout: float = 10.0
    hold: Hold = dataclasses.field(default_factory=Hold)
    #: semaphore: permits
    limit: int = 2
    #: read-write lock: share of the acquisitions that write
    write_share: float = 0.3
    #: multi-lock: names per acquisition
    multi_size: int = 2
    #: hand-off: adopting tasks (on a second manager, through ``adopt_url``), the first
    #: adopt's deadline (later tries get 5 s, after a pause) and the detach lease
    adopters: int = 1
    adopt_deadline: float = 0.05
    #: hand-off: the pause before an adopt is tried again
    adopt_retry_delay: float = 0.5
    detach_lease: float = 10.0
    #: hand-off: detach inside ``async with lock:`` (the recipe's first form) rather
    #: than after ``acquire()``
    detach_in_block: bool = False
    #: hand-off: options of the adopting manager (beside the worker's)
    adopt_manager: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Group:
        fields = dict(data)
        hold = dict(fields.pop("hold", {}))
        for key in ("short_ms", "long_ms", "think_ms"):
            if key in hold:
                hold[key] = tuple(hold[key])
        return cls(hold=Hold(**hold), **fields)


@dataclasses.dataclass
class Opener:
    """How a body enters its lock: ``enter(stack)`` returns the tokens, one per
    resource (None for kinds without tokens); ``handle`` is the lock's handle."""

    enter: Callable[[contextlib.AsyncExitStack], Awaitable[list[int | None]]]
    handle: Any
    #: set once a hand-off's giver has detached the hold
    detached: bool = False


class Log:
    """The worker's event log: a JSON line per event, one ``write(2)`` each."""

    def __init__(self, path: str, proc: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.proc = proc

    def __call__(self, ev: str, task: str, t: int | None = None, **fields: Any) -> None:
        record: dict[str, Any] = {
            "t": t if t is not None else time.monotonic_ns(),
            "w": time.time(),
        }
        record.update(p=self.proc, k=task, ev=ev, **fields)
        os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def make_client(url: str, client: dict[str, Any]) -> Redis:
    """``redis.asyncio.Redis`` as an application would make it: ``"default"`` is
    ``Redis(host=, port=)`` with redis-py's default retries (10 with backoff in redis-py
    8); ``"url"`` is ``Redis.from_url(url)``."""
    socket_timeout = client.get("socket_timeout")
    if client.get("style", "url") == "default":
        parts = urlsplit(url)
        return Redis(
            host=parts.hostname or "127.0.0.1", port=parts.port or 0, socket_timeout=socket_timeout
        )
    return Redis.from_url(url, socket_timeout=socket_timeout)


class Worker:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.proc: str = spec["proc"]
        self.log = Log(spec["log"], self.proc)
        self.stop_at: int = spec["stop_at_ns"]
        self.rng = random.Random(f"{spec['seed']}/{self.proc}")
        self.bodies = 0
        #: the tasks now waiting for a lock: cancelled when the run ends
        self.waiting: set[asyncio.Task[Any]] = set()

    def running(self) -> bool:
        return time.monotonic_ns() < self.stop_at

    def body_id(self, task: str) -> str:
        self.bodies += 1
        return f"{self.proc}.{task}.{self.bodies}"

    # -- managers ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def manager(
        self, url: str | None = None, extra: dict[str, Any] | None = None
    ) -> AsyncIterator[Any]:
        connect = self.spec["connect"]
        options = {**self.spec.get("manager", {}), **(extra or {})}
        client = self.spec.get("client", {})
        if "redlock" in connect:
            clients = [make_client(u, client) for u in connect["redlock"]]
            try:
                async with aiolock.LockManager.redlock(clients, **options) as locks:
                    yield locks
            finally:
                for c in clients:
                    await c.aclose()
            return
        if "sentinel" in connect and url is None:
            addresses = [tuple(a) for a in connect["sentinel"]]
            made = aiolock.LockManager.from_sentinel(
                addresses,
                connect["service"],
                socket_timeout=client.get("socket_timeout"),
                **options,
            )
            async with made as locks:
                yield locks
            return
        if "cluster" in connect and url is None:  # every node bootstraps the slot map
            nodes = [ClusterNode(host, port) for host, port in connect["cluster"]]
            cluster = RedisCluster(startup_nodes=nodes, socket_timeout=client.get("socket_timeout"))
            try:
                async with aiolock.LockManager(cluster, **options) as locks:
                    yield locks
            finally:
                await cluster.aclose()
            return
        redis = make_client(url or connect["url"], client)
        try:
            async with aiolock.LockManager(redis, **options) as locks:
                yield locks
        finally:
            await redis.aclose()

    async def open(self, stack: contextlib.AsyncExitStack, make: Callable[[], Any]) -> Any:
        """Open a manager, again and again while Redis cannot be reached (a worker
        respawned while the nemesis stops Redis), as a supervisor restarting the process
        would; bounded by the run's stop time."""
        while True:
            try:
                return await stack.enter_async_context(make())
            except aiolock.LockConnectionError as exc:
                self.log("open_failed", "-", msg=str(exc)[:300])
                if not self.running():
                    raise
                await asyncio.sleep(0.5)

    # -- the run -----------------------------------------------------------------------

    async def run(self) -> None:
        groups = [Group.from_json(g) for g in self.spec["groups"]]
        self.log("start", "-", pid=os.getpid())
        async with contextlib.AsyncExitStack() as stack:
            locks = await self.open(stack, self.manager)
            tasks: list[asyncio.Task[None]] = []
            for index, group in enumerate(groups):
                tasks += await self.start_group(stack, locks, index, group)
            if self.spec.get("log_listening"):
                tasks.append(asyncio.create_task(self.listening(locks)))
            while self.running() and not all(t.done() for t in tasks):  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # until the stop time (a clock, not an event)
            for task in self.waiting:
                task.cancel()  # waits cut short by the run's end ("abandoned")
            done, pending = await asyncio.wait(tasks, timeout=10.0)
            for task in pending:
                task.cancel()
            await asyncio.wait(tasks, timeout=5.0)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    self.log("crash", "-", err=repr(task.exception()))
        self.log("stop", "-")
        self.log.close()

    async def listening(self, locks: Any) -> None:
        """Log when the manager starts and stops listening for releases (its pub/sub
        subscriptions, read from the public statistics every 2 ms): the starvation bound
        of docs/semantics.md counts from there, and only the process can tell."""
        heard = False
        while self.running():
            now = bool(locks.statistics().hub.subscriptions)
            if now != heard:
                heard = now
                self.log("listening", "-", on=now)
            await asyncio.sleep(0.002)

    async def start_group(
        self, stack: contextlib.AsyncExitStack, locks: Any, index: int, group: Group
    ) -> list[asyncio.Task[None]]:
        tasks = []
        if group.kind == "handoff":
            adopt_locks = await self.open(
                stack, lambda: self.manager(self.spec["adopt_url"], group.adopt_manager)
            )
            queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            for i in range(group.adopters):
                label = f"adopt{index}-{i}"
                tasks.append(asyncio.create_task(self.adopter(adopt_locks, group, label, queue)))
        for i in range(group.tasks):
            label = f"{group.kind}{index}-{i}"
            rng = random.Random(f"{self.spec['seed']}/{self.proc}/{label}")
            if group.kind == "handoff":
                attempt = self.giver(locks, group, label, rng, queue)
            else:
                attempt = self.attempts(locks, group, label, rng)
            tasks.append(asyncio.create_task(attempt))
        return tasks

    async def attempts(self, locks: Any, group: Group, task: str, rng: random.Random) -> None:
        if group.kind == "leader":
            election = locks.leader(group.names[0])
        while self.running():
            kind = group.kind
            if kind == "rw":
                kind = "write" if rng.random() < group.write_share else "read"
            names = [rng.choice(group.names)]
            if kind == "multi":
                names = rng.sample(group.names, min(group.multi_size, len(group.names)))
            resources = [f"{FAMILY[kind]}:{n}" for n in names]
            if kind == "leader":
                opener = self.leader_opener(election)
            else:
                opener = self.opener(locks, group, kind, names)
            await self.attempt(task, kind, resources, opener, group, rng)
            await asyncio.sleep(rng.uniform(*group.hold.think_ms) / 1000)

    def opener(self, locks: Any, group: Group, kind: str, names: list[str]) -> Opener:
        """What enters the lock: a coroutine function returning the tokens (one per
        resource), to run inside an AsyncExitStack the caller keeps open for the body,
        and the handle (for a hand-off's detach)."""
        timeout = group.timeout
        name = names[0]
        if kind in ("lock", "handoff"):
            handle: Any = locks.lock(name, timeout=timeout)
        elif kind == "fair":
            handle = locks.fair_lock(name, timeout=timeout)
        elif kind in ("read", "write"):
            rw = locks.rw_lock(name, timeout=timeout)
            handle = rw.write() if kind == "write" else rw.read()
        elif kind == "semaphore":
            handle = locks.semaphore(name, group.limit, timeout=timeout)
        elif kind == "multi":
            handle = locks.multi_lock(names, timeout=timeout)
        elif kind == "redlock":
            handle = locks.lock(name, timeout=timeout)
        elif kind == "none":
            handle = None
        else:
            raise ValueError(f"unknown kind {kind!r}")

        opener = Opener(None, handle)  # type: ignore[arg-type]  # enter is set below

        async def enter(stack: contextlib.AsyncExitStack) -> list[int | None]:
            if handle is None:
                return [None]
            if kind == "handoff" and not group.detach_in_block:
                await handle.acquire()

                async def release_unless_detached() -> None:
                    if not opener.detached:
                        await handle.release()

                stack.push_async_callback(release_unless_detached)
                return [handle.fencing_token]
            held = await stack.enter_async_context(handle)
            if kind == "multi":
                tokens = held.fencing_tokens
                return [tokens[n] for n in names]
            if kind == "redlock":
                return [None]
            return [held.fencing_token]

        opener.enter = enter
        return opener

    def leader_opener(self, election: Any) -> Opener:
        async def enter(stack: contextlib.AsyncExitStack) -> list[int | None]:
            term = await stack.enter_async_context(election.lead())
            return [term.fencing_token]

        return Opener(enter, None)

    async def attempt(
        self,
        task: str,
        kind: str,
        resources: list[str],
        opener: Opener,
        group: Group,
        rng: random.Random,
        handoff: asyncio.Queue[dict[str, Any]] | None = None,
    ) -> None:
        body = self.body_id(task)
        log = self.log
        log("wait", task, b=body, kind=kind, res=resources, timeout=group.timeout)
        started = time.monotonic()
        acquired = False
        me = asyncio.current_task()
        assert me is not None
        self.waiting.add(me)
        try:
            async with contextlib.AsyncExitStack() as stack:
                if kind == "leader":  # lead() has no timeout of its own
                    with anyio.move_on_after(group.timeout) as scope:
                        tokens: list[int | None] = await opener.enter(stack)
                    if scope.cancelled_caught:
                        raise aiolock.LockTimeoutError("leader campaign timed out (traffic)")
                else:
                    tokens = await opener.enter(stack)
                self.waiting.discard(me)
                acquired = True
                waited = time.monotonic() - started
                for res, tok in zip(resources, tokens, strict=True):
                    log(
                        "acquired",
                        task,
                        b=body,
                        kind=kind,
                        res=res,
                        tok=tok,
                        waited=waited,
                        limit=group.limit if kind == "semaphore" else None,
                    )
                hold, step = group.hold.draw(rng)
                store = self.store(task)
                try:
                    if handoff is not None:
                        values = await self.counter_get(store, resources, body)
                        await self.steps(store, task, body, resources, tokens, hold / 2, step)
                        token = await opener.handle.detach(lease=group.detach_lease)
                        opener.detached = True
                        log("detached", task, b=body)
                        await handoff.put(
                            {
                                "b": body,
                                "res": resources,
                                "tok": tokens,
                                "token": token,
                                "values": values,
                                "hold": hold / 2,
                                "step": step,
                            }
                        )
                        return
                    values = await self.counter_get(store, resources, body, kind)
                    # shared holds write unfenced: their tokens order nothing among them
                    fence: list[int | None] = [None] * len(tokens) if kind in SHARED else tokens
                    await self.steps(store, task, body, resources, fence, hold, step)
                    await self.counter_set(store, task, resources, values, body)
                    log("end", task, b=body)
                finally:
                    store.close()
            log("released", task, b=body)
        except asyncio.CancelledError:
            if acquired:
                log("cancelled", task, b=body, where="release")
            else:
                log("abandoned", task, b=body, waited=time.monotonic() - started)
            raise
        except aiolock.LockTimeoutError as exc:
            if acquired:
                log("error", task, b=body, err=type(exc).__name__, msg=str(exc)[:300])
            else:
                log("timeout", task, b=body, waited=time.monotonic() - started, msg=str(exc)[:300])
        except aiolock.LockLostError as exc:
            log("lost", task, b=body, acquired=acquired, msg=str(exc)[:300])
        except Exception as exc:
            log(
                "error",
                task,
                b=body,
                err=type(exc).__name__,
                msg=str(exc)[:300],
                acquired=acquired,
                waited=time.monotonic() - started,
            )
            if not isinstance(exc, (aiolock.LockError, ConnectionError, OSError)):
                traceback.print_exc()
        finally:
            self.waiting.discard(me)

    def store(self, task: str) -> StoreClient:
        return StoreClient(self.spec["store_port"], self.proc, task)

    async def counter_get(
        self, store: StoreClient, resources: list[str], body: str, kind: str = "lock"
    ) -> dict[str, int]:
        if kind in SHARED:
            return {}  # shared holds: the counter is for exclusive ones
        return {res: await store.get(res, body) for res in resources}

    async def counter_set(
        self,
        store: StoreClient,
        task: str,
        resources: list[str],
        values: dict[str, int],
        body: str,
    ) -> None:
        for res, value in values.items():
            await store.set(res, value + 1, body)
            self.log("counted", task, b=body, res=res, value=value + 1)

    async def steps(
        self,
        store: StoreClient,
        task: str,
        body: str,
        resources: list[str],
        tokens: list[int | None],
        hold: float,
        step: float,
    ) -> None:
        """Steps until *hold* seconds have passed (two at least): each one a fenced
        write per resource, logged before it is sent."""
        end = time.monotonic() + hold
        i = 0
        try:
            while True:
                for res, tok in zip(resources, tokens, strict=True):
                    self.log("step", task, b=body, res=res, tok=tok, i=i)
                    await store.fence(res, tok, body)
                i += 1
                left = end - time.monotonic()
                if i >= 2 and left <= 0:
                    return
                await asyncio.sleep(max(0.0, min(step, left)))
        except asyncio.CancelledError:
            self.log("cancelled", task, b=body, where="body")
            raise

    # -- hand-off ----------------------------------------------------------------------

    async def giver(
        self,
        locks: Any,
        group: Group,
        task: str,
        rng: random.Random,
        queue: asyncio.Queue[dict[str, Any]],
    ) -> None:
        """Takes the lock, steps, detaches and hands the token to an adopter; the
        adopter finishes the body (same body id, same fencing token)."""
        while self.running():
            name = rng.choice(group.names)
            opener = self.opener(locks, group, "handoff", [name])
            await self.attempt(task, "handoff", [f"lock:{name}"], opener, group, rng, queue)
            await asyncio.sleep(rng.uniform(*group.hold.think_ms) / 1000)

    async def adopter(
        self, locks: Any, group: Group, task: str, queue: asyncio.Queue[dict[str, Any]]
    ) -> None:
        log = self.log
        while self.running() or not queue.empty():
            try:
                item = await asyncio.wait_for(queue.get(), 0.2)
            except asyncio.TimeoutError:
                continue
            body, resources, tokens = item["b"], item["res"], item["tok"]
            lock = locks.lock(resources[0].split(":", 1)[1])
            for attempt in range(4):  # the first with a short deadline, then 5 s each
                deadline = group.adopt_deadline if attempt == 0 else 5.0
                try:
                    async with contextlib.AsyncExitStack() as stack:
                        with anyio.move_on_after(deadline) as scope:
                            await stack.enter_async_context(lock.adopted(item["token"]))
                        if scope.cancelled_caught:
                            log("adopt_cancelled", task, b=body, deadline=deadline)
                            await asyncio.sleep(group.adopt_retry_delay)
                            continue
                        log("adopted", task, b=body, res=resources[0], tok=tokens[0])
                        store = self.store(task)
                        try:
                            await self.steps(
                                store, task, body, resources, tokens, item["hold"], item["step"]
                            )
                            await self.counter_set(store, task, resources, item["values"], body)
                            log("end", task, b=body)
                        finally:
                            store.close()
                    log("released", task, b=body)
                except aiolock.LockHandoffError as exc:
                    log("adopt_dead", task, b=body, attempt=attempt, msg=str(exc)[:300])
                except aiolock.LockLostError as exc:
                    log("lost", task, b=body, acquired=True, msg=str(exc)[:300])
                except Exception as exc:
                    log(
                        "error",
                        task,
                        b=body,
                        err=type(exc).__name__,
                        msg=str(exc)[:300],
                        acquired=True,
                    )
                break
            else:
                log("adopt_gave_up", task, b=body)


async def main(spec: dict[str, Any]) -> None:
    worker = Worker(spec)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
