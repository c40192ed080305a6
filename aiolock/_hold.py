"""A hold: what the client knows about one lock held by one owner (task).

The hold count is kept in Redis; :class:`Hold` mirrors it so that releases can be made
idempotent (the client sends the count it has) and so the watchdog knows what to renew.
A hold ends in one of two ways: released (removed from the registry) or lost (marked
``lost`` by the watchdog or its lease timer, its ``async with`` bodies cancelled).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anyio import CancelScope

    from ._keys import LockKeys

__all__ = ["Hold"]


class Hold:
    __slots__ = (
        "count",
        "field",
        "keys",
        "lease",
        "lost",
        "lost_reason",
        "owner",
        "release_id",
        "renew",
        "scopes",
        "timer",
        "token",
        "valid_until",
    )

    def __init__(
        self,
        keys: LockKeys,
        owner: str,
        field: str,
        token: int,
        lease: float,
        renew: bool,
        sent_at: float,
    ) -> None:
        self.keys = keys
        #: the task that holds it (``<manager id>:<task serial>``): the registry's key
        self.owner = owner
        #: the hash field in Redis: the owner plus a number unique to this acquisition, so a
        #: late or resent command about an earlier hold can never touch this one
        self.field = field
        self.token = token
        self.count = 1
        self.lease = lease
        self.renew = renew
        #: monotonic time by which the lease has surely ended unless renewed: measured
        #: from before the command was sent, so it errs early, never late.
        self.valid_until = sent_at + lease
        self.timer: asyncio.TimerHandle | None = None
        self.lost = False
        self.lost_reason = ""
        #: cancel scopes of the ``async with`` bodies running under this hold
        self.scopes: list[CancelScope] = []
        #: the id of a final release sent but not confirmed, reused when it is retried
        self.release_id: str | None = None

    def __repr__(self) -> str:
        state = "lost" if self.lost else ("renewed" if self.renew else "fixed")
        return f"<Hold {self.keys.name!r} count={self.count} token={self.token} {state}>"
