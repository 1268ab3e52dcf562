"""The packages are layered one way: a package imports only from packages below it.

    engine  <-  core  <-  policies  <-  proxy  <-  traces  <-  live  <-  training  <-  research  <-  bench  <-  app

(docs/design.md "Layers"). Inside engine/ the rooms are layered the same way:

    base  <-  machine  <-  model  <-  kv  <-  methods  <-  strict  <-  schedule  <-  prefix  <-  top

where base is engine/'s own modules everything uses (types, logprobs, sampler) and top
its assembly (engine.py, interface.py, memory.py, the package's __init__). The test reads every import statement of the source (AST,
module level and inside functions alike, TYPE_CHECKING blocks included, since a lazy
import is still a dependency) and fails on an upward import; with one order over the
packages no package cycle can exist. It also fails on a cycle of module-level imports
between modules, which Python resolves only by the accident of import order.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["engine", "core", "policies", "proxy", "traces", "live", "training", "research", "bench", "app"]
RANK = {name: i for i, name in enumerate(LAYERS)}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found["jumpahead." + ".".join(parts)] = path
    return found


def _imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".")
                    base = base[: len(base) - child.level + (1 if is_package else 0)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                out.append((target, top))
                # `from pkg import mod` imports the submodule too
                out.extend((f"{target}.{a.name}", top) for a in child.names)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(child, False)
            else:
                visit(child, top)

    visit(tree, True)
    return out


ROOMS = ["base", "machine", "model", "kv", "methods", "strict", "schedule", "prefix", "top"]
ROOM_RANK = {name: i for i, name in enumerate(ROOMS)}
BASE = {"types", "logprobs", "sampler"}


def _room(module: str) -> str | None:
    """The room of an engine module: its folder under engine/, or base/top for the flat ones."""
    parts = module.split(".")
    if parts[:2] != ["jumpahead", "engine"]:
        return None
    if len(parts) == 2:
        return "top"
    if parts[2] in ROOM_RANK and (ROOT / "engine" / parts[2]).is_dir():
        return parts[2]
    return "base" if parts[2] in BASE else "top"


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "jumpahead" and parts[1] in RANK else None


def test_no_package_imports_upward() -> None:
    upward: list[str] = []
    for module, path in _modules().items():
        here = _package(module)
        for target, _ in _imports(module, path):
            there = _package(target)
            if here and there and RANK[there] > RANK[here]:
                upward.append(f"{path.relative_to(ROOT)}: imports {target} ({here} is below {there})")
    assert not upward, "upward imports:\n" + "\n".join(sorted(set(upward)))


def test_engine_rooms_import_downward() -> None:
    """engine/ is housed as its subsystems: a room imports only rooms below it (lazy and
    TYPE_CHECKING imports included), so the prefix cache, say, is reached from the
    scheduler only through the `RowHooks` protocol the scheduler declares."""
    modules = _modules()
    rooms = {_room(m) for m in modules if m.startswith("jumpahead.engine")}
    assert rooms == set(ROOMS), f"engine/ rooms on disk differ from the layering: {sorted(rooms - set(ROOMS))}"
    flat = sorted(p.stem for p in (ROOT / "engine").glob("*.py") if p.stem != "__init__")
    assert set(flat) == BASE | {"engine", "interface", "memory"}, f"a new flat engine module needs a room: {flat}"
    upward: list[str] = []
    for module, path in modules.items():
        here = _room(module)
        if here is None:
            continue
        for target, _ in _imports(module, path):
            there = _room(target)
            if there and ROOM_RANK[there] > ROOM_RANK[here]:
                upward.append(f"{path.relative_to(ROOT)}: imports {target} ({here} is below {there})")
    assert not upward, "upward imports between engine rooms:\n" + "\n".join(sorted(set(upward)))


def test_no_cycle_of_module_level_imports() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        graph[module] = {t for t, top in _imports(module, path) if top and t in modules and t != module}
    cycles = _cycles(graph)
    # a package's __init__ importing its own submodules is the one ordinary cycle shape
    cycles = [c for c in cycles if not _init_only(c)]
    assert not cycles, "module-level import cycles:\n" + "\n".join(cycles)


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every back edge of a depth-first walk, as the cycle it closes."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return cycles


def _init_only(cycle: str) -> bool:
    """A cycle through a package and its own submodule (pkg -> pkg.mod -> pkg)."""
    nodes = cycle.split(" -> ")
    return len(nodes) == 3 and (nodes[1].startswith(nodes[0] + ".") or nodes[0].startswith(nodes[1] + "."))


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The reader resolves relative and lazy imports: an upward one inside a function is found."""
    path = tmp_path / "x.py"
    path.write_text("def f():\n    from ..proxy.server import create_app\n    from . import turn\n")
    found = _imports("jumpahead.core.x", path)
    assert ("jumpahead.proxy.server", False) in found
    assert ("jumpahead.core.turn", False) in found
    assert RANK[_package("jumpahead.proxy.server")] > RANK[_package("jumpahead.core.x")]


def test_the_checker_places_engine_modules_in_rooms() -> None:
    assert _room("jumpahead.engine.kv.row_cache") == "kv"
    assert _room("jumpahead.engine.types") == "base"
    assert _room("jumpahead.engine.engine") == "top" and _room("jumpahead.engine") == "top"
    assert _room("jumpahead.core.turn") is None
    assert ROOM_RANK["schedule"] < ROOM_RANK["prefix"]


def test_policy_api_imports_nothing_of_jumpahead_at_import_time() -> None:
    """`import jumpahead.policies.api` stays instant: a policy author's module loads no engine."""
    path = ROOT / "policies" / "api.py"
    assert [t for t, top in _imports("jumpahead.policies.api", path) if top and t.startswith("jumpahead.")] == []


def test_the_checker_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == ["a -> b -> c -> a"]
    assert _init_only("jumpahead.x -> jumpahead.x.y -> jumpahead.x")
