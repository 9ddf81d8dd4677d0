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

import dataclasses
import functools
import inspect
import json
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import jax_ffi, keys
from .arrays import triton_dtype
from .spec import KernelSpecError, describe

__all__ = ["triton_call", "handler_stats"]

handler_stats = jax_ffi.handler_stats
jax_ffi.prepare_in_background()

_OPTIONS = ("num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "debug")


def triton_call(*args: Any, kernel: Any, out_shape: Any = None, out_type: Any = None,
                grid: int | tuple | Callable[[dict], Any], name: str = "",
                input_output_aliases: dict[int, int] | None = None,
                zeroed_outputs: Sequence[int] | Callable[[dict], Sequence[int]] = (),
                num_warps: int | None = None, num_stages: int | None = None, num_ctas: int = 1,
                enable_fp_fusion: bool = True, debug: bool = False,
                compute_capability: int | None = None, custom_call_target_name: str | None = None,
                serialized_metadata: bytes = b"", **kwargs: Any) -> Any:
    """Calls a Triton kernel (jit, autotune or heuristics) on JAX arrays.

    Operands are `args` (arrays and Python scalars, bound to the kernel's
    parameters in order) and the keywords that name a non-constexpr kernel
    parameter; every kernel parameter left without a value then receives an
    output of `out_shape`/`out_type` (any pytree of objects with .shape and
    .dtype), in order. Other keywords are meta-parameters: constexpr values
    (the kernel's defaults fill those not given) and values the grid sees; for
    an autotuned kernel they drop the configs that set them otherwise. `grid`
    is an int, a tuple or a callable of the meta-parameters. `zeroed_outputs`
    are zeroed before every launch. `compute_capability`,
    `custom_call_target_name` and `serialized_metadata` are accepted for
    jax-triton compatibility and ignored: lazytriton compiles for the device
    it runs on.
    """
    del compute_capability, custom_call_target_name, serialized_metadata
    if out_shape is None:
        out_shape = out_type
    if out_shape is None:
        raise TypeError("triton_call: out_shape= (or out_type=) is required")
    flat_out, out_tree = jax.tree_util.tree_flatten(out_shape)
    out_types = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in flat_out]
    flat_args, _ = jax.tree_util.tree_flatten(args)
    aliases = dict(input_output_aliases or {})
    options = dict(num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas,
                   enable_fp_fusion=enable_fp_fusion, debug=debug)
    call = _bind(kernel, name, flat_args, kwargs, out_types)
    desc = _descriptor(call, grid, aliases, zeroed_outputs, options)
    if jax_ffi.cuda_present():
        jax_ffi.ensure_registered()
    flat_alias = [len(aliases)] + [v for pair in sorted(aliases.items()) for v in pair]
    ffi = jax.ffi.ffi_call(jax_ffi.TARGET, out_types, input_output_aliases=aliases, vmap_method="sequential")
    kw = dict(descriptor=desc, aliases=np.asarray(flat_alias, np.int64),
              n_buffers=np.int64(len(call.inputs) + len(out_types)))
    label = call.label

    @jax.custom_jvp
    def run(*xs):
        return ffi(*xs, **kw)

    @run.defjvp
    def _no_jvp(primals, tangents):
        raise NotImplementedError(
            f"{label} cannot be differentiated: a Triton kernel has no derivative rule. Wrap the call in "
            "jax.custom_vjp (or jax.custom_jvp) and give it a backward kernel.")

    return jax.tree_util.tree_unflatten(out_tree, run(*call.inputs))


def _is_scalar(a: Any) -> bool:
    return a is None or isinstance(a, (bool, int, float, np.generic))


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


@dataclasses.dataclass
class _Call:
    """A triton_call bound to the kernel's parameters, as the handler will
    launch it: one value per call parameter (the parameters not set by autotune
    configs or heuristics), in the kernel's order. This binding is the only
    one: the descriptor carries it whole, and both the tuning launches and the
    C++ launches read their arguments from it, so they cannot disagree."""
    kernel: Any
    spec: Any
    label: str
    params: list  # the call parameters (spec.Param), in order
    values: list  # per parameter: ("input", i) | ("output", o) | ("scalar", v) | ("const", v)
    inputs: list  # the array operands, in parameter order (the custom call's operands)
    out_types: list
    meta: dict  # meta-parameters: constexpr values, the kernel's defaults, names only the grid reads


