"""Key, channel and owner-field naming: the wire format, in one place.

For a manager prefix ``P``, a kind (or format) tag ``K`` and a lock name ``N`` (UTF-8),
an object uses, with the hash *tag* ``T`` defined below:

==================================  =================================================
``P:K:{T}``                         the object's own structure (for the reentrant
                                    lock, ``K = lock``: a hash ``<owner field>`` ->
                                    hold count)
``P:K:{T}:fence``                   string: the last fencing token released (kept
                                    ``fence_ttl``)
``P:K:{T}:rel:<release id>``        string: a final release that ran, kept a few
                                    seconds so a resent release answers as the first did
``P:K:{T}:void:<attempt id>``       marker: an acquire attempt that was cancelled in
                                    flight
``P:K:{T}:released``                pub/sub channel: a message per final release
==================================  =================================================

Attempt and release ids are ``<manager id>:<number>``, unique across clients. What each
kind stores in its structure is documented with the kind (:mod:`aiolock._kinds`). The
tags (:data:`TAGS`): ``lock``, ``fair``, ``rw``, ``sem``, ``redlock``, and for aiolock's
own keys beside a lock shared with other clients ``token``, ``ts`` and ``rs``. One more
tag is not a lock's: ``mgr``, the identity record of a manager, ``P:mgr:{<manager id>}``
(:mod:`aiolock._redis.identity`); a manager id is no lock name, and no lock has that tag.

The hash tag is the name itself, ``T = N``, unless ``N`` starts with ``}`` or with the
escape character ``~``; then ``T = "~" + N``. Examples: ``order:42`` -> ``P:lock:{order:42}``,
``}x`` -> ``P:lock:{~}x}``, ``~a`` -> ``P:lock:{~~a}``, ``{}`` -> ``P:lock:{{}}``.

Why: Redis Cluster hashes a key by the text between its first ``{`` and the first ``}``
after it, unless that text is empty (then the whole key is hashed). The prefix and the tag
have no braces, so that text is the start of ``T`` up to its first ``}`` (or all of ``T``):
the same for every key and the channel of one lock, and never empty because ``T`` never
starts with ``}``. So one lock's keys and channel share ONE slot (:attr:`LockKeys.slot`),
for every name.

Distinct ``(P, K, N)`` never share a key or a channel (issue 18: before, the reentrant
lock had no tag, so prefix ``app:sem`` with lock ``x`` and prefix ``app`` with semaphore
``x`` both used ``app:sem:{x}``):

* ``P`` and ``K`` come back from a key alone: the text before its first ``{`` is
  ``P:K:``; ``P`` has no braces and ``K`` has no ``:``, so ``K`` is the last
  ``:``-separated field of that text and ``P`` is what comes before it
  (:func:`split_key`), whatever ``:`` or tags ``P`` contains;
* ``N -> T`` is injective (an escaped ``T`` starts with ``~``, an unescaped one never
  does, and stripping the ``~`` gives ``N`` back), and ``T`` comes back from a key because
  the suffixes after the closing ``}`` contain no ``}`` (the attempt ids neither), so the
  last ``}`` of a key separates ``T`` from its suffix; an object's own key is the only one
  of its keys that ends with ``}``.

(The formats shared with other clients keep their lock at the raw name, outside any
prefix; their names are checked so that no key of theirs has this shape: see
:func:`check_foreign_key`. aiolock's own keys beside such a lock, tags ``token``, ``ts``
and ``rs``, write ``N`` after the brace as :func:`aiolock._formats.foreign.aux_base` says,
which is injective in its own way.)

Owner fields are ``<manager id>:<task serial>``: the manager id is 128 random bits in hex
(``secrets``), the serial numbers the asyncio tasks that manager has seen.

All of this, with what each kind keeps in its keys, is one *layout*, numbered by
:data:`LAYOUT`. Managers of two layouts on one prefix do not exclude each other where
their keys differ (before issue 18 the lock was ``P:{T}``, and a manager of that build
and one of this held a name at once), so every manager announces its layout in its
identity record and refuses to open beside a manager of another one
(:mod:`aiolock._redis.layout`).
"""

from __future__ import annotations

import math
import secrets

from redis.crc import key_slot

