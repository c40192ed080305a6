"""Integrations with web frameworks, task queues and telemetry, each behind an extra.

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
* :mod:`aiolock.contrib.opentelemetry` (``pip install aiolock[otel]``) and
  :mod:`aiolock.contrib.prometheus` (``pip install aiolock[prometheus]``): ready
  :class:`~aiolock.Observer` adapters for spans and metrics.

Nothing here is imported by ``import aiolock``: the core install needs no framework.
"""
