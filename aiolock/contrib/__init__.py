"""Integrations with web frameworks; each needs its framework, installed with an extra.

* :mod:`aiolock.contrib.fastapi` (``pip install aiolock[fastapi]``): a lifespan that
  opens one :class:`~aiolock.LockManager` per app, and ``lock_dependency(...)``, a
  dependency that holds a lock named from the request's path and query parameters.
* :mod:`aiolock.contrib.aiohttp` (``pip install aiolock[aiohttp]``): a ``cleanup_ctx``
  that opens one manager per ``web.Application``, found by handlers under an ``AppKey``.

Nothing here is imported by ``import aiolock``: the core install needs neither framework.
"""
