"""What ``aiolock list`` and ``aiolock show`` read of a plain lock, and what it says.

The lock's keys (see :mod:`aiolock._kinds.lock.kind` and ``state.lua``), for a prefix
``P`` and a hash tag ``T``:

==========================  ================================================================
``P:lock:{T}``              one string, ``<owner field>|<count>|<token>|<epoch>|<waiter
                            flag>`` while held, ``|<epoch>|<last token>`` while free
                            (:mod:`aiolock._kinds.lock.state`)
``P:lock:{T}:listeners``    zset: manager id -> expiry (server ms), the managers whose
                            waiters listen for its release (:mod:`aiolock._engine.listeners`)
``P:lock:{T}:job``          a ``contrib.jobs`` holder record, read by ``show``
==========================  ================================================================

A free state (kept after the last release for the fence and for resent releases) is no
lock object: it is read and left out. The holder gets its fencing token (the state's
``<token>``, what its handle's ``fencing_token`` reads) and ``held_for``, the server's
``TIME`` (the first command of the same pipeline as the state) less that token: tokens
are the server's clock in microseconds at the grant, or forced above it, so the figure
is a lower bound of the hold's age. No fence key is read: a held state keeps the
holder's token, not the one released before it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiolock._kinds.lock.state import parse_state
from aiolock._redis.inspect import Describer, Holder, LockInfo, Who, lease_ends

__all__ = ["LockDescriber"]


class LockDescriber(Describer):
    """The plain lock's keys, for the inspector."""

    kind = "lock"
    string = True  # the lock's whole state
    extra = 1
    fenced = False
    jobs = True

    def queue(self, pipe: Any, key: str) -> None:
        pipe.zrange(f"{key}:listeners", 0, -1, withscores=True)

    def parse(
        self, base: LockInfo, raw: Any, fields: dict[str, str], extra: list[Any], now_ms: float
    ) -> LockInfo | None:
        # registrations still live on the server's clock
        live = sorted(m for m, left in lease_ends(extra[0], now_ms).items() if left > 0)
        return _parse_lock(raw, replace(base, listening=tuple(Who(m) for m in live)), now_ms)


def _parse_lock(raw: Any, base: LockInfo, now_ms: float) -> LockInfo | None:
    """A plain lock's state string (:mod:`aiolock._kinds.lock.state`): held,
    ``<field>|<count>|<token>|<epoch>|<flag>``; free, ``|<epoch>|<last>`` (None: no
    object). A value aiolock did not write (or a key of another type, an error reply) is
    shown without holders, as the other kinds' foreign keys are. *now_ms* is the
    server's ``TIME``, read before the state."""
    if raw is None:  # gone between SCAN and GET
        return None
    state = parse_state(raw)  # None for an error reply too
    if state is None:
        return base
    if state.free:
        return None
    holder = Holder(
        state.field,
        state.holds,
        token=state.token,
        held_for=_held_for(state.token, now_ms),
        lease_left=base.ttl,
    )
    # no fence: a held state keeps the holder's token, not the one released before it
    # (tokens follow the server's clock, so that one is not the holder's minus one)
    return replace(base, holders=(holder,))


def _held_for(token: int, now_ms: float) -> float:
    """Seconds from a plain lock's token to the server's *now_ms*: a lower bound of the
    hold's age. The acquire script takes the token from the server's ``TIME`` in
    microseconds, or the last token plus one where the clock is not above it (state.lua's
    ``next_token``): the token is never below the clock at the grant, and *now_ms* was
    read before the state, so the hold began at least this long ago (on that server's
    clock). A token above *now_ms* (forced above a clock that was behind, or a grant
    between the two reads) gives 0."""
    return round(max(0.0, (now_ms * 1000 - token) / 1_000_000), 3)
