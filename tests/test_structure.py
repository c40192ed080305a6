"""The package's structure: no import cycles between aiolock's modules, type-only ones included.

The engine must not know the kinds, and a kind's handle must not know the manager that
makes it (issue 7): a cycle, even one that only type checkers follow, welds modules together.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import aiolock
from aiolock._scripts import REQUIRED_COMMANDS

PACKAGE = Path(aiolock.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["aiolock", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (any import)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                if target in modules:
                    targets.add(target)
                else:  # "from . import x": x may be a module
                    targets.update(
                        f"{target}.{alias.name}"
                        for alias in node.names
                        if f"{target}.{alias.name}" in modules
                    )
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in modules)
        graph[name] = targets - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep, [*path, dep])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_import_graph_is_read() -> None:
    graph = _imports()
    assert "aiolock._engine" in graph["aiolock._manager"]
    assert "aiolock._kind" in graph["aiolock._engine"]  # a type-only import is counted


def test_no_import_cycles() -> None:
    cycle = _cycle(_imports())
    assert cycle is None, " -> ".join(cycle or [])


def test_the_engine_knows_no_kind() -> None:
    graph = _imports()
    generic = ["aiolock._engine", "aiolock._registry", "aiolock._watchdog", "aiolock._hub"]
    for module in generic:
        assert not {d for d in graph[module] if d.startswith("aiolock._kinds")}, module


def test_every_command_the_scripts_call_is_in_required_commands() -> None:
    """The ACL list in the README and the security tests comes from REQUIRED_COMMANDS."""
    scripts = Path(aiolock.__file__).parent / "_scripts"
    used: set[str] = set()
    for path in scripts.rglob("*.lua"):
        for match in re.finditer(r"redis\.p?call\('(\w+)'(?:,\s*'(\w+)')?", path.read_text()):
            command = match.group(1).lower()
            if command == "pubsub":
                command += "|" + match.group(2).lower()
            used.add(command)
    assert "zadd" in used  # the pattern finds calls
    assert used <= set(REQUIRED_COMMANDS), sorted(used - set(REQUIRED_COMMANDS))
