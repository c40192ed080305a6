"""The read-write lock: shared readers, one writer, writers not starved."""
