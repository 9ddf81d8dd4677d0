"""The package's shape, checked on its source (no import of it needed):

- no import circle among lazytriton's modules, counting imports made inside
  functions (the kind that hides a circle until a call runs into it);
- no module reaching into another's private names (`from .x import _y`,
  `x._y`), lazytriton's own compiled extensions (`_core`, `_generic_stub`) aside.

`python tests/test_layout.py` prints the import drawing docs/architecture.md
shows: each module on the floor above everything it imports."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lazytriton"
EXTENSIONS = {"lazytriton._core", "lazytriton._generic_stub"}


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = ["lazytriton", *p.relative_to(PKG).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _absolute(mod: str, is_pkg: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _runs(node: ast.AST):
    """The statements that may run: `if TYPE_CHECKING:` bodies left out."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for stmt in child.orelse:
                yield stmt
                yield from _runs(stmt)
            continue
        yield child
        yield from _runs(child)


def imports(mods: dict[str, Path]) -> dict[str, dict[str, list]]:
    """module -> {imported lazytriton module: [(line, {names imported from it})]}."""
    graph = {}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        edges = graph.setdefault(mod, {})
        for node in _runs(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [(a.name, set()) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(mod, is_pkg, node.level, node.module)
                targets = []
                for a in node.names:  # `from pkg import module` imports the module
                    full = f"{base}.{a.name}"
                    targets.append((full, set()) if full in mods or full in EXTENSIONS else (base, {a.name}))
            else:
                continue
            for target, names in targets:
                if target in EXTENSIONS or not target.startswith("lazytriton"):
                    continue
                while target not in mods:
                    target = target.rpartition(".")[0]
                if target != mod:
                    edges.setdefault(target, []).append((node.lineno, names))
    return graph


def circles(graph: dict[str, dict]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_reach_ins(mods: dict[str, Path], graph: dict[str, dict]) -> list[str]:
    found = []
    for mod, edges in graph.items():
        for target, uses in edges.items():
            for line, names in uses:
                found += [f"{mods[mod].relative_to(PKG.parent)}:{line}: from {target} import {n}"
                          for n in names if n.startswith("_") and not n.startswith("__")]
        # `x._y` where x names another lazytriton module in this one
        tree = ast.parse(mods[mod].read_text())
        aliases = {}
        is_pkg = mods[mod].name == "__init__.py"
        for node in _runs(tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(mod, is_pkg, node.level, node.module)
                for a in node.names:
                    if f"{base}.{a.name}" in mods:
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases[node.value.id] != mod):
                found.append(f"{mods[mod].relative_to(PKG.parent)}:{node.lineno}: "
                             f"{aliases[node.value.id]}.{node.attr}")
    return found


def floors(graph: dict[str, dict]) -> list[list[str]]:
    """Modules by floor: each one above everything it imports (needs no circle)."""
    level: dict[str, int] = {}

    def floor(v):
        if v not in level:
            level[v] = 0  # guards against a circle; circles() reports those
            level[v] = 1 + max((floor(w) for w in graph[v]), default=-1)
        return level[v]

    for v in graph:
        floor(v)
    out = [[] for _ in range(max(level.values()) + 1)]
    for v, n in level.items():
        out[n].append(v.removeprefix("lazytriton.") if v != "lazytriton" else v)
    return [sorted(f) for f in out]


def test_no_import_circle():
    graph = imports(modules())
    assert len(graph) > 40  # the walk saw the package
    assert circles(graph) == []


def test_the_check_sees_a_circle_made_inside_a_function():
    graph = imports(modules())
    graph["lazytriton.model.arrays"] = {**graph["lazytriton.model.arrays"], "lazytriton.runtime.kernel": [(1, set())]}
    assert any("lazytriton.model.arrays" in c and "lazytriton.runtime.kernel" in c for c in circles(graph))


def test_no_private_reach_in():
    mods = modules()
    assert private_reach_ins(mods, imports(mods)) == []


if __name__ == "__main__":
    for n, names in reversed(list(enumerate(floors(imports(modules()))))):
        print(f"{n:2d}  {'  '.join(names)}")
