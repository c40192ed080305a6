"""The reentrant lock: its kind and its scripts, the hand-off's among them.

Its handle is the engine's :class:`~aiolock.Lock` (:mod:`aiolock._engine.lockhandle`),
the base of the other lock-like kinds' handles too; so this folder has no handle.py.
"""
