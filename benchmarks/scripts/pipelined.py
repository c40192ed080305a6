"""Cycles one Redis core serves when fully pipelined: part of ``benchmarks.scripts.cycle_time``.

Issue 21's target 1 asks for the shipped lock scripts to serve >= 1.5x the cycles per
second of the lock's scripts before issue 21 when one connection sends nothing but
cycles, fully pipelined. For each pair measured here (redis-py's Lock, the frozen pre-21
pair, the shipped pair, as :func:`benchmarks.scripts.pairs.pairs` defines them) one
measurement:

* starts a fresh private ``redis-server`` (:class:`aiolock.testing.RedisServer`, free
  loopback port, stopped by pid), loads the pair's scripts and runs one cycle one command
  at a time;
* sends *cycles* cycles on :data:`BATCH` names in batches on one connection, with the
  same per-cycle arguments as the sequential rows (a unique owner field and void or
  tombstone key per cycle): a batch is one write of the previous batch's releases and
  this batch's acquires, encoded as RESP bytes, and every reply is read before the next
  (the shipped release names the token its acquire answered, and that token is the
  server's clock, which no client can predict: one name cannot be fully pipelined); the
  time is the sum of the batches' wall clock, from the first byte written to the last
  reply read, and the server's CPU (``INFO cpu`` ``used_cpu_user + used_cpu_sys``) over
  the whole run;
* checks every reply is what a successful cycle answers: an acquire that was granted, a
  release that released. An error reply or any other reply is counted; a row with any
  is failed (the report says so and ``python -m benchmarks.scripts.cycle_time`` exits 1).

The frozen pair leaves a tombstone key per release (kept 10 s), so the keyspace grows by
a key per cycle during its run (the shipped pair's does not): compare runs made with the
same number of cycles.

Pairs are interleaved over the repeats (round k: every pair once); each figure is the
median, and each row keeps its cycles/s per round (``cycles_per_s_by_round``) so that
:mod:`benchmarks.scripts.cycle_time` can judge the target on the median of the per-round ratios
(shipped / frozen in the same round, :mod:`benchmarks.common.paired`) beside the ratio of the
medians. The client is one Python process that only feeds bytes to a parser, on the same
machine: on 2 cores it shares them with the server, so the server CPU per cycle is shown
beside the wall clock.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

import hiredis
import redis

from aiolock.testing import RedisServer
from benchmarks.scripts.pairs import Pair

__all__ = ["BATCH", "encode", "measure", "run"]

#: names per batch: each batch is one write of its releases and acquires, and one
#: round trip, so the round trips are a thousandth of the commands
BATCH = 1000


def encode(commands: Sequence[Sequence[str | int]]) -> bytes:
    """RESP arrays of bulk strings, as a client writes them."""
    parts: list[bytes] = []
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        for arg in command:
            data = str(arg).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _server_cpu(client: redis.Redis) -> float:
    cpu: dict[str, Any] = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def _exchange(
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], payload: bytes, replies: int
) -> tuple[float, list[Any]]:
    """Write *payload* at once, read *replies* replies: (seconds, the replies)."""
    stream, writer = connection
    reader = hiredis.Reader()
    got: list[Any] = []
    started = time.perf_counter()
    # No drain before reading: the transport sends what the socket takes while the loop
    # below reads the replies that come back meanwhile.
    writer.write(payload)
    while len(got) < replies:
        reply = reader.gets()
        if reply is False:
            data = await stream.read(1 << 20)
            if not data:
                raise ConnectionError("the benchmark's server closed the connection")
            reader.feed(data)
            continue
        got.append(reply)
    return time.perf_counter() - started, got


def _named(keys: Sequence[str], n: int) -> list[str]:
    """The pair's keys for name *n* of a batch (its lock and the keys beside it)."""
    return [key.replace("{lock}", f"{{lock{n}}}") for key in keys]


def _first_cycle(client: redis.Redis, pair: Pair, acquire: str | None, release: str) -> Any:
    """One cycle, a command at a time (before the pipelined ones): the acquire's reply."""
    keys, args = pair.acquire_input(-1)
    if acquire is None:
        got = client.set(keys[0], args[0], nx=True, px=int(args[1]))
    else:
        got = client.evalsha(acquire, len(keys), *keys, *args)
    if not got:
        raise RuntimeError(f"{pair.name}: the lock was not free on a fresh server")
    pair.acquired(-1, got)
    keys, args = pair.release_input(-1)
    if not pair.released(client.evalsha(release, len(keys), *keys, *args)):
        raise RuntimeError(f"{pair.name}: the first release failed")
    return got


