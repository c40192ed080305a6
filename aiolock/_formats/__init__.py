"""Wire formats: which Redis structures a manager's locks use, chosen per manager or per lock.

:class:`~aiolock._formats.base.WireFormat` is aiolock's own layout; each format shared with
another client (:mod:`~aiolock._formats.redisson.format`, :mod:`~aiolock._formats.strings`)
subclasses it. This package is the catalog: it sits above the kinds, so it may import every
one of them, and nothing below it imports it (the engine and the kinds never learn which
format made them). Each name here must also be listed in
:data:`aiolock._formats.base.WireName`.
"""

from __future__ import annotations

from aiolock._formats.base import KindMaker, WireFormat, WireName
from aiolock._formats.redisson.format import RedissonFormat
from aiolock._formats.strings import TimestampFormat, TokenFormat

__all__ = ["KindMaker", "WireFormat", "WireName", "check_wire", "wire_format"]

_FORMATS: dict[str, WireFormat] = {
    "aiolock": WireFormat(),
    "redisson": RedissonFormat(),
    "token": TokenFormat(),
    "timestamp": TimestampFormat(),
}


def check_wire(value: object, what: str = "wire") -> str:
    """A wire format name, or a clear error listing the allowed ones."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str naming a wire format, not {type(value).__name__}")
    if value not in _FORMATS:
        allowed = ", ".join(repr(name) for name in _FORMATS)
        raise ValueError(f"unknown wire format {value!r} for {what}; allowed: {allowed}")
    return value


def wire_format(name: str) -> WireFormat:
    """The format called *name* (checked by :func:`check_wire` first)."""
    return _FORMATS[check_wire(name)]
