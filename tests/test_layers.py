"""lazytriton's packages are layers: a module imports from its own package and from
packages on layers below it, never from its own layer or above, so packages form no
circle. Every import counts: at module level, inside functions, and under
`if TYPE_CHECKING:` (a type-only import is still an arrow between packages).

The layers are declared once, in docs/architecture.md's "Packages are layers" table,
which this test reads."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from test_layout import EXTENSIONS, PKG, _absolute, circles, modules

DOC = PKG.parent / "docs" / "architecture.md"


def layers() -> dict[str, int]:
    """package -> layer, from the docs' table rows `| 4 | `runtime` | ... |`."""
    text = DOC.read_text()
    section = text.split("## Packages are layers", 1)[1].split("\n## ", 1)[0]
    out = {}
    for n, cell in re.findall(r"^\| (\d+) \| ([^|]+) \|", section, re.M):
        for name in re.findall(r"`([\w.]+)`", cell):
            assert name not in out, f"docs/architecture.md puts {name} on two layers"
            out[name] = int(n)
    return out


def package(mod: str) -> str:
    """The package a module belongs to: lazytriton.runtime.kernel -> runtime,
    lazytriton.settings -> settings, lazytriton (its __init__) -> lazytriton."""
    return mod.split(".")[1] if "." in mod else mod


def all_imports(mods: dict[str, Path]) -> list[tuple[str, int, str]]:
    """(importing module, line, imported lazytriton module) for every import statement,
    wherever it stands in the module."""
    out = []
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(mod, is_pkg, node.level, node.module)
                # `from pkg import module` imports the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods or f"{base}.{a.name}" in EXTENSIONS
                           else base for a in node.names]
            else:
                continue
            for target in targets:
                if target != "lazytriton" and not target.startswith("lazytriton."):
                    continue
                while target not in mods and target not in EXTENSIONS:
                    target = target.rpartition(".")[0]
                out.append((mod, node.lineno, target))
    return out


def offences(mods: dict[str, Path], imports: list[tuple[str, int, str]], layer: dict[str, int]) -> list[str]:
    found = []
    for mod, line, target in imports:
        src, dst = package(mod), package(target)
        if src == dst:
            continue
        path = mods[mod]
        where = f"{path.relative_to(PKG.parent) if path.is_relative_to(PKG.parent) else path}:{line}: {mod} imports {target}"
        if src not in layer or dst not in layer:
            found.append(f"{where}: package {src if src not in layer else dst} is on no layer of docs/architecture.md")
        elif layer[dst] >= layer[src]:
            found.append(f"{where}: {src} (layer {layer[src]}) may import only from layers below it, "
                         f"{dst} is on layer {layer[dst]}")
    return found


def package_graph(imports: list[tuple[str, int, str]]) -> dict[str, dict[str, list]]:
    graph: dict[str, dict[str, list]] = {}
    for mod, _, target in imports:
        graph.setdefault(package(mod), {})
        graph.setdefault(package(target), {})
        if package(mod) != package(target):
            graph[package(mod)].setdefault(package(target), [])
    return graph


def test_every_package_is_on_a_layer():
    layer = layers()
    assert {"settings", "model", "cache", "compile", "runtime", "jax", "cpp", "cli"} <= set(layer)
    missing = sorted({package(m) for m in modules()} - set(layer))
    assert not missing, f"packages on no layer of docs/architecture.md: {missing}"
    assert not sorted(set(layer) - {package(m) for m in modules()} - {package(e) for e in EXTENSIONS}), \
        "docs/architecture.md names a package lazytriton does not have"


def test_no_import_runs_up_or_across_a_layer():
    mods = modules()
    assert offences(mods, all_imports(mods), layers()) == []


def test_packages_form_no_circle():
    assert circles(package_graph(all_imports(modules()))) == []


def test_modules_form_no_circle():
    """Nor do modules, type-only imports counted (a module that needs another's
    type from above declares the Protocol it reads instead)."""
    graph: dict[str, dict] = {}
    for mod, _, target in all_imports(modules()):
        graph.setdefault(mod, {})
        graph.setdefault(target, {})
        if mod != target:
            graph[mod].setdefault(target, [])
    assert circles(graph) == []


def test_the_check_sees_a_type_only_import_up_a_layer(tmp_path):
    """The checks can fail: an import under `if TYPE_CHECKING:` inside a function of the
    model, naming the runtime, is reported with its file and line, and closes a circle."""
    probe = tmp_path / "lazytriton" / "model" / "_probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from typing import TYPE_CHECKING\n\n\ndef f():\n    if TYPE_CHECKING:\n"
                     "        from ..runtime import kernel\n")
    mods = {**modules(), "lazytriton.model._probe": probe}
    imports = all_imports(mods)
    found = offences(mods, imports, layers())
    assert len(found) == 1, found
    assert found[0].endswith("lazytriton/model/_probe.py:6: lazytriton.model._probe imports lazytriton.runtime.kernel:"
                             " model (layer 1) may import only from layers below it, runtime is on layer 4")
    assert any({"model", "runtime"} <= set(c) for c in circles(package_graph(imports)))


def test_the_check_reads_imports_inside_functions_and_type_checking_blocks():
    """An import made on use inside a function is seen (the type-only one under
    `if TYPE_CHECKING:`: test_the_check_sees_a_type_only_import_up_a_layer)."""
    mods = modules()
    seen = {(m, t) for m, _, t in all_imports(mods)}
    assert ("lazytriton.cli", "lazytriton.cpp.export") in seen  # imported on use, inside main()


def test_one_meaning_per_word():
    """`describe` is a kernel's manifest entry (cpp/bundle.py, and lazy mode's cpp/embed.py
    answering C++ Resolver::describe) and nothing else: the kernel's model is
    `model.spec.kernel_spec`, a cache key's un-hashed fields `cache.keys.key_document`, the
    JAX call site's JSON its payload (`jax/site.py` `site_payload`)."""
    found = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and "describe" in node.name.lower():
                found.append(f"{mod}.{node.name}")
            if isinstance(node, (ast.FunctionDef, ast.arg, ast.Name)) and "descriptor" == getattr(
                    node, "arg", getattr(node, "id", getattr(node, "name", ""))) and mod.startswith("lazytriton.jax"):
                found.append(f"{mod}: {ast.unparse(node)}")
    assert sorted(found) == ["lazytriton.cpp.bundle.describe", "lazytriton.cpp.embed.describe"], found


def test_the_path_readme_once_named_still_imports():
    """README named `lazytriton.core.arrays.DeviceArray` before the model moved to
    lazytriton/model/; the old path is an alias of the new module, not a copy."""
    import lazytriton.core.arrays as old
    import lazytriton.model.arrays as new
    from lazytriton.core.arrays import DeviceArray

    assert old is new and DeviceArray is new.DeviceArray
