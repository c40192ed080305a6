"""The plain lock's state string, read and written in Python: the twin of the Lua prelude
``aiolock/_kinds/lock/state.lua``, which has the layout and what each part means::

    held  '<field>|<count>|<token>|<epoch>|<flag>'   PX = the holder's lease
    free  '|<epoch>|<last>'                          PX = the keep (or no expiry)

:func:`parse_state` accepts exactly what the prelude's ``decode_state`` accepts (ASCII
digits; a field without ``|``, never empty; a flag of anything), so the client, the
scripts and ``aiolock show`` agree on which values are aiolock's and what they say.
``tests/unit/_kinds/lock/test_state.py`` round-trips random states between the two on a
real server.

It lives with the kind whose layout it is, and two modules of the kind read it: the
kind (:mod:`aiolock._kinds.lock.kind`: ``locked()``, ``hold_count()``) and its
describer for ``aiolock show`` (:mod:`aiolock._kinds.lock.inspect`). It imports nothing
of aiolock. Nothing here runs on an acquire's or a release's path: those decode the
scripts' replies, never the state.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["DEFAULT_KEEP_MS", "LockState", "format_state", "parse_state"]

#: How long a free state is kept (ms) when a release leaves its keep out: the keep of a
#: manager with the default ``fence_ttl`` (60 s). ``KEEP_MS`` in
#: ``aiolock/_kinds/lock/codes.lua``; a test checks that the two agree.
DEFAULT_KEEP_MS = "60000"


class LockState(NamedTuple):
    """One lock state. A free state has the field ``""``, no holds and the flag
    ``""``, and its :attr:`token` is the last token given (``<last>``)."""

    #: the holder's owner field ("" while free)
    field: str
    #: the holder's hold count, ``<count>`` (0 while free)
    holds: int
    #: the holder's fencing token; while free, the last token given
    token: int
    #: the first token of the epoch: holds with a token in [epoch, token) (held) or
    #: [epoch, last] (free) ended by a release
    epoch: int
    #: the waiter flag: "" (no waiter seen), a manager id, or "*" (several managers)
    flag: str

    @property
    def free(self) -> bool:
        """Whether nobody holds the lock."""
        return not self.field


# decode_state's Lua patterns: '^([^|]+)|(%d+)|(%d+)|(%d+)|(.*)$' and '^|(%d+)|(%d+)$'
# (%d is an ASCII digit; '.' any character, a newline too)
_HELD = re.compile(r"([^|]+)\|([0-9]+)\|([0-9]+)\|([0-9]+)\|(.*)", re.DOTALL)
_FREE = re.compile(r"\|([0-9]+)\|([0-9]+)")


def parse_state(raw: object) -> LockState | None:
    """The state *raw* (GET's reply: bytes or str) says, or None for a value aiolock did
    not write (someone else's string) or no value at all."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if not isinstance(raw, str):
        return None
    if raw[:1] == "|":
        free = _FREE.fullmatch(raw)
        if free is None:
            return None
        return LockState("", 0, int(free[2]), int(free[1]), "")
    held = _HELD.fullmatch(raw)
    if held is None:
        return None
    field, count, token, epoch, flag = held.groups()
    return LockState(field, int(count), int(token), int(epoch), flag)


def format_state(state: LockState) -> str:
    """The string of *state* as the scripts write it (``encode_held``, or
    ``encode_free`` for a free state)."""
    if state.free:
        return f"|{state.epoch}|{state.token}"
    return f"{state.field}|{state.holds}|{state.token}|{state.epoch}|{state.flag}"
