"""The ``timestamp`` wire format's lock: the legacy SETNX/GETSET expiry-time lock."""
