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
from pathlib import Path
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj):`~?([^`]+)`")
_INIT = Path(__file__).resolve().parent.parent / "aiolock" / "__init__.py"


def _public_names() -> set[str]:
    """``aiolock.__all__``, read from the source being documented (not an installed copy)."""
    for node in ast.parse(_INIT.read_text("utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return {n for n in ast.literal_eval(node.value) if not n.startswith("_")}
    raise RuntimeError(f"no __all__ in {_INIT}")


_PUBLIC = _public_names()


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
