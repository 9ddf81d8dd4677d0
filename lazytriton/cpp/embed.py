"""What the C++ lazy mode (lazytriton::embed, csrc/embed/embed.cc) calls in its
embedded Python: describe a kernel, give the slot table of a signature with no
winner yet, and resolve one call (lazytriton's cache,
else compile and tune on the C++ caller's own device buffers), persisting the
winner into the bundle so later runs need no Python. A kernel tuned online
(tuning="online", LAZYTRITON_TUNING=online) answers each call with that call's
candidate until its winner is fixed (runtime/online.py): C++ launches it, timed,
and asks again on the next call; the winner then goes into the bundle."""
from __future__ import annotations

import json
import logging
import sys
import threading

from . import bundle
from ..model import tuples
from ..runtime import online

log = logging.getLogger("lazytriton.cpp.embed")

_kernels: dict = {}
_lock = threading.Lock()


def start(python_path: list[str], verbose: bool) -> None:
    """Once per process: the kernels' module directories, and logging."""
    for p in reversed(python_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    if verbose and not logging.getLogger("lazytriton").handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logging.getLogger("lazytriton").addHandler(handler)
        logging.getLogger("lazytriton").setLevel(logging.INFO)


def _kernel(source: str):
    from ..runtime.kernel import LazyKernel

    with _lock:
        lk = _kernels.get(source)
        if lk is None:
            lk = _kernels[source] = LazyKernel(bundle.load_source(source))
        return lk


def describe(source: str) -> str:
    return json.dumps(bundle.describe(_kernel(source), source), allow_nan=False)


def slot_table(source: str, types: list, layouts: list | None = None) -> str:
    """The slot table (JSON rows) the C++ binder walks for a signature no variant has yet."""
    lk = _kernel(source)
    return json.dumps(bundle.slot_table(bundle.describe(lk, source), types, layouts), allow_nan=False)


def _value(v):
    """A call value from C++: ("ptr", address, dtype, nbytes or 0), ("desc",
    base, dtype, nbytes or 0, shape, strides, block, padding, tf32) or a plain value."""
    if isinstance(v, tuple) and v and v[0] in ("ptr", "desc"):
        from .. import _core
        from ..model import tensor_desc
        from ..model.arrays import DeviceArray

        _, ptr, dtype, nbytes, *desc = v
        base = DeviceArray(ptr, dtype, nbytes or _core.allocation_extent(ptr))
        return tensor_desc.unchecked(base, *desc) if desc else base
    return v


def resolve(bundle_dir: str, source: str, values: list, options: dict, grid, stream: int,
            layouts: list | None = None) -> tuple[str, bytes, object, bool]:
    """The winner for one C++ call, as (variant JSON, cubin, None, False). It is
    persisted into the bundle when the directory is writable (else only used).
    Tuning online, still deciding: (this call's candidate, its cubin, the
    _core.LaunchTimer its launch records, or None, True), never persisted here.
    With tuple arguments `values` are leaves and `layouts` gives, per call
    parameter, "" or its tuple's nesting (lazytriton.model.tuples.structure_text)."""
    lk = _kernel(source)
    args = [_value(v) for v in values]
    if layouts:
        leaves = iter(args)
        args = [tuples.nest(layout, leaves) for layout in layouts]
    pos, kw = lk.as_call(args, options)
    # per_call: C++ launches each answer once and asks again on the next call until the key is installed.
    resolved = lk.resolve(*pos, grid=grid, stream=stream, per_call=True, **kw)
    desc = bundle.describe(lk, source)
    variant, cubin = bundle.make_variant(desc, lk, resolved, args, options)
    if resolved.this_call_only:
        online.persist_live()  # the samples read on this call (this interpreter never runs atexit)
        variant["cubin"] = ""  # no file: the cubin comes along
        return json.dumps(variant, allow_nan=False), cubin, resolved.timer, True
    try:
        variant = bundle.write_variant(bundle_dir, desc, variant, cubin)
    except OSError as exc:
        log.warning("kernel %s: could not persist the winner into bundle %s (%s); it is used for this process "
                    "only", desc["name"], bundle_dir, exc)
        variant["cubin"] = ""
    return json.dumps(variant, allow_nan=False), cubin, None, False
