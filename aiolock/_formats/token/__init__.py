"""The ``token`` wire format's lock: redis-py's ``Lock`` layout."""
