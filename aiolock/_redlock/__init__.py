"""Redlock: one lock over several independent Redis masters, held on a majority."""
