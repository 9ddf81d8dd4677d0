"""Fixed-layout launches: a resolved kernel's parameters read from a list of buffer
addresses and scalars fixed once (csrc call_site.h: launch_fixed, FixedParams).

The JAX call site launches every execution this way, the tuner its trials, the
benchmarks their C++ loops. The sources are made here, from the call's slot table
rows (specialize.Shape.table()), so each scalar is packed by the stubs' own reader
(_core.slot_bits) and each parameter by the one C++ packing loop (call_layout.h)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import _core
from ..model import tensor_desc
from ..model.arrays import array_info, is_array
from ..model.contract import SLOT_KIND_CODES

_PTR, _DESC = SLOT_KIND_CODES["ptr"], SLOT_KIND_CODES["desc"]


def param_sources(where: str, table: Sequence, is_param: Sequence[bool], names: Sequence[str],
                  values: Sequence, buffer_of: Callable[[int], int]) -> list:
    """Per kernel parameter, where a fixed-layout launch reads it: (buffer index, 0) for an
    array, (buffer index, descriptor tuple) for a tensor descriptor on that buffer, (-1, bits)
    for a scalar. Leaf i has row table[i], name names[i], value values[i] and, if it is an
    array or a descriptor, buffer buffer_of(i); leaves that are no parameter (constexprs,
    ints folded into the binary) take none. `where` ("kernel k") starts error messages."""
    sources = []
    for i, (row, p, name, v) in enumerate(zip(table, is_param, names, values)):
        if not p:
            continue
        what = f"{where}, argument {name}"
        if row[0] == _DESC:  # encoded from the buffer's address at every launch
            sources.append((buffer_of(i), tensor_desc.read(v, what).as_tuple(name)))
        elif row[0] == _PTR:
            sources.append((buffer_of(i), 0))
        else:
            sources.append((-1, _core.slot_bits(v, tuple(row), what)))
    return sources


def entry(where: str, kernel, is_param: Sequence[bool], meta: dict, grid: Any, table: Sequence,
          names: Sequence[str], values: Sequence, buffers: dict[str, int]) -> tuple[Any, list[int]]:
    """A fixed-layout launch of `kernel` on these leaves: its _core.Entry and the buffer
    addresses it reads. `buffers`: each array or descriptor leaf's address by name, in
    leaf order (its index in the list is the one param_sources gives it)."""
    index = {n: i for i, n in enumerate(buffers)}
    sources = param_sources(where, table, is_param, names, values, lambda i: index[names[i]])
    return _core.Entry(kernel, list(is_param), dict(meta), grid, sources), list(buffers.values())


def entry_on(resolved: Any, leaves: Sequence) -> tuple[Any, list[int]]:
    """A winner (LazyKernel.resolve's answer) as a fixed-layout launch on these leaf values
    (the call's arguments, a tuple argument's elements in its place): (its _core.Entry, the
    buffer addresses it reads), for _core.launch_fixed and the benchmarks' loops."""
    buffers: dict[str, int] = {}
    for name, v in zip(resolved.leaf_names, leaves):
        if is_array(v):
            buffers[name] = array_info(v).ptr
        elif tensor_desc.is_descriptor(v):
            buffers[name] = tensor_desc.read(v, f"argument {name}").ptr
    e = resolved.entry
    return entry(f"kernel {e.kernel.name}", e.kernel, e.is_param, resolved.meta, resolved.grid, resolved.table,
                 resolved.leaf_names, leaves, buffers)
