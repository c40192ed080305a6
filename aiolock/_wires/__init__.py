"""Wire formats shared with other clients: one module per format, registered here.

Each format subclasses :class:`aiolock._wire.WireFormat`, which is why this package adds
them to ``_FORMATS`` rather than ``aiolock._wire`` importing them (an import cycle).
:mod:`aiolock._manager` imports this package, so the formats exist before any
``wire=`` is checked. Their names must also be in :data:`aiolock._wire.WireName`.
"""

from .._wire import _FORMATS
from .redisson import RedissonFormat

__all__ = ["RedissonFormat"]

_FORMATS["redisson"] = RedissonFormat()
