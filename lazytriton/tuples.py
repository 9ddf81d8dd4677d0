"""Tuple arguments, as a flattening layer over the per-argument machinery.

Triton 3.x takes tuples (nested, of any mix of pointers, ints, floats, bools,
None and constexprs) as kernel arguments: its binder specializes every element
with the default rules (never the parameter's do_not_specialize or
annotation), its signature holds nested tuples of type strings, constexprs and
attributes are keyed by paths such as (0, 1) and its launcher passes the
elements' kernel parameters in depth-first order, dropping constexprs (and ints
specialized to == 1), like top-level ones.

lazytriton reads such an argument as leaves: each element that is not itself
a tuple is one slot named by its path (``xs[1][0]``) and specialized as Triton
specializes it; the tuple's own structure (its length at every level) is part
of the argument shape, which the stubs check. Nothing below the leaves knows
about tuples: keys, tuning, written-buffer analysis and the C++ launch all
work on leaves. Named tuples are not taken (their field names are part of the
kernel's type): a clear error says so.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

Path = tuple  # (argument index, element index, element index, ...)


def is_tuple(value: Any) -> bool:
    return isinstance(value, tuple)


def check_plain(value: Any, what: str) -> None:
    """Plain tuples only (named tuples carry field names into the kernel's type)."""
    if hasattr(value, "_fields"):
        raise TypeError(f"{what}: is a named tuple ({type(value).__name__}); lazytriton takes plain tuples as "
                        "kernel arguments (pass tuple(value))")
    if type(value) is not tuple:
        raise TypeError(f"{what}: is a {type(value).__name__} (a tuple subclass); pass a plain tuple")


def leaf_name(name: str, path: Path) -> str:
    """`xs` with sub-path (1, 0) -> "xs[1][0]"."""
    return name + "".join(f"[{i}]" for i in path)


def leaves(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """(sub-path, value) of every element that is not a tuple, depth first;
    a non-tuple value is its own one leaf (sub-path ())."""
    if is_tuple(value):
        for i, v in enumerate(value):
            yield from leaves(v, (*path, i))
    else:
        yield path, value


def nodes(value: Any, path: Path = ()) -> Iterator[tuple[Path, int]]:
    """(sub-path, length) of every tuple inside `value` (itself included), pre-order."""
    if is_tuple(value):
        yield path, len(value)
        for i, v in enumerate(value):
            yield from nodes(v, (*path, i))


def at(value: Any, path: Path) -> Any:
    for i in path:
        value = value[i]
    return value


def map_leaves(value: Any, fn: Callable[[Any], Any]) -> Any:
    """`value` with every leaf replaced by fn(leaf), tuples kept."""
    if is_tuple(value):
        return tuple(map_leaves(v, fn) for v in value)
    return fn(value)


def structure_text(value: Any) -> str:
    """The nesting of a tuple argument, e.g. "(_,(_,_))" (a leaf is "_")."""
    if is_tuple(value):
        return "(" + ",".join(structure_text(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return "_"


def flat_signature(signature: dict) -> dict:
    """Triton's signature {name: type or nested tuple of types} as {leaf name: type}."""
    out = {}
    for name, t in signature.items():
        for path, leaf in leaves(t):
            out[leaf_name(name, path)] = leaf
    return out


def type_text(t: Any) -> str:
    """A signature entry as text: "*fp32", or a tuple as Triton spells a tuple type, "[*fp32,[i32,fp32]]"."""
    if is_tuple(t):
        return "[" + ",".join(type_text(x) for x in t) + "]"
    return str(t)
