"""A manager's identity record: who a holder is, for the ``aiolock`` command and people.

Every open :class:`~aiolock.LockManager` keeps one small string in Redis, at
``P:mgr:{<manager id>}`` (see :func:`aiolock._keys.identity_key`): a JSON object with
one-letter fields, to keep it within about 200 bytes of server memory:

=====  ===================================================================
``h``  the host name (``socket.gethostname()``)
``p``  the process id
``c``  the process name (the module run with ``-m``, else the script)
``n``  the application name given as ``LockManager(name=...)``; absent when none was
``v``  aiolock's version
``l``  the layout of keys the manager uses (:data:`aiolock._keys.LAYOUT`); absent
       from records written before issue 36, which count as layout 1
       (:data:`UNVERSIONED`)
``t``  when the manager opened (Unix time in whole seconds, the process's clock)
=====  ===================================================================

The manager id is the key's hash tag, and every owner, attempt and release id of the
manager starts with it (``<manager id>:<serial>``), so any field in a lock's structure
leads to its record. The record is written with ``SET ... PX <lease>`` when the manager
opens (by open() itself after its check of the server, so that it exists once open()
returns; with ``check_on_open=False``, which promises no I/O at open, a third of a
lease later) and again every ``lease / 3``, the watchdog's period, by a loop of its own
(:meth:`Identity.keep`): no command per acquire, and a slow write never holds back a
renewal. It disappears within one lease after the process
dies, and is deleted when the manager closes. ``LockManager(identity=False)`` writes none.

Beside it, ``P:mgr:{<manager id>}:top`` holds the manager's contention summary while it
has one (:mod:`aiolock._engine.contention`); it is deleted with the record.

The record is also how managers of two layouts on one prefix find each other: a manager
that opens reads the records under its prefix and refuses to open beside one of another
layout (:mod:`aiolock._redis.layout`). So its key and its ``l`` field stay where they are
in every layout to come.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

import anyio

from aiolock._errors import LockError
from aiolock._keys import LAYOUT, ms

if TYPE_CHECKING:
    from aiolock._redis.client import Client
    from aiolock._redis.cluster import ClusterClient

__all__ = [
    "MAX_NAME",
    "UNVERSIONED",
    "Identity",
    "check_app_name",
    "layout_of",
    "manager_of",
    "parse_record",
]

logger = logging.getLogger("aiolock")

#: The longest application name (characters): the record must stay small.
MAX_NAME = 64
#: The longest process name and host name kept in the record (characters).
_MAX_TEXT = 64

#: The layout of a record without the field ``l``, written before it existed (issues 20 to
#: 35): layout 1, this build's. The build just before this one keeps this layout, so an
#: upgrade from it changes no layout and meets no refusal. The earlier pre-release builds
#: that wrote records (all after issue 18's ``P:{T}`` -> ``P:lock:{T}``) are taken for 1
#: too, though not all of them match it: those between issues 20 and 21 kept the lock as a
#: hash at the same key, and fail loudly on it (LockKeyTypeError).
UNVERSIONED = 1


def check_app_name(name: object) -> str | None:
    """``LockManager(name=...)``: None, or a printable str of 1 to 64 characters."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"name must be a str or None, not {type(name).__name__}")
    if not name or len(name) > MAX_NAME or not name.isprintable():
        shown = repr(name) if len(name) <= MAX_NAME else f"{name[:MAX_NAME]!r}…"
        raise ValueError(
            f"name must be 1 to {MAX_NAME} printable characters (it names the application "
            f"in the manager's identity record), got {shown}"
        )
    return name


def process_name() -> str:
    """What ``ps`` users would call this process: the module run with ``python -m``
    (``uvicorn``, ``celery``), else the script's file name, else ``python``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if isinstance(name, str) and name:
        name = name.removesuffix(".__main__")
    elif sys.argv and sys.argv[0]:
        name = os.path.basename(sys.argv[0])
    else:
        name = "python"
    return name[:_MAX_TEXT]


def record(app_name: str | None, layout: int = LAYOUT) -> str:
    """The record's value, as this process publishes it (*layout*: this build's, but for
    the tests that play a manager of another one)."""
    # Read from the package at call time (it is imported by then): importing it here
    # would be an import cycle, the package importing the manager, which imports this.
    version = getattr(sys.modules.get("aiolock"), "__version__", "?")
    data: dict[str, Any] = {
        "h": socket.gethostname()[:_MAX_TEXT],
        "p": os.getpid(),
        "c": process_name(),
    }
    if app_name is not None:
        data["n"] = app_name
    data["v"] = version
    data["l"] = layout
    data["t"] = int(time.time())
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def parse_record(raw: Any) -> dict[str, Any] | None:
    """A record read back, or None if *raw* is missing or not one aiolock wrote."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def layout_of(data: dict[str, Any]) -> int | None:
    """The layout a record announces: its ``l``, :data:`UNVERSIONED` without one, None if
    ``l`` is not a layout number (a record aiolock did not write: no layout it knows)."""
    layout = data.get("l", UNVERSIONED)
    # (``type`` and not isinstance: True is an int, and no layout)
    return layout if type(layout) is int else None


def manager_of(field: str) -> str | None:
    """The manager id a field of a lock's structure starts with (``<id>:<serial>``), or None."""
    head = field.split(":", 1)[0]
    if len(head) == 32 and all(c in "0123456789abcdef" for c in head):
        return head
    return None


class Identity:
    """Writes and deletes one manager's record (see the module docstring)."""

    def __init__(
        self,
        client: Client | ClusterClient,
        key: str,
        app_name: str | None,
        lease: float,
        layout: int = LAYOUT,
    ) -> None:
        self.client = client
        self.key = key
        self._app_name = app_name
        #: the layout announced: this build's (another only in the tests, which play a
        #: manager of an older or a newer build with it)
        self.layout = layout
        self.lease_ms = ms(lease)
        self.limit = lease / 3
        self._value: str | None = None
        #: whether the last write failed (a failure is logged once, not every round)
        self._failing = False

    async def publish(self) -> None:
        """Write (or refresh) the record; a failure is logged and the next round retries."""
        if self._value is None:
            self._value = record(self._app_name, self.layout)
        try:
            with anyio.fail_after(self.limit):
                await self.client.call(
                    "SET", self.key, self._value, "PX", self.lease_ms, key=self.key
                )
        except (LockError, TimeoutError) as exc:
            if not self._failing:
                # (not the key: it holds the manager id, which logs never show)
                logger.warning(
                    "could not publish the manager's identity record (the aiolock "
                    "command shows its holds without host and pid until it is): %s",
                    str(exc) or "no reply within a third of the lease",
                )
            self._failing = True
            return
        self._failing = False

    async def keep(self, period: float) -> None:
        """Refresh the record every *period* (the watchdog's) while the manager is open.

        A loop of its own beside the watchdog's, not a step of its rounds: a slow write
        (bounded at a third of the lease) must never hold back a renewal.
        """
        while True:
            await anyio.sleep(period)
            await self.publish()

    async def delete(self) -> None:
        """Delete the record (at close); it expires on its own if this fails."""
        try:
            # (and the contention summary beside it: aiolock._engine.contention)
            await self.client.call("DEL", self.key, f"{self.key}:top", key=self.key)
        except LockError as exc:
            logger.debug("could not delete the manager's identity record: %s", exc)