def measure(pair: Pair, cycles: int) -> dict[str, Any]:
    """One pipelined run of *cycles* cycles of *pair* on a fresh server (see the module
    docstring: batches of :data:`BATCH` names, each batch's releases with the next one's
    acquires)."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            release = client.script_load(pair.release)
            acquire = client.script_load(pair.acquire) if pair.acquire is not None else None
            _first_cycle(client, pair, acquire, release)
            cpu = _server_cpu(client)
            seconds, replies, sent = asyncio.run(
                _pipelined(server.host, server.port, pair, acquire, release, cycles)
            )
            cpu = _server_cpu(client) - cpu
        finally:
            client.close()
    errors, wrong, first_bad = 0, 0, None
    for i in range(cycles):
        got, released = replies[i]
        for reply in (got, released):
            if isinstance(reply, hiredis.ReplyError):
                errors += 1
                first_bad = first_bad or f"cycle {i}: {reply}"
        if isinstance(got, hiredis.ReplyError) or isinstance(released, hiredis.ReplyError):
            continue
        if not got or not pair.released(released):
            wrong += 1
            first_bad = first_bad or f"cycle {i}: acquire {got!r}, release {released!r}"
    return {
        "seconds": seconds,
        "cycles_per_s": cycles / seconds,
        "server_cpu_us_per_cycle": cpu / cycles * 1e6,
        "payload_bytes": sent,
        "error_replies": errors,
        "wrong_replies": wrong,
        "first_bad": first_bad,
    }


async def _pipelined(
    host: str, port: int, pair: Pair, acquire: str | None, release: str, cycles: int
) -> tuple[float, dict[int, list[Any]], int]:
    """The batches on one connection: (seconds spent in them, each cycle's [acquire
    reply, release reply], bytes sent)."""
    connection = await asyncio.open_connection(host, port)
    replies: dict[int, list[Any]] = {}
    seconds, sent = 0.0, 0
    try:
        previous: range = range(0)
        for start in [*range(0, cycles, BATCH), cycles]:
            batch = range(start, min(start + BATCH, cycles))
            commands: list[list[str | int]] = []
            for i in previous:  # released now: their tokens are known
                keys, args = pair.release_input(i)
                commands.append(["EVALSHA", release, len(keys), *_named(keys, i % BATCH), *args])
            for i in batch:
                keys, args = pair.acquire_input(i)
                if acquire is None:
                    commands.append(["SET", _named(keys, i % BATCH)[0], args[0], "NX", "PX",
                                     args[1]])  # fmt: skip
                else:
                    commands.append(
                        ["EVALSHA", acquire, len(keys), *_named(keys, i % BATCH), *args]
                    )
            payload = encode(commands)
            took, got = await _exchange(connection, payload, len(commands))
            seconds, sent = seconds + took, sent + len(payload)
            for i, reply in zip(previous, got, strict=False):
                replies[i].append(reply)
            for i, reply in zip(batch, got[len(previous) :], strict=True):
                replies[i] = [reply]
                pair.acquired(i, reply)  # the shipped release names its hold's token
            previous = batch
    finally:
        connection[1].close()
    return seconds, replies, sent


def run(pairs: Sequence[Pair], cycles: int, repeats: int) -> list[dict[str, Any]]:
    """Interleaved pipelined runs of *pairs*."""
    samples: dict[str, list[dict[str, Any]]] = {pair.name: [] for pair in pairs}
    for _ in range(repeats):
        for pair in pairs:
            samples[pair.name].append(measure(pair, cycles))
    rows = []
    for name, runs in samples.items():
        rates = [r["cycles_per_s"] for r in runs]
        rows.append(
            {
                "pair": name,
                "cycles_per_s": statistics.median(rates),
                "range": [min(rates), max(rates)],
                # round k's figure of every pair ran within seconds of the others'
                "cycles_per_s_by_round": rates,
                "server_cpu_us_per_cycle": statistics.median(
                    r["server_cpu_us_per_cycle"] for r in runs
                ),
                "payload_bytes_per_cycle": runs[0]["payload_bytes"] / cycles,
                "error_replies": sum(r["error_replies"] for r in runs),
                "wrong_replies": sum(r["wrong_replies"] for r in runs),
                "first_bad": next((r["first_bad"] for r in runs if r["first_bad"]), None),
            }
        )
    return rows
