"""Where the repository's folders are, named once for every tier."""

from __future__ import annotations

from pathlib import Path

__all__ = ["EXAMPLES", "REPO_ROOT"]

#: The checkout's root (the folder with pyproject.toml).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: The runnable examples.
EXAMPLES = REPO_ROOT / "examples"
