"""The protected resource: a SQLite database behind a small loopback server.

Workers do not open the database themselves: a worker stopped with SIGSTOP inside a
SQLite write would hold the file's lock and stall every other process. They send one
JSON line per request to this server instead, as they would call a remote service; it
applies requests one at a time, in the order it reads them, and records each in the
database with its own monotonic time (the store's order is the truth the checker uses).

Tables (one row per resource, a resource being ``<family>:<name>``):

* ``fence(resource, token, body, writes)``: the fenced value. A write with token ``t``
  from body ``b`` is accepted when ``t`` is above the stored token, or equal to it from
  the same body (a body writes several times); otherwise it is refused.
* ``counter(resource, value)``: an unfenced counter, read and written back by the bodies
  (read-modify-write with a pause between): an overlap loses an update.
* ``writes(seq, t, resource, token, body, proc, task, accepted)``: every fenced write
  attempt, accepted or refused, in the store's order; ``token`` NULL for kinds without
  tokens (Redlock, the unlocked control), whose writes are always accepted.
* ``counter_ops(seq, t, resource, op, value, body)``: every counter read and write.

Run as ``python -m tests.robustness.store <database> <port file>``: it listens on a free
loopback port, writes the port to the port file, and serves until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS fence (
    resource TEXT PRIMARY KEY, token INTEGER NOT NULL, body TEXT NOT NULL,
    writes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counter (resource TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS writes (
    seq INTEGER PRIMARY KEY, t INTEGER NOT NULL, resource TEXT NOT NULL, token INTEGER,
    body TEXT NOT NULL, proc TEXT NOT NULL, task TEXT NOT NULL, accepted INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counter_ops (
    seq INTEGER PRIMARY KEY, t INTEGER NOT NULL, resource TEXT NOT NULL, op TEXT NOT NULL,
    value INTEGER NOT NULL, body TEXT NOT NULL
);
"""


class Store:
    """The database and the rules of its requests (no networking)."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.executescript(SCHEMA)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        now = time.monotonic_ns()
        resource = request["res"]
        if op == "fence":
            return {"ok": self._fence(now, resource, request)}
        if op == "get":
            row = self.db.execute(
                "SELECT value FROM counter WHERE resource = ?", (resource,)
            ).fetchone()
            value = 0 if row is None else int(row[0])
            self._counter_op(now, resource, "get", value, request["body"])
            return {"value": value}
        if op == "set":
            value = int(request["value"])
            self.db.execute(
                "INSERT INTO counter (resource, value) VALUES (?, ?) "
                "ON CONFLICT (resource) DO UPDATE SET value = excluded.value",
                (resource, value),
            )
            self._counter_op(now, resource, "set", value, request["body"])
            return {"ok": True}
        raise ValueError(f"unknown op {op!r}")

    def _fence(self, now: int, resource: str, request: dict[str, Any]) -> bool:
        token, body = request["token"], request["body"]
        accepted = True
        if token is not None:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(
                "INSERT OR IGNORE INTO fence (resource, token, body, writes) VALUES (?, -1, '', 0)",
                (resource,),
            )
            # the fenced write itself: one conditional UPDATE, as an application would do
            done = self.db.execute(
                "UPDATE fence SET token = ?, body = ?, writes = writes + 1 "
                "WHERE resource = ? AND (token < ? OR (token = ? AND body = ?))",
                (token, body, resource, token, token, body),
            )
            accepted = done.rowcount == 1
        self.db.execute(
            "INSERT INTO writes (t, resource, token, body, proc, task, accepted) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (now, resource, token, body, request["proc"], request["task"], int(accepted)),
        )
        if token is not None:
            self.db.execute("COMMIT")
        return accepted

    def _counter_op(self, now: int, resource: str, op: str, value: int, body: str) -> None:
        self.db.execute(
            "INSERT INTO counter_ops (t, resource, op, value, body) VALUES (?, ?, ?, ?, ?)",
            (now, resource, op, value, body),
        )

    def close(self) -> None:
        self.db.close()


def _write_port(port_file: str, port: int) -> None:
    temporary = Path(port_file + ".tmp")
    temporary.write_text(str(port))  # then renamed: the runner never reads half a port
    temporary.replace(port_file)


async def serve(path: str, port_file: str) -> None:
    store = Store(path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while line := await reader.readline():
                try:
                    reply = store.handle(json.loads(line))
                except Exception as exc:  # a bad request is answered, never fatal
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _write_port(port_file, port)
    await stop.wait()
    server.close()
    store.close()


class StoreClient:
    """One connection to the store, for one task: a request at a time.

    A request interrupted by a cancellation leaves its reply unread, so the connection is
    dropped and the next request opens a new one (the interrupted request may still have
    been applied: the store's tables say so).
    """

    def __init__(self, port: int, proc: str, task: str) -> None:
        self.port = port
        self.proc = proc
        self.task = task
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            if self._conn is None:
                self._conn = await asyncio.open_connection("127.0.0.1", self.port)
            reader, writer = self._conn
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            line = await reader.readline()
            if not line:
                raise ConnectionError("the store closed the connection")
        except BaseException:
            self.close()
            raise
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"store: {reply['error']}")
        return reply

    async def fence(self, resource: str, token: int | None, body: str) -> bool:
        request = {"op": "fence", "res": resource, "token": token, "body": body}
        reply = await self._call({**request, "proc": self.proc, "task": self.task})
        return bool(reply["ok"])

    async def get(self, resource: str, body: str) -> int:
        reply = await self._call({"op": "get", "res": resource, "body": body})
        return int(reply["value"])

    async def set(self, resource: str, value: int, body: str) -> None:
        await self._call({"op": "set", "res": resource, "value": value, "body": body})

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn[1].close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
