"""The hand-off token, and the refusal of a handle that cannot be handed off.

A token (made by ``Lock.detach()``, taken by ``Lock.adopt()``) names a detached hold:
the lock's key, the detached field and the fencing token, as text safe in argv, URLs
and headers. Only the plain lock of aiolock's own wire format detaches and adopts (its
scripts are :mod:`aiolock._kinds.lock.handoff`); every handle with the lock API checks a
token at the call that got it all the same, so the codec is the handle base's
(:mod:`aiolock._engine.lockhandle`), and so is the refusal the others give.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import NamedTuple

from aiolock._errors import LockError

__all__ = ["DETACHED", "SUPPORTED", "HandoffToken", "refused"]

#: The start of a detached hold's field (and of nothing else: owner fields start with a
#: manager id, 32 hex digits).
DETACHED = "detached:"
#: The start of every token: the format's name and version.
_MAGIC = "aiolock-hold-1."

#: What supports a hand-off, for the errors of the handles that do not.
SUPPORTED = (
    "only a plain Lock of aiolock's own wire format can be detached and adopted "
    "(LockManager.lock(name), wire='aiolock')"
)


def refused(what: str) -> LockError:
    """*what* (``FairLock 'x'``) is a handle that cannot be handed off."""
    return LockError(f"{what} cannot be handed off: {SUPPORTED}")


class HandoffToken(NamedTuple):
    """What a token carries: the lock's key, the detached field and the fencing token."""

    key: str
    field: str
    fence: int

    def encode(self) -> str:
        """Text safe in argv, environment variables, URLs and HTTP headers."""
        raw = json.dumps([self.key, self.field, self.fence], separators=(",", ":"))
        return _MAGIC + base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, token: object) -> HandoffToken:
        """The token *token*, or a ValueError/TypeError saying what is wrong with it."""
        if not isinstance(token, str):
            kind = type(token).__name__
            raise TypeError(f"a hand-off token is a str (from Lock.detach()), not {kind}")
        bad = ValueError(
            f"not a hand-off token made by Lock.detach(): {token[:40]!r}"
            + ("…" if len(token) > 40 else "")
        )
        if not token.startswith(_MAGIC):
            raise bad
        body = token[len(_MAGIC) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            key, field, fence = json.loads(raw.decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError, TypeError):
            raise bad from None
        if not (
            isinstance(key, str)
            and isinstance(field, str)
            and field.startswith(DETACHED)
            and isinstance(fence, int)
            and not isinstance(fence, bool)
        ):
            raise bad
        return cls(key, field, fence)