__all__ = [
    "ESCAPE",
    "FAIR_TAG",
    "FORMAT_TAGS",
    "IDENTITY_TAG",
    "KIND_LABELS",
    "KIND_TAGS",
    "LAYOUT",
    "LOCK_TAG",
    "MAX_NAME_BYTES",
    "REDISSON_TAG",
    "REDLOCK_TAG",
    "RW_TAG",
    "SEMAPHORE_TAG",
    "TAGS",
    "TIMESTAMP_TAG",
    "TOKEN_TAG",
    "KeySpace",
    "LockKeys",
    "check_foreign_key",
    "check_lease",
    "check_max_hold",
    "check_name",
    "check_prefix",
    "check_timeout",
    "hash_tag",
    "identity_key",
    "ms",
    "new_manager_id",
    "split_key",
]

#: The version of the layout of keys, channels and values under a prefix: the naming in
#: this module, each kind's structures and messages, the identity record. Every manager
#: announces it in its identity record (field ``l``) and refuses to open beside a live
#: record of another version (:mod:`aiolock._redis.layout`). Bump it with any change after
#: which a manager of this build and one of the next could miss or misread each other's
#: keys (a key renamed, a structure of another type or shape): they then refuse each other
#: instead of both holding a lock. Records written before the field existed have none and
#: count as 1 (:data:`aiolock._redis.identity.UNVERSIONED`).
LAYOUT = 1

#: Prepended to a name that starts with ``}`` (which would give an empty Cluster hash tag)
#: or with itself (so that the escaping stays reversible). See the module docstring.
ESCAPE = "~"

# -- The tags: every one is spelled here, and only here ---------------------------------
# A kind, a format or a topology imports its tag from this table; the ``aiolock`` command
# reads the kinds it shows from :data:`KIND_TAGS` and :data:`KIND_LABELS`. A new kind adds
# its tag here (docs/architecture.md, "Adding a kind"; tests/unit/test_structure.py checks).

#: The tag of the reentrant lock's keys: ``P:lock:{T}``.
LOCK_TAG = "lock"
#: The fair lock's: ``P:fair:{T}``.
FAIR_TAG = "fair"
#: The read-write lock's (both sides share one structure): ``P:rw:{T}``.
RW_TAG = "rw"
#: The semaphore's: ``P:sem:{T}``.
SEMAPHORE_TAG = "sem"
#: Redlock's (on each master): ``P:redlock:{T}``, never the single-server lock's keys.
REDLOCK_TAG = "redlock"
#: aiolock's own keys beside a lock of the ``token`` format: ``P:token:{...}``.
TOKEN_TAG = "token"
#: ... of the ``timestamp`` format: ``P:ts:{...}``.
TIMESTAMP_TAG = "ts"
#: ... of the ``redisson`` format: ``P:rs:{...}``.
REDISSON_TAG = "rs"

#: The tag of a manager's identity record: ``P:mgr:{<manager id>}`` (never a lock's key:
#: no kind uses this tag, so :func:`split_key` tells the two apart).
IDENTITY_TAG = "mgr"

#: The lock objects under a prefix, by the name the ``aiolock`` command gives each kind
#: (the name of its folder, ``aiolock/_kinds/<name>/``; ``redlock``: ``aiolock/_redlock/``),
#: with the tag of its keys, in the order the command lists them.
KIND_TAGS: dict[str, str] = {
    "lock": LOCK_TAG,
    "fair": FAIR_TAG,
    "rw": RW_TAG,
    "semaphore": SEMAPHORE_TAG,
    "redlock": REDLOCK_TAG,
}
#: How the command's tables name each kind of :data:`KIND_TAGS`.
KIND_LABELS: dict[str, str] = {
    "lock": "lock",
    "fair": "fair lock",
    "rw": "rw lock",
    "semaphore": "semaphore",
    "redlock": "redlock",
}
#: aiolock's own keys beside a lock of a format shared with other clients, by the
#: format's name (``wire=``): the tag of those keys.
FORMAT_TAGS: dict[str, str] = {
    "token": TOKEN_TAG,
    "timestamp": TIMESTAMP_TAG,
    "redisson": REDISSON_TAG,
}

#: Every tag a key under a prefix may carry after it (``P:<tag>:{...}``): the kinds of
#: aiolock's own format, Redlock's locks, aiolock's own keys beside a lock of a format
#: shared with other clients, and the identity records. :class:`LockKeys` refuses an
#: unknown tag, and :func:`check_foreign_key` relies on this set being complete.
TAGS = frozenset({*KIND_TAGS.values(), *FORMAT_TAGS.values(), IDENTITY_TAG})

