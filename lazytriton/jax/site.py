"""The call site's payload: a bound triton_call as the JSON the custom call
carries (kernel identity, arguments, scalars, meta-parameters, every candidate
config with its grid and zeroed outputs). The handler's resolver
(lazytriton.jax.ffi.Site) rebuilds the call from it alone."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import numpy as np
import triton

from . import ffi as jax_ffi
from ..cache import keys
from ..model import pre_hooks, tuples
from ..model.arrays import triton_dtype
from ..model.spec import KernelSpecError
from .types import OPTION_DEFAULTS, Call, TensorDescriptor, hook_refusal, kernel_identity

class _Aval:
    """What a heuristic or grid function sees for an array at trace time."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def numel(self) -> int:
        return int(np.prod(self.shape))


def site_payload(call: Call, grid, zeroed_outputs, options) -> str:
    """The call site as JSON, buffers still named as ("input", i) /
    ("output", o): the lowering numbers them once the aliases are final (a
    Ref's output is added when its state is discharged)."""
    spec, label = call.spec, call.label
    ident = kernel_identity(call.kernel)
    ident = {**ident, "id": jax_ffi.register_kernel(ident["id"], call.kernel)}
    n_out = len(call.out_types)
    args, seen = [], []  # per value: its payload entry, and what a grid or heuristic sees of it
    for p, path, (kind, v, *rest) in zip(call.params, call.paths, call.values):
        name = tuples.leaf_name(p.name, path)
        if kind == "desc":  # a host TMA descriptor: its base is operand v, the rest is static
            d = rest[0]
            aval = jax.typeof(call.inputs[v])
            aval = getattr(aval, "inner_aval", aval)
            args.append({"input": v, **_buffer(name, aval, label),
                         "desc": {"shape": [int(x) for x in d.shape], "strides": [int(x) for x in d.strides],
                                  "block": [int(x) for x in d.block_shape], "padding": d.padding,
                                  "tf32": bool(d.round_f32_to_tf32)}})
            seen.append(dataclasses.replace(d, base=_Aval(aval.shape, aval.dtype)))
        elif kind == "input":
            a = call.inputs[v]
            aval = jax.typeof(a)
            aval = getattr(aval, "inner_aval", aval)  # a Ref's array
            args.append({"input": v, **_buffer(name, aval, label)})
            seen.append(_Aval(aval.shape, aval.dtype))
        elif kind == "output":
            args.append({"output": v, **_buffer(name, call.out_types[v], label)})
            seen.append(_Aval(call.out_types[v].shape, call.out_types[v].dtype))
        else:
            args.append({"scalar": _encode(v, label, name)})
            seen.append(v)
        args[-1]["name"] = name

    def nest(item):  # a tuple argument as the kernel sees it
        return tuple(nest(x) for x in item) if isinstance(item, list) else seen[item]

    named = {p.name: nest(item) for p, item in zip(call.call_params, call.layout)}
    # A config pre_hook may set a (top-level) descriptor's block shape, and read what the call site fixes.
    descs = {n for n, v in named.items() if isinstance(v, TensorDescriptor)}
    pinned = {n for n, v in named.items()
              if not any(isinstance(x, (_Aval, TensorDescriptor)) for _, x in tuples.leaves(v))}
    configs, call_options = _configs(spec, label, options, call.meta)
    for c in configs:
        cfg = c.pop("_config", None)
        meta = {**call.meta, **c["kwargs"]}
        heuristics = _heuristic_values(spec, label, {**named, **meta}, meta)
        meta.update(heuristics)
        if heuristics:  # evaluated once, here: the grid, the compile and every launch use these values
            c["heuristics"] = {k: _encode(v, label, k) for k, v in heuristics.items()}
        if cfg is not None and getattr(cfg, "pre_hook", None) is not None:
            # Run here, on stand-ins: the block shapes it sets travel with the config (jax_ffi replays them).
            try:
                blocks = pre_hooks.blocks(spec, spec.configs.index(cfg), cfg, named, meta, descs, pinned | set(meta))
            except pre_hooks.HookRefused as exc:
                raise NotImplementedError(hook_refusal(spec.name, exc.args[0], cfg, exc.args[1])) from None
            c["blocks"] = {k: list(b) for k, b in sorted(blocks.items())}
        c["grid"] = _grid(grid, meta, label)
        zeroed = zeroed_outputs(meta) if callable(zeroed_outputs) else zeroed_outputs
        c["zeroed"] = sorted(int(z) for z in zeroed)
        if any(not 0 <= z < n_out for z in c["zeroed"]):
            raise ValueError(f"{label}: zeroed_outputs {c['zeroed']} out of range ({n_out} outputs)")
        c["kwargs"] = {k: _encode(v, label, k) for k, v in c["kwargs"].items()}
    d = {"v": jax_ffi.PAYLOAD_VERSION, "name": label, "kernel": ident, "args": args, "layout": call.layout,
         "configs": configs, "options": call_options}
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _encode(v: Any, label: str, what: str) -> Any:
    """A scalar or meta-parameter value as JSON. A @triton.jit function (a
    callable constexpr) travels by importable name and fingerprint: the
    handler finds it in this process's registry, or imports it."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, triton.runtime.JITFunction):
        fn = v.fn
        ref = {"module": fn.__module__, "qualname": fn.__qualname__, "name": fn.__name__,
               "fingerprint": keys.kernel_fingerprint(v)}
        ref["id"] = jax_ffi.register_kernel(f"{ref['module']}:{ref['qualname']}:{ref['fingerprint'][:16]}", v)
        return {"$jit": ref}
    if type(v).__name__ == "constexpr" and hasattr(v, "value"):
        return _encode(v.value, label, what)
    raise TypeError(f"{label}: {what}={v!r}: meta-parameters and scalars must be bool, int, float, str, None or a "
                    "@triton.jit function (the call site is described in JSON)")


def _buffer(name: str, a: Any, label: str) -> dict:
    dtype = triton_dtype(np.dtype(a.dtype).name) if hasattr(a, "dtype") else None
    if dtype is None:
        raise TypeError(f"{label}: argument {name} has dtype {getattr(a, 'dtype', type(a).__name__)}, "
                        "which Triton kernels cannot take")
    return {"dtype": dtype, "shape": [int(s) for s in a.shape]}


def _configs(spec, label: str, options: dict, meta: dict) -> tuple[list[dict], dict]:
    """Candidate configs of this call site, and the compile options every
    candidate takes. As in jax-triton, meta-parameters given by the caller drop
    the autotune configs that set them to something else, an autotuned kernel's
    configs set num_warps/num_stages/num_ctas, and its other options (launch_pdl,
    debug, ...) reach every config, as Triton merges them."""
    if not spec.configs:
        opts = {k: v for k, v in options.items() if v is not None and v != OPTION_DEFAULTS.get(k)}
        return [{"kwargs": {}}], opts
    per_config = {k: v for k, v in options.items() if k not in ("num_warps", "num_stages", "num_ctas")}
    other = {k: v for k, v in per_config.items() if k != "maxnreg" and v is not None and v != OPTION_DEFAULTS.get(k)}
    cfg_keys = {k for c in spec.configs for k in c.kwargs}
    fixed = {k: v for k, v in meta.items() if k in cfg_keys}
    kept = [c for c in spec.configs if all(c.kwargs.get(k, v) == v for k, v in fixed.items())]
    if not kept:
        raise KernelSpecError(f"{label}: no autotune config agrees with the meta-parameters {fixed}")
    out = []
    for c in kept:
        d = {"kwargs": {**fixed, **c.kwargs}, "_config": c}
        for f in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
            if getattr(c, f, None) is not None:
                d[f] = getattr(c, f)
        if "maxnreg" not in d and per_config.get("maxnreg") is not None:
            d["maxnreg"] = per_config["maxnreg"]
        out.append(d)
    return out, other


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
