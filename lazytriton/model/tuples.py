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
    """The nesting of a tuple argument as C++ bundles record it, e.g. "[_,[_,_]]"
    (a leaf is "_"); "" for a value that is not a tuple."""
    if is_tuple(value):
        return "[" + ",".join(structure_text(v) or "_" for v in value) + "]"
    return ""


def split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets ("[a,b],c" -> ["[a,b]", "c"])."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if depth < 0:
            raise ValueError(f"unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in {text!r}")
    last = text[start:].strip()
    return out + [last] if out or last else []


def parse_type(text: str) -> Any:
    """One signature entry: "*fp32", or a tuple type "[*fp32,[i32,fp32]]" as nested tuples."""
    text = text.strip()
    if text.startswith("["):
        if not text.endswith("]"):
            raise ValueError(f"tuple type {text!r} must end with ']'")
        return tuple(parse_type(t) for t in split_top(text[1:-1]))
    return text


def nest(layout: str, leaves_in_order: Iterator) -> Any:
    """A tuple rebuilt from structure_text `layout` and its leaves, in order; the
    next leaf itself for layout ""."""
    if not layout:
        return next(leaves_in_order)

    def walk(t):
        return tuple(walk(x) for x in t) if is_tuple(t) else next(leaves_in_order)

    return walk(parse_type(layout))


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
