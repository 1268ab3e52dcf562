"""The package layering, read from the source (AST), not from a running import.

What holds today (docs/design.md, Packages): the engine imports no other jumpahead
package, even lazily; the packages' import-time graph (module-level imports, not those
under TYPE_CHECKING or inside functions) has no cycle; the policy API imports nothing of
jumpahead at import time. The lazy imports of the startup code (proxy/serve.py reaching
policies/, traces/ and live/) are the cycle issue 22 removes; they are listed by
`lazy_edges` and not asserted here.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "proxy", "policies", "traces", "live", "bench")


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported jumpahead module, at import time?) for every import in `path`."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    top = {id(n) for n in tree.body}
    here = path.relative_to(REPO).with_suffix("").parts
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(("jumpahead", *here[: len(here) - node.level]))
                names = [f"{base}.{node.module}" if node.module else base]
            else:
                names = [node.module or ""]
        else:
            continue
        out += [(n, id(node) in top) for n in names if n.startswith("jumpahead.")]
    return out


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else None


def edges(import_time_only: bool) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            for module, at_import in imports(f):
                other = package_of(module)
                if other and other != pkg and (at_import or not import_time_only):
                    found.setdefault((pkg, other), []).append(str(f.relative_to(REPO)))
    return found


def lazy_edges() -> dict[tuple[str, str], list[str]]:
    return {k: v for k, v in edges(False).items() if k not in edges(True)}


def test_the_reader_sees_imports():
    """The reader finds a known import-time edge and a known lazy one (else the tests
    below would pass on an empty graph)."""
    assert ("proxy", "engine") in edges(True)
    assert ("proxy", "policies") in edges(False) and ("proxy", "policies") not in edges(True)


def test_engine_imports_no_other_package():
    bad = {k: v for k, v in edges(False).items() if k[0] == "engine"}
    assert not bad, f"the engine is the bottom layer; it imports {bad}"


def test_import_time_graph_has_no_cycle():
    graph: dict[str, set[str]] = {}
    for a, b in edges(True):
        graph.setdefault(a, set()).add(b)

    def path_back(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path + [nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    for pkg in graph:
        cycle = path_back(pkg)
        assert cycle is None, f"import-time package cycle {' -> '.join(cycle)}: {edges(True)}"


def test_policy_api_imports_nothing_of_jumpahead_at_import_time():
    """(RequestContext.count_tokens reaches proxy/prompt.py lazily: issue 22 moves the
    prompt rendering into the core below the policies.)"""
    assert [m for m, at_import in imports(REPO / "policies" / "api.py") if at_import] == []
