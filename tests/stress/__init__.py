"""Multi-process safety checks for aiolock (see :mod:`.checker`)."""
