"""Wire formats shared with other clients: one module per family, registered here.

A format subclasses :class:`aiolock._wire.WireFormat`, so ``aiolock._wire`` cannot import
it (an import cycle): this package adds it to ``_FORMATS`` instead, and
:mod:`aiolock._manager` imports this package, so every format is registered before any
``wire=`` is checked. Each name must also be listed in :data:`aiolock._wire.WireName`.
"""

from .._wire import _FORMATS
from .redisson import RedissonFormat
from .strings import TimestampFormat, TokenFormat

__all__ = ["RedissonFormat", "TimestampFormat", "TokenFormat"]

_FORMATS["redisson"] = RedissonFormat()
_FORMATS["token"] = TokenFormat()
_FORMATS["timestamp"] = TimestampFormat()
