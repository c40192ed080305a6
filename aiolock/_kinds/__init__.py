"""The lock kinds: one folder per kind, holding its handle (what users call), its kind
(the engine seam: which script does what), its Lua scripts and its describer for the
``aiolock`` command (``inspect.py``). Kinds do not import each other; what several share
lives in the engine and in ``_lua/``. The kinds of the formats shared with other clients
(``token``, ``timestamp``, ``redisson``) live with their formats, in :mod:`aiolock._formats`.
"""
