"""The package's structure: no import cycles between aiolock's modules, type-only ones included.

The engine must not know the kinds, and a kind's handle must not know the manager that
makes it (issue 7): a cycle, even one that only type checkers follow, welds modules together.
"""

from __future__ import annotations

import ast
import gc
import re
from pathlib import Path
from typing import NamedTuple

import aiolock
from aiolock._redis.scripts import REQUIRED_COMMANDS
from tests._support.paths import REPO_ROOT

PACKAGE = Path(aiolock.__file__).parent


def _parse(source: str) -> ast.Module:
    """``ast.parse`` with the cyclic GC held off. On CPython 3.11 a finalizer that runs
    while the parser builds its tree (an asyncio task an earlier test left, whose "exception
    was never retrieved" log formats a traceback, which parses source for its carets)
    nests a second tree's construction in the first, and the first fails with
    ``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905; seen
    once in the suite, in a worker after the Sentinel tests)."""
    enabled = gc.isenabled()
    gc.disable()  # (the parser drops no reference to anything else: only a GC run could)
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


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
        for node in ast.walk(_parse(path.read_text("utf-8"))):
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
            elif isinstance(node, ast.ImportFrom) and node.module:  # absolute
                if node.module in modules:
                    targets.add(node.module)
                targets.update(
                    f"{node.module}.{alias.name}"
                    for alias in node.names
                    if f"{node.module}.{alias.name}" in modules
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
    assert "aiolock._engine.engine" in graph["aiolock._manager"]
    assert (
        "aiolock._engine.kind" in graph["aiolock._engine.engine"]
    )  # a type-only import is counted


def test_no_import_cycles() -> None:
    cycle = _cycle(_imports())
    assert cycle is None, " -> ".join(cycle or [])


def test_the_engine_knows_no_kind() -> None:
    graph = _imports()
    generic = [
        "aiolock._engine.engine",
        "aiolock._engine.registry",
        "aiolock._engine.watchdog",
        "aiolock._engine.hub",
    ]
    for module in generic:
        assert not {d for d in graph[module] if d.startswith("aiolock._kinds")}, module


def test_every_command_the_scripts_call_is_in_required_commands() -> None:
    """The ACL list in the README and the security tests comes from REQUIRED_COMMANDS."""
    used: set[str] = set()
    for path in PACKAGE.rglob("*.lua"):
        for match in re.finditer(r"redis\.p?call\('(\w+)'(?:,\s*'(\w+)')?", path.read_text()):
            command = match.group(1).lower()
            if command == "pubsub":
                command += "|" + match.group(2).lower()
            used.add(command)
    assert "zadd" in used  # the pattern finds calls
    assert used <= set(REQUIRED_COMMANDS), sorted(used - set(REQUIRED_COMMANDS))


# -- Python 3.10: asyncio.wait_for's TimeoutError (issue 22) -------------------------------

SOURCES = ["aiolock", "tests", "examples", "benchmarks", "tools"]


def _timeout_errors(node: ast.AST | None) -> set[str]:
    """Which TimeoutErrors an except clause or pytest.raises(...) names: builtin, asyncio."""
    found: set[str] = set()
    for sub in ast.walk(node) if node is not None else ():
        if isinstance(sub, ast.Name) and sub.id == "TimeoutError":
            found.add("builtin")
        elif (
            isinstance(sub, ast.Attribute)
            and sub.attr == "TimeoutError"
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "asyncio"
        ):
            found.add("asyncio")
    return found


def _calls_wait_for(body: list[ast.stmt]) -> bool:
    for sub in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and func.attr == "wait_for":
                return True
    return False


def _builtin_timeout_around_wait_for(tree: ast.AST) -> list[int]:
    """Lines that expect asyncio.wait_for's timeout as the builtin TimeoutError only."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and _calls_wait_for(node.body):
            lines += [h.lineno for h in node.handlers if _timeout_errors(h.type) == {"builtin"}]
        elif isinstance(node, (ast.With, ast.AsyncWith)) and _calls_wait_for(node.body):
            raises = [
                item.context_expr
                for item in node.items
                if isinstance(item.context_expr, ast.Call)
                and isinstance(item.context_expr.func, ast.Attribute)
                and item.context_expr.func.attr == "raises"
            ]
            lines += [node.lineno for r in raises if _timeout_errors(r) == {"builtin"}]
    return lines


def test_the_wait_for_check_finds_the_python_3_10_trap() -> None:
    trap = "try:\n    await asyncio.wait_for(f(), 1)\nexcept TimeoutError:\n    pass\n"
    fixed = trap.replace("except TimeoutError", "except asyncio.TimeoutError")
    raises = "with pytest.raises(TimeoutError):\n    await asyncio.wait_for(f(), 1)\n"
    assert _builtin_timeout_around_wait_for(ast.parse(trap)) == [3]
    assert _builtin_timeout_around_wait_for(ast.parse(raises)) == [1]
    assert _builtin_timeout_around_wait_for(ast.parse(fixed)) == []


def test_no_wait_for_timeout_is_caught_as_the_builtin_timeout_error() -> None:
    """Before Python 3.11, ``asyncio.wait_for`` raises ``asyncio.TimeoutError``, which is not
    the builtin ``TimeoutError``: an ``except TimeoutError`` around it catches nothing there
    (the Redisson model of tests/_support/redisson_protocol.py failed that way on 3.10). Catch
    ``asyncio.TimeoutError`` (the same class from 3.11 on) or both."""
    found = [
        f"{path.relative_to(REPO_ROOT)}:{line}"
        for top in SOURCES
        if (REPO_ROOT / top).is_dir()
        for path in sorted((REPO_ROOT / top).rglob("*.py"))
        for line in _builtin_timeout_around_wait_for(_parse(path.read_text("utf-8")))
    ]
    assert (REPO_ROOT / "tests" / "_support" / "redisson_protocol.py").is_file()  # the tree is read
    assert not found, "except TimeoutError around asyncio.wait_for: " + ", ".join(found)


# -- The layout (issue 19): what import-linter cannot express -----------------------------


def test_no_module_of_the_package_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text("utf-8").splitlines())) > 600
    }
    assert not long, f"split these by concept (docs/architecture.md): {long}"


def test_no_function_of_the_engine_is_over_60_lines() -> None:
    """Issue 39: the engine's steps are small enough to read whole (the wait is an object
    of steps, aiolock._engine.wait)."""
    long = {
        f"{path.name}:{node.name}": node.end_lineno - node.lineno + 1
        for path in (PACKAGE / "_engine").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 60
    }
    assert not long, long


def test_a_kind_says_whether_its_registry_name_is_its_key() -> None:
    """The hot path reads ``keys.lock`` for a kind whose ``resource_is_key``, instead of
    calling ``resource()``: it must be what ``resource()`` would answer."""
    from aiolock._engine.kindbase import KindBase
    from aiolock._keys import LockKeys

    def subclasses(cls: type[KindBase]) -> list[type[KindBase]]:
        found = [cls]
        for direct in cls.__subclasses__():
            found += subclasses(direct)
        return found

    import aiolock._factories  # noqa: F401  (every kind is imported through it)

    kinds = [cls for cls in subclasses(KindBase) if "name" in cls.__dict__ or cls is KindBase]
    assert len(kinds) >= 6, kinds
    keys = LockKeys("p", "n")
    for cls in kinds:
        kind = object.__new__(cls)  # (resource() reads no state of the instance)
        answers_key = kind.resource(keys) == keys.lock
        assert cls.resource_is_key == answers_key, cls


def test_at_most_12_modules_stand_directly_in_the_package() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 12, f"{len(top)} modules at the top: {top}; move one into its layer"


def test_every_folder_of_lua_scripts_holds_the_kind_that_runs_them() -> None:
    """A folder of .lua holds a kind.py (or, for Redlock, the module that loads them), and
    every script is loaded somewhere: by its path, or included as a prelude."""
    sources = "\n".join(path.read_text("utf-8") for path in PACKAGE.rglob("*.py"))
    lua = "\n".join(path.read_text("utf-8") for path in PACKAGE.rglob("*.lua"))
    folders = {path.parent for path in PACKAGE.rglob("*.lua")}
    for folder in folders:
        name = folder.relative_to(PACKAGE).as_posix()
        if name == "_kinds/_lua":  # the one folder of shared preludes
            continue
        runners = [p for p in folder.glob("*.py") if f'"{name}/' in p.read_text("utf-8")]
        assert runners, f"{name}/ holds scripts but no module of it loads them"
    for path in PACKAGE.rglob("*.lua"):
        script = path.relative_to(PACKAGE).with_suffix("").as_posix()
        assert f'"{script}"' in sources or f"--@include {script}\n" in lua, script


# -- Adding a kind (issue 39): every place the checklist of docs/architecture.md names ------

#: The kind folders with no keys of their own, and why: they skip the places of a kind's
#: keys (a tag, a describer, scripts, a row of docs/wire-formats.md).
COMPOSITE = {"multi": "a handle over locks of the other kinds: no keys, no scripts, no tag"}

#: The kind folders with no handle.py, and why: their handle is the engine's Lock
#: (aiolock/_engine/lockhandle.py), the base of the other lock-like kinds' handles, which
#: lives in the engine because kinds never import each other.
ENGINE_HANDLE = {"lock": "the plain lock's handle is aiolock.Lock itself"}

#: The factory method of ``LockManager`` that makes each kind's handle.
FACTORIES = {
    "lock": "lock",
    "fair": "fair_lock",
    "rw": "rw_lock",
    "semaphore": "semaphore",
    "multi": "multi_lock",
}


class Places(NamedTuple):
    """What each place of the checklist holds now."""

    tags: dict[str, str]  # aiolock._keys.KIND_TAGS
    describers: set[str]  # the kinds of aiolock._cli.inspect.DESCRIBERS
    independent: set[str]  # the modules of the kinds' independence contract
    factories: set[str]  # the methods of LockManager
    commands: set[str]  # REQUIRED_COMMANDS
    wire_formats: str  # docs/wire-formats.md


def _commands(folder: Path) -> set[str]:
    used: set[str] = set()
    for path in folder.glob("*.lua"):
        for match in re.finditer(r"redis\.p?call\('(\w+)'(?:,\s*'(\w+)')?", path.read_text()):
            command = match.group(1).lower()
            used.add(f"{command}|{match.group(2).lower()}" if command == "pubsub" else command)
    return used


def _kind_folders() -> list[Path]:
    return sorted(
        path
        for path in (PACKAGE / "_kinds").iterdir()
        if path.is_dir() and path.name.isidentifier() and not path.name.startswith("_")
    )


def _places() -> Places:
    from aiolock import LockManager
    from aiolock._cli.inspect import DESCRIBERS
    from aiolock._keys import KIND_TAGS

    # (no tomllib on Python 3.10: the one list is read with a pattern)
    pyproject = (REPO_ROOT / "pyproject.toml").read_text("utf-8")
    contract = re.search(r'type = "independence"\nmodules = \[(.*?)\]', pyproject, re.DOTALL)
    assert contract is not None, "the kinds' independence contract is in pyproject.toml"
    independent = set(re.findall(r'"([\w.]+)"', contract[1]))
    return Places(
        tags=dict(KIND_TAGS),
        describers=set(DESCRIBERS),
        independent=independent,
        factories={name for name in dir(LockManager) if not name.startswith("_")},
        commands=set(REQUIRED_COMMANDS),
        wire_formats=(REPO_ROOT / "docs" / "wire-formats.md").read_text("utf-8"),
    )


def _checklist_misses(folder: Path, places: Places) -> list[str]:
    """The places of "Adding a kind" that the kind of *folder* misses."""
    kind = folder.name
    misses = []
    if kind in ENGINE_HANDLE:
        if (folder / "handle.py").is_file():
            misses.append("no handle.py: ENGINE_HANDLE here says its handle is the engine's Lock")
    elif not (folder / "handle.py").is_file():
        misses.append("its handle, handle.py, in its folder (kinds share no handle)")
    if f"aiolock._kinds.{kind}" not in places.independent:
        misses.append("its folder in the kinds' independence contract (pyproject.toml)")
    if FACTORIES.get(kind) not in places.factories:
        misses.append("a factory method on LockManager (and its name in FACTORIES here)")
    if kind in COMPOSITE:
        return misses
    if kind not in places.tags:
        misses.append("its tag in aiolock._keys.KIND_TAGS (and its label in KIND_LABELS)")
    if kind not in places.describers:
        misses.append("its describer in aiolock._cli.inspect.DESCRIBERS")
    if not (folder / "inspect.py").is_file():
        misses.append("its describer, inspect.py, in its folder")
    if not _commands(folder) <= places.commands:
        misses.append("its scripts' commands in REQUIRED_COMMANDS (aiolock._redis.scripts)")
    tag = places.tags.get(kind)
    if tag is not None and f"| `P:{tag}:{{T}}` |" not in places.wire_formats:
        misses.append("a row for its key in docs/wire-formats.md")
    return misses


def test_every_kind_is_in_every_place_adding_a_kind_names() -> None:
    """docs/architecture.md, "Adding a kind": the handle (handle.py, or the engine's Lock
    for the kinds ENGINE_HANDLE names), the tag, the describer for the command, the
    independence contract, the factory method, the scripts' commands, the docs' row."""
    folders = _kind_folders()
    assert {"lock", "fair", "rw", "semaphore", "multi"} <= {f.name for f in folders}
    places = _places()
    misses = {f.name: m for f in folders if (m := _checklist_misses(f, places))}
    assert not misses, misses


def test_the_checklist_test_finds_a_kind_that_misses_a_place(tmp_path: Path) -> None:
    places = _places()
    # a new kind in no place at all: every place is named
    new = tmp_path / "foo"
    new.mkdir()
    (new / "acquire.lua").write_text("redis.call('xadd', KEYS[1], '*', 'a', 1)\n")
    assert len(_checklist_misses(new, places)) == 7  # (no tag: no row to look for)
    # the plain lock's handle is the engine's Lock: a handle.py of its own would be a second
    lock = tmp_path / "lock"
    lock.mkdir()
    (lock / "handle.py").write_text("")
    assert _checklist_misses(lock, places)[0].startswith("no handle.py")
    assert aiolock.Lock.__module__ == "aiolock._engine.lockhandle"
    # an existing kind that lost one place: that place is named, and only it
    semaphore = PACKAGE / "_kinds" / "semaphore"
    assert _checklist_misses(semaphore, places) == []
    losses = [
        places._replace(tags={k: v for k, v in places.tags.items() if k != "semaphore"}),
        places._replace(describers=places.describers - {"semaphore"}),
        places._replace(independent=places.independent - {"aiolock._kinds.semaphore"}),
        places._replace(factories=places.factories - {"semaphore"}),
        places._replace(commands=places.commands - {"zadd"}),
        places._replace(wire_formats=places.wire_formats.replace("`P:sem:{T}`", "`P:s:{T}`")),
    ]
    for lost in losses:
        assert len(_checklist_misses(semaphore, lost)) == 1, lost
