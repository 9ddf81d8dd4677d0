"""JAX: `triton_call`, compatible with jax-triton's, as an XLA FFI custom call.

Tracing and lowering compile nothing: the call site becomes a custom call
whose attributes describe it completely (kernel identity, arguments, scalars,
meta-parameters, every candidate config with its grid and zeroed outputs,
aliases). The handler (lazytriton/jax_ffi.py, csrc/jax/ffi_handler.cc) is
command-buffer compatible: the first execution that is not being captured
compiles and tunes on the real buffers, every later one launches from C++.

    out = lazytriton.jax.triton_call(x, y, kernel=add_kernel, out_shape=x,
                                     grid=lambda meta: (triton.cdiv(n, meta["BLOCK"]),), n=n)

vmap runs the call sequentially over the batch; autodiff raises (wrap the
call in jax.custom_vjp with a backward kernel).
"""
from __future__ import annotations

import functools
import json
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import jax_ffi, keys
from .arrays import triton_dtype
from .spec import KernelSpecError, describe

__all__ = ["triton_call", "handler_stats"]

handler_stats = jax_ffi.handler_stats

_OPTIONS = ("num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "debug")


def triton_call(*args: Any, kernel: Any, out_shape: Any = None, out_type: Any = None,
                grid: int | tuple | Callable[[dict], Any], name: str = "",
                input_output_aliases: dict[int, int] | None = None,
                zeroed_outputs: Sequence[int] | Callable[[dict], Sequence[int]] = (),
                num_warps: int | None = None, num_stages: int | None = None, num_ctas: int = 1,
                enable_fp_fusion: bool = True, debug: bool = False,
                compute_capability: int | None = None, custom_call_target_name: str | None = None,
                serialized_metadata: bytes = b"", **metaparams: Any) -> Any:
    """Calls a Triton kernel (jit, autotune or heuristics) on JAX arrays.

    Kernel arguments are `args` (arrays and Python scalars, in order) followed
    by one pointer per output of `out_shape` (any pytree of objects with
    .shape and .dtype, e.g. jax.ShapeDtypeStruct). `grid` is an int, a tuple
    or a callable of the meta-parameters. `metaparams` are constexpr kernel
    arguments; for an autotuned kernel they drop the configs that set them
    otherwise. `zeroed_outputs` are zeroed before every launch.
    `compute_capability`, `custom_call_target_name` and `serialized_metadata`
    are accepted for jax-triton compatibility and ignored: lazytriton compiles
    for the device it runs on.
    """
    del compute_capability, custom_call_target_name, serialized_metadata
    if out_shape is None:
        out_shape = out_type
    if out_shape is None:
        raise TypeError("triton_call: out_shape= (or out_type=) is required")
    flat_out, out_tree = jax.tree_util.tree_flatten(out_shape)
    out_types = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in flat_out]
    flat_args, _ = jax.tree_util.tree_flatten(args)
    arrays = [a for a in flat_args if not _is_scalar(a)]
    aliases = dict(input_output_aliases or {})
    options = dict(num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas,
                   enable_fp_fusion=enable_fp_fusion, debug=debug)
    desc = _descriptor(kernel, flat_args, out_types, grid, name, aliases, zeroed_outputs, options, metaparams)
    if jax_ffi.cuda_present():
        jax_ffi.ensure_registered()
    flat_alias = [len(aliases)] + [v for pair in sorted(aliases.items()) for v in pair]
    call = jax.ffi.ffi_call(jax_ffi.TARGET, out_types, input_output_aliases=aliases, vmap_method="sequential")
    kw = dict(descriptor=desc, aliases=np.asarray(flat_alias, np.int64), n_buffers=np.int64(len(arrays) + len(out_types)))

    label = json.loads(desc)["name"]

    @jax.custom_jvp
    def run(*xs):
        return call(*xs, **kw)

    @run.defjvp
    def _no_jvp(primals, tangents):
        raise NotImplementedError(
            f"{label} cannot be differentiated: a Triton kernel has no derivative rule. Wrap the call in "
            "jax.custom_vjp (or jax.custom_jvp) and give it a backward kernel.")

    return jax.tree_util.tree_unflatten(out_tree, run(*arrays))


def _is_scalar(a: Any) -> bool:
    return isinstance(a, (bool, int, float, np.generic))


def _scalar(a: Any) -> Any:
    if isinstance(a, np.generic):
        return a.item()
    return a


@functools.lru_cache(maxsize=256)
def _kernel_identity(kernel: Any) -> dict:
    spec = describe(kernel)
    fn = spec.fn.fn
    fingerprint = keys.kernel_fingerprint(spec.fn)
    ident = {"module": fn.__module__, "qualname": fn.__qualname__, "name": spec.name, "fingerprint": fingerprint}
    ident["id"] = f"{ident['module']}:{ident['qualname']}:{fingerprint[:16]}"
    return ident


