"""The Python <-> C seam is declared in one Python module (lazytriton/runtime/seam.py)
and one C++ header (csrc/python/seam.h), and the code keeps to it:

- every name the header gives C to look up is in seam.py, and every C -> Python
  crossing seam.py lists (but the resolver JAX's handler is handed as an object) has
  its constant in the header;
- no C source spells one of those names as a literal of its own: C takes them from
  the header;
- each Python callee exists and takes the arguments C passes;
- every Python -> C crossing exists in the extensions, with the arguments listed, and
  nothing the extensions offer is missing from the list."""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from lazytriton import _core, _generic_stub
from lazytriton.runtime import seam

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "csrc" / "python" / "seam.h"


def header_names() -> dict[str, str]:
    """constant -> the string seam.h gives it."""
    return dict(re.findall(r'inline constexpr char (k\w+)\[\] = "([^"]+)";', HEADER.read_text()))


def _owner(owner: str):
    module, _, cls = owner.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, cls) if cls else obj


def test_header_and_module_list_the_same_crossings():
    values = set(header_names().values())
    listed = {c.name for c in seam.C_TO_PYTHON} | {c.owner.partition(":")[0] for c in seam.C_TO_PYTHON}
    assert len(values) > 10
    assert not values - listed, f"seam.h names what seam.py does not list: {sorted(values - listed)}"
    by_object = {"_resolve"}  # handed to the JAX handler as an object (set_resolver): no name crosses
    missing = {c.name for c in seam.C_TO_PYTHON} - values - by_object
    assert not missing, f"seam.py lists C -> Python calls seam.h has no constant for: {sorted(missing)}"


def literal_offences(files) -> list[str]:
    # The names no other use could spell the same way (generic words such as "name"
    # and "entry" are also pybind11 argument names).
    names = {v for v in header_names().values() if "_" in v or "." in v}
    found = []
    for f in files:
        text = f.read_text()
        found += [f"{f}: \"{n}\"" for n in sorted(names) if f'"{n}"' in text]
    return found


def test_c_takes_the_names_from_the_header():
    sources = [f for f in sorted((ROOT / "csrc").rglob("*")) if f.suffix in {".h", ".cc", ".inc"} and f != HEADER]
    # stubgen.py: the generated stubs' C
    found = literal_offences([*sources, ROOT / "lazytriton" / "runtime" / "stubgen.py"])
    assert not found, f"C sources spelling seam names themselves, not through seam.h: {found}"


def test_python_callees_take_what_c_passes():
    from kernels import basic

    import lazytriton

    k = lazytriton.kernel(basic.add_kernel)
    for c in seam.C_TO_PYTHON:
        owner = _owner(c.owner)
        if c.owner == seam.KERNEL and c.args is None:
            assert isinstance(getattr(k, c.name), str), c
            continue
        assert hasattr(owner, c.name), f"{c.owner} has no {c.name}, which {c.where} looks up"
        if c.args is None:
            continue
        fn = getattr(owner, c.name)
        params = list(inspect.signature(fn).parameters.values())
        if inspect.isclass(owner):
            params = params[1:]  # self
        names = tuple(p.name for p in params)
        assert names == c.args, f"{c.owner}.{c.name} takes {names}; seam.py says C passes {c.args}"


def _pybind_arity(obj) -> int | None:
    """Parameters in a pybind11 function's (or class's __init__) signature line; None
    for a plain C function (no signature line)."""
    doc = (obj.__init__ if inspect.isclass(obj) else obj).__doc__ or ""
    line = doc.splitlines()[0] if doc else ""
    if not re.match(r"\w+\(", line):
        return None
    inner, depth, count, seen = line[line.index("(") + 1:], 0, 0, False
    for ch in inner:
        if ch == ")" and depth == 0:
            break
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        if ch == "," and depth == 0:
            count += 1
        seen = seen or not ch.isspace()
    n = count + 1 if seen else 0
    return n - 1 if inspect.isclass(obj) else n  # __init__'s self


@pytest.mark.parametrize("module,owner", [(_core, "lazytriton._core"), (_generic_stub, "lazytriton._generic_stub")])
def test_every_extension_offer_is_listed(module, owner):
    offered = {n for n in dir(module) if not n.startswith("__")}
    listed = {c.name for c in seam.PYTHON_TO_C if c.owner == owner}
    assert offered == listed, (f"{owner} offers, unlisted in seam.py: {sorted(offered - listed)}; "
                               f"listed, not offered: {sorted(listed - offered)}")
    for c in seam.PYTHON_TO_C:
        if c.owner == owner and c.args is not None:
            assert _pybind_arity(getattr(module, c.name)) in (None, len(c.args)), c


def test_launch_base_fields_are_listed():
    offered = {n for n in dir(_core.LaunchBase) if not n.startswith("__")}
    listed = {c.name for c in seam.PYTHON_TO_C if c.owner == "lazytriton._core:LaunchBase"}
    assert offered == listed


def test_jax_handler_methods_are_listed():
    source = (ROOT / "csrc" / "jax" / "ffi_handler.cc").read_text()
    table = source[source.index("PyMethodDef kMethods[]"):]
    offered = set(re.findall(r'\{"(\w+)",', table[:table.index("};")]))
    listed = {c.name for c in seam.PYTHON_TO_C if c.owner == "jax handler"}
    assert offered and offered == listed


def test_the_checks_see_a_literal_and_a_missing_name(tmp_path, monkeypatch):
    """The checks can fail: a C literal of a seam name, an unlisted crossing."""
    rogue = tmp_path / "rogue.cc"
    rogue.write_text('static const char* k = "_first_call";\n')
    assert literal_offences([rogue]) == [f'{rogue}: "_first_call"']
    monkeypatch.setattr(seam, "C_TO_PYTHON", seam.C_TO_PYTHON[1:])
    with pytest.raises(AssertionError, match="_first_call"):
        test_header_and_module_list_the_same_crossings()
