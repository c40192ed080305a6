"""Integrations with web frameworks and task queues; each needs its own, installed with an extra.

* :mod:`aiolock.contrib.fastapi` (``pip install aiolock[fastapi]``): a lifespan that
  opens one :class:`~aiolock.LockManager` per app, and ``lock_dependency(...)``, a
  dependency that holds a lock named from the request's path and query parameters.
* :mod:`aiolock.contrib.aiohttp` (``pip install aiolock[aiohttp]``): a ``cleanup_ctx``
  that opens one manager per ``web.Application``, found by handlers under an ``AppKey``.
* :mod:`aiolock.contrib.jobs` (no extra): ``singleton(...)``, at most one job per
  resource at a time, the others skipped or deferred, and ``holder_info()``, who holds it.
* :mod:`aiolock.contrib.arq` (``pip install aiolock[arq]``) and
  :mod:`aiolock.contrib.taskiq` (``pip install aiolock[taskiq]``): ``singleton`` for
  those queues, deferring a losing job the queue's own way.

Nothing here is imported by ``import aiolock``: the core install needs no framework.
"""