class _Aval:
    """What a heuristic or grid function sees for an array at trace time."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def numel(self) -> int:
        return int(np.prod(self.shape))


def _descriptor(kernel, flat_args, out_types, grid, name, aliases, zeroed_outputs, options, metaparams) -> str:
    spec = describe(kernel)
    ident = _kernel_identity(kernel)
    jax_ffi.register_kernel(ident["id"], kernel)
    label = f"triton_call {name or spec.name}" + (f" (kernel {spec.name})" if name and name != spec.name else "")
    n_inputs = sum(1 for a in flat_args if not _is_scalar(a))
    args, named, b = [], {}, 0
    for a in flat_args:
        if _is_scalar(a):
            args.append({"scalar": _scalar(a)})
        else:
            args.append(_buffer(b, a, label))
            b += 1
    for o in out_types:
        args.append(_buffer(b, o, label))
        b += 1
    supplied = set(metaparams) | {k for c in spec.configs for k in c.kwargs} | spec.heuristic_names()
    params = [p for p in spec.params if p.name not in supplied]
    if len(args) > len(params):
        raise TypeError(f"{label}: {len(args)} arguments ({n_inputs} arrays, "
                        f"{len(flat_args) - n_inputs} scalars, {len(out_types)} outputs) but the kernel takes "
                        f"{len(params)} besides its meta-parameters ({', '.join(p.name for p in params)})")
    for p, a, v in zip(params, args, list(flat_args) + list(out_types)):
        if p.is_constexpr and "buffer" in a:
            raise TypeError(f"{label}: argument {p.name} is a tl.constexpr but receives an array; pass "
                            "meta-parameters as keyword arguments")
        named[p.name] = _scalar(v) if "scalar" in a else _Aval(v.shape, v.dtype)
    for i, o in aliases.items():
        if not (0 <= i < n_inputs and 0 <= o < len(out_types)):
            raise ValueError(f"{label}: input_output_aliases {{{i}: {o}}} is out of range "
                             f"({n_inputs} array inputs, {len(out_types)} outputs)")
    configs, call_meta = _configs(spec, label, options, metaparams)
    for c in configs:
        meta = {**metaparams, **c["kwargs"]}
        meta.update(_heuristic_values(spec, label, named, meta))
        c["grid"] = _grid(grid, meta, label)
        zeroed = zeroed_outputs(meta) if callable(zeroed_outputs) else zeroed_outputs
        c["zeroed"] = sorted(int(z) for z in zeroed)
        if any(not 0 <= z < len(out_types) for z in c["zeroed"]):
            raise ValueError(f"{label}: zeroed_outputs {c['zeroed']} out of range ({len(out_types)} outputs)")
    d = {"v": 1, "name": label, "kernel": ident, "args": args, "n_inputs": n_inputs,
         "aliases": sorted([int(i), int(o)] for i, o in aliases.items()), "configs": configs,
         "call_meta": call_meta}
    try:
        return json.dumps(d, sort_keys=True, separators=(",", ":"))
    except TypeError as exc:
        raise TypeError(f"{label}: meta-parameters and scalars must be bool, int, float, str or None ({exc})") from None


def _buffer(index: int, a: Any, label: str) -> dict:
    dtype = triton_dtype(np.dtype(a.dtype).name) if hasattr(a, "dtype") else None
    if dtype is None:
        raise TypeError(f"{label}: argument {index} has dtype {getattr(a, 'dtype', type(a).__name__)}, "
                        "which Triton kernels cannot take")
    return {"buffer": index, "dtype": dtype, "shape": [int(s) for s in a.shape]}


def _configs(spec, label: str, options: dict, metaparams: dict) -> tuple[list[dict], dict]:
    """Candidate configs of this call site, and the meta-parameters passed as
    kernel arguments. As in jax-triton, meta-parameters given by the caller
    drop the autotune configs that set them to something else."""
    if not spec.configs:
        opts = {k: v for k, v in options.items() if v is not None and v != _OPTION_DEFAULTS.get(k)}
        return [{"kwargs": {}}], {**metaparams, **opts}
    cfg_keys = {k for c in spec.configs for k in c.kwargs}
    kept = [c for c in spec.configs if all(c.kwargs.get(k, v) == v for k, v in metaparams.items())]
    if not kept:
        raise KernelSpecError(f"{label}: no autotune config agrees with the meta-parameters {metaparams}")
    fixed = {k: v for k, v in metaparams.items() if k in cfg_keys}
    out = []
    for c in kept:
        d = {"kwargs": {**fixed, **c.kwargs}}
        for f in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
            if getattr(c, f, None) is not None:
                d[f] = getattr(c, f)
        out.append(d)
    return out, {k: v for k, v in metaparams.items() if k not in cfg_keys}


_OPTION_DEFAULTS = {"num_ctas": 1, "enable_fp_fusion": True, "debug": False}


def _heuristic_values(spec, label: str, named: dict, meta: dict) -> dict:
    out = {}
    for layer in spec.heuristics:
        for k, fn in layer.values.items():
            try:
                out[k] = fn({**named, **meta, **out})
            except Exception as exc:
                raise KernelSpecError(f"{label}: heuristic for {k!r} failed at trace time ({exc}); at trace "
                                      "time arrays are known only by shape and dtype") from exc
    return out


def _grid(grid: Any, meta: dict, label: str) -> list[int]:
    g = grid(meta) if callable(grid) else grid
    g = (g,) if isinstance(g, (int, np.integer)) else tuple(g)
    if not 1 <= len(g) <= 3 or any(not isinstance(x, (int, np.integer)) or x < 0 for x in g):
        raise ValueError(f"{label}: grid must be 1 to 3 non-negative ints, got {g!r}")
    return [int(x) for x in g] + [1] * (3 - len(g))
