"""The lock kinds: one folder per kind, holding its handle (what users call), its kind
(the engine seam: which script does what) and its Lua scripts. Kinds do not import each
other; what several share lives in :mod:`aiolock._kinds.foreign` and ``_lua/``.
"""