#: A lock name longer than this many UTF-8 bytes is refused: it would be sent with every
#: command of the lock, and a name that long is almost certainly a bug.
MAX_NAME_BYTES = 4096


def new_manager_id() -> str:
    """128 random bits, hex: unique per LockManager, unguessable by other clients."""
    return secrets.token_hex(16)


def _short(value: object, limit: int = 20) -> str:
    """``repr(value)``, cut to *limit* characters plus an ellipsis when longer: an error
    message must not print a 400-digit integer or a megabyte string back to its reader."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…"


def check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(
            "lock name must be encodable as UTF-8 (it contains a lone surrogate)"
        ) from None
    if size > MAX_NAME_BYTES:
        raise ValueError(f"lock name is {size} bytes in UTF-8; at most {MAX_NAME_BYTES} allowed")
    return name


def _check_seconds(value: object, what: str) -> float:
    if type(value) is float and -math.inf < value < math.inf:  # the common case, at once
        return value
    # bool is an int subclass, and True seconds is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        raise ValueError(
            f"{what} must be a finite number of seconds, got {_short(value)}"
        ) from None
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{what} must be a finite number of seconds, got {_short(value)}")
    return seconds


#: Leases are sent to Redis in whole milliseconds; below 1 ms there is nothing to send,
#: and beyond ~100 years PEXPIRE would overflow the server's clock arithmetic.
MIN_LEASE = 0.001
MAX_LEASE = 3_153_600_000.0


def ms(seconds: float) -> int:
    """Seconds as the whole milliseconds Redis takes (PEXPIRE, PX), at least 1."""
    return max(1, round(seconds * 1000))


def check_lease(lease: object, what: str = "lease") -> float:
    seconds = _check_seconds(lease, what)
    if not MIN_LEASE <= seconds <= MAX_LEASE:
        raise ValueError(
            f"{what} must be between {MIN_LEASE} and {MAX_LEASE:.0f} seconds, got {_short(lease)}"
        )
    return seconds


def check_max_hold(max_hold: object) -> float | None:
    """``max_hold``: None (no bound) or a lease-like number of seconds."""
    return None if max_hold is None else check_lease(max_hold, "max_hold")


#: The largest int a float holds exactly: a whole number of seconds up to it is converted
#: at once (the common ``timeout=5``), beyond it the general checks apply.
_EXACT_INT = 2**53


def check_timeout(timeout: object, what: str = "timeout") -> float | None:
    """``None`` means wait forever; ``0`` means one attempt."""
    if timeout is None:
        return None
    if type(timeout) is float and 0 <= timeout < math.inf:  # the common case, at once
        return timeout
    if type(timeout) is int and 0 <= timeout <= _EXACT_INT:  # ``timeout=5``: as float(5)
        return float(timeout)
    seconds = _check_seconds(timeout, what)
    if seconds < 0:
        raise ValueError(
            f"{what} must be >= 0 seconds or None (wait forever), got {_short(timeout)}"
        )
    return seconds


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if not prefix:
        raise ValueError("prefix must not be empty: it keeps aiolock's keys apart from others")
    if "{" in prefix or "}" in prefix:
        # A brace in the prefix would become the Cluster hash tag of every lock, putting
        # them all in one slot, and would break the uniqueness argument above (the first
        # brace of a key ends its prefix and tag). Any other character is fine, ":" and
        # the tags included.
        raise ValueError(f"prefix must not contain '{{' or '}}', got {_short(prefix)}")
    return prefix


def hash_tag(name: str) -> str:
    """The text between the braces of a lock's keys: *name*, escaped with :data:`ESCAPE`
    when it starts with ``}`` or with the escape character itself (see the module docstring)."""
    return ESCAPE + name if name.startswith(("}", ESCAPE)) else name


def identity_key(prefix: str, manager_id: str) -> str:
    """The key of the identity record of the manager *manager_id* under *prefix*."""
    return f"{prefix}:{IDENTITY_TAG}:{{{manager_id}}}"


def split_key(key: str) -> tuple[str, str, str] | None:
    """``(prefix, tag, rest)`` of a key or channel of aiolock's layout ``P:K:{...``, where
    *rest* starts at the first ``{``; None if *key* does not have that shape with a tag of
    :data:`TAGS`. The inverse of the head of every key under a prefix (module docstring)."""
    brace = key.find("{")
    if brace < 0 or not key[:brace].endswith(":"):
        return None
    prefix, colon, tag = key[: brace - 1].rpartition(":")
    if not colon or not prefix or tag not in TAGS:
        return None
    return prefix, tag, key[brace:]


def check_foreign_key(key: str, name: str, wire: str) -> str:
    """*key*, a key or channel a format shared with other clients derives from the lock
    *name* outside every prefix, or a ValueError if it has the shape of a key of aiolock's
    own layout (:func:`split_key`): it could then be the key of another manager's object
    (``app:lock:{x}`` is lock ``x`` under prefix ``app``), and two clients would meet on one
    key without meaning to."""
    split = split_key(key)
    if split is not None:
        prefix, tag, _ = split
        raise ValueError(
            f"lock name {_short(name, 60)} cannot be used with the {wire!r} wire format: "
            f"its key {_short(key, 60)} has the shape of aiolock's own keys (prefix "
            f"{_short(prefix, 40)}, tag {tag!r}, then '{{'), so it could be another "
            "manager's lock. Pick a name without a tag right before ':{' (tags: "
            f"{', '.join(sorted(TAGS))})"
        )
    return key


class LockKeys:
    """The keys and channel of one lock name, computed once per handle."""

    __slots__ = ("channel", "fence", "kind", "lock", "name", "slot", "turns", "void_prefix")

    def __init__(self, prefix: str, name: str, kind: str = LOCK_TAG) -> None:
        # Every kind names its keys ``P:<kind>:{T}``, the reentrant lock too: a name used
        # with two kinds names two independent objects, never one structure read two
        # ways, and the tag right before the brace tells prefixes apart (module docstring).
        if kind not in TAGS or kind == IDENTITY_TAG:  # pragma: no cover - a wiring mistake
            raise ValueError(f"unknown key tag {kind!r}; add it to aiolock._keys.TAGS")
        base = f"{prefix}:{kind}:{{{hash_tag(name)}}}"
        self.name = name
        #: the kind's tag in the keys (see :data:`TAGS`)
        self.kind = kind
        self.lock = base
        self.fence = f"{base}:fence"
        self.channel = f"{base}:released"
        #: the managers starving for this lock, in turn (the reentrant lock's turns.lua)
        self.turns = f"{base}:turns"
        self.void_prefix = f"{base}:void:"
        #: the Redis Cluster slot of every key and the channel of this lock
        self.slot = key_slot(self.lock.encode())

    def void(self, attempt_id: str) -> str:
        """The void marker of one acquire attempt; *attempt_id* must be unique across clients."""
        return f"{self.void_prefix}{attempt_id}"

    def tombstone(self, release_id: str) -> str:
        """The key that remembers one final release; *release_id* is unique across clients."""
        return f"{self.lock}:rel:{release_id}"

    def part(self, suffix: str) -> str:
        """Another key of this object (same slot): ``<lock key>:<suffix>``."""
        return f"{self.lock}:{suffix}"


class KeySpace:
    """Naming for one manager: its prefix, its id, and its owners' field names."""

    __slots__ = ("_known", "manager_id", "prefix")

    #: names whose keys are kept: handles are usually made per call (``lock(name)`` in a
    #: request handler), and building the keys was a tenth of the client's time per cycle
    KNOWN_MAX = 4096

    def __init__(self, prefix: str, manager_id: str) -> None:
        self.prefix = check_prefix(prefix)
        self.manager_id = manager_id
        self._known: dict[tuple[str, str], LockKeys] = {}

    def keys(self, name: str, kind: str = LOCK_TAG) -> LockKeys:
        """The keys of *name* (a :class:`LockKeys` is never changed, so it is shared)."""
        known = self._known.get((name, kind))
        if known is None:
            if len(self._known) >= self.KNOWN_MAX:
                self._known.clear()  # simpler than LRU, and a miss only costs a rebuild
            known = self._known[name, kind] = LockKeys(self.prefix, name, kind)
        return known

    @property
    def identity_key(self) -> str:
        """The key of this manager's identity record: ``P:mgr:{<manager id>}``."""
        return identity_key(self.prefix, self.manager_id)

    def owner(self, serial: int) -> str:
        return f"{self.manager_id}:{serial}"
