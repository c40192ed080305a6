"""The multi-lock: several locks taken together, all or none."""
