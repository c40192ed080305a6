"""A griffe extension: render the Sphinx roles of aiolock's docstrings in Markdown.

The docstrings are written for ``help()`` and Sphinx (``:class:`LockTimeoutError```,
``:meth:`acquire```); mkdocstrings renders Markdown, where such roles would show as raw
text. A role naming a public object of the ``aiolock`` module (``:class:`Lock```,
``:meth:`aiolock.LockManager.lock```) becomes a link to its entry in the API reference;
any other role becomes inline code. The docstrings themselves are not changed.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

import aiolock

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj):`~?([^`]+)`")
_PUBLIC = {name for name in aiolock.__all__ if not name.startswith("_")}


def _target(text: str) -> str | None:
    """The reference identifier of a role's target, if the API reference documents it."""
    parts = text.removeprefix("aiolock.").split(".")
    if parts[0] not in _PUBLIC or any(part.startswith("_") for part in parts):
        return None
    return "aiolock." + ".".join(parts)


def _replace(match: re.Match[str]) -> str:
    text = match.group(1)
    shown = text.removeprefix("aiolock.")
    target = _target(text)
    return f"`{shown}`" if target is None else f"[`{shown}`][{target}]"


def markdown(docstring: str) -> str:
    """The docstring with every Sphinx role rewritten (see the module's docstring)."""
    return _ROLE.sub(_replace, docstring)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring griffe loads."""

    def on_instance(
        self,
        *,
        node: ast.AST | griffe.ObjectNode,
        obj: griffe.Object,
        agent: griffe.Visitor | griffe.Inspector,
        **kwargs: Any,
    ) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