def _bind(kernel, name: str, flat_args: list, kwargs: dict, out_types: list) -> _Call:
    """Binds as jax-triton does: positional operands to the call parameters in
    order, keywords naming a non-constexpr parameter to it (operands), other
    keywords are meta-parameters; outputs fill the parameters left unbound."""
    spec = describe(kernel)
    label = f"triton_call {name or spec.name}" + (f" (kernel {spec.name})" if name and name != spec.name else "")
    supplied = {k for c in spec.configs for k in c.kwargs} | spec.heuristic_names()
    params = [p for p in spec.params if p.name not in supplied]
    by_name = {p.name: p for p in params}
    operand_kw = {k: v for k, v in kwargs.items() if k in by_name and not by_name[k].is_constexpr}
    meta = {p.name: p.default for p in spec.params
            if p.is_constexpr and p.default is not inspect.Parameter.empty}
    meta.update({k: v for k, v in kwargs.items() if k not in operand_kw})
    for k in meta.keys() & spec.heuristic_names():
        if k in kwargs:
            raise TypeError(f"{label}: {k} is set by the kernel's triton.heuristics; do not pass it")
    runtime = [p for p in params if not p.is_constexpr]

    def too_many() -> TypeError:
        n_in = sum(1 for a in flat_args if not _is_scalar(a))
        return TypeError(f"{label}: {len(flat_args) + len(operand_kw) + len(out_types)} arguments ({n_in} arrays, "
                         f"{len(flat_args) - n_in} scalars, {len(operand_kw)} keyword operands, {len(out_types)} "
                         f"outputs) but the kernel takes {len(runtime)} besides its meta-parameters "
                         f"({', '.join(p.name for p in runtime)})")

    if len(flat_args) > len(params):
        raise too_many()
    given: dict[str, Any] = dict(zip((p.name for p in params), flat_args))
    for k, v in operand_kw.items():
        if k in given:
            raise TypeError(f"{label}: argument {k} is given both positionally and as a keyword")
        given[k] = v
    values, inputs, outs = [], [], iter(range(len(out_types)))
    n_bound_outputs = lambda vals: sum(1 for kind, _ in vals if kind == "output")  # noqa: E731
    for p in params:
        if p.name in given:
            v = given[p.name]
            if _is_scalar(v):
                values.append(("const" if p.is_constexpr else "scalar", _scalar(v)))
                if p.is_constexpr:
                    meta[p.name] = _scalar(v)
                continue
            if p.is_constexpr:
                raise TypeError(f"{label}: argument {p.name} is a tl.constexpr but receives an array; pass "
                                "meta-parameters as keyword arguments")
            values.append(("input", len(inputs)))
            inputs.append(v)
        elif p.is_constexpr:
            if p.name in meta:
                values.append(("const", meta[p.name]))
            elif n_bound_outputs(values) < len(out_types):
                raise TypeError(f"{label}: argument {p.name} is a tl.constexpr but receives an array (an output); "
                                "pass meta-parameters as keyword arguments")
            else:
                raise TypeError(f"{label}: meta-parameter {p.name} is not given and has no default")
        else:
            o = next(outs, None)
            if o is not None:
                values.append(("output", o))
            elif p.default is not inspect.Parameter.empty:
                values.append(("scalar", p.default))
            else:
                raise TypeError(f"{label}: no value for kernel parameter {p.name} ({len(out_types)} outputs fill "
                                "the parameters left without an operand, in order)")
    if next(outs, None) is not None:
        raise too_many()
    return _Call(kernel, spec, label, params, values, inputs, out_types, meta)


class _Aval:
    """What a heuristic or grid function sees for an array at trace time."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def numel(self) -> int:
        return int(np.prod(self.shape))


def _descriptor(call: _Call, grid, aliases, zeroed_outputs, options) -> str:
    spec, label = call.spec, call.label
    ident = _kernel_identity(call.kernel)
    jax_ffi.register_kernel(ident["id"], call.kernel)
    n_inputs, n_out = len(call.inputs), len(call.out_types)
    args, named = [], {}
    for p, (kind, v) in zip(call.params, call.values):
        if kind == "input":
            args.append(_buffer(v, call.inputs[v], label))
            named[p.name] = _Aval(call.inputs[v].shape, call.inputs[v].dtype)
        elif kind == "output":
            args.append(_buffer(n_inputs + v, call.out_types[v], label))
            named[p.name] = _Aval(call.out_types[v].shape, call.out_types[v].dtype)
        else:
            args.append({"scalar": v})
            named[p.name] = v
    for i, o in aliases.items():
        if not (0 <= i < n_inputs and 0 <= o < n_out):
            raise ValueError(f"{label}: input_output_aliases {{{i}: {o}}} is out of range "
                             f"({n_inputs} array inputs, {n_out} outputs)")
    configs, call_options = _configs(spec, label, options, call.meta)
    for c in configs:
        meta = {**call.meta, **c["kwargs"]}
        meta.update(_heuristic_values(spec, label, {**named, **meta}, meta))
        c["grid"] = _grid(grid, meta, label)
        zeroed = zeroed_outputs(meta) if callable(zeroed_outputs) else zeroed_outputs
        c["zeroed"] = sorted(int(z) for z in zeroed)
        if any(not 0 <= z < n_out for z in c["zeroed"]):
            raise ValueError(f"{label}: zeroed_outputs {c['zeroed']} out of range ({n_out} outputs)")
    d = {"v": jax_ffi.DESCRIPTOR_VERSION, "name": label, "kernel": ident, "args": args, "n_inputs": n_inputs,
         "aliases": sorted([int(i), int(o)] for i, o in aliases.items()), "configs": configs,
         "options": call_options}
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


def _configs(spec, label: str, options: dict, meta: dict) -> tuple[list[dict], dict]:
    """Candidate configs of this call site, and the compile options of an
    untuned kernel. As in jax-triton, meta-parameters given by the caller drop
    the autotune configs that set them to something else."""
    if not spec.configs:
        opts = {k: v for k, v in options.items() if v is not None and v != _OPTION_DEFAULTS.get(k)}
        return [{"kwargs": {}}], opts
    cfg_keys = {k for c in spec.configs for k in c.kwargs}
    fixed = {k: v for k, v in meta.items() if k in cfg_keys}
    kept = [c for c in spec.configs if all(c.kwargs.get(k, v) == v for k, v in fixed.items())]
    if not kept:
        raise KernelSpecError(f"{label}: no autotune config agrees with the meta-parameters {fixed}")
    out = []
    for c in kept:
        d = {"kwargs": {**fixed, **c.kwargs}}
        for f in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
            if getattr(c, f, None) is not None:
                d[f] = getattr(c, f)
        out.append(d)
    return out, {}

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
