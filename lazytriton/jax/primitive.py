"""The triton_call primitive and its rules: abstract evaluation, dead-code
elimination, the Ref discharge, the lowering to the FFI custom call, and
vmap (sequential) and autodiff (refused)."""
from __future__ import annotations

import functools
import json
from typing import Any

import jax
import jax.extend as jex
import numpy as np
from jax._src import core as jax_core
from jax._src import dispatch
from jax._src.interpreters import batching
from jax._src.interpreters import partial_eval as pe
from jax._src.state import discharge as state_discharge
from jax._src.state.types import AbstractRef, ReadEffect, TransformedRef, WriteEffect
from jax.interpreters import ad, mlir

from . import ffi as jax_ffi

def is_ref(a: Any) -> bool:
    if isinstance(a, TransformedRef):
        return True
    if a is None or isinstance(a, (bool, int, float, str, tuple)):
        return False  # jax.typeof would refuse an int outside int32 (or int64 with x64) here
    try:
        return isinstance(jax.typeof(a), AbstractRef)
    except TypeError:
        return False


# Our own primitive rather than jax.ffi.ffi_call: a Ref operand needs a state
# discharge rule (it becomes an input aliased to an extra output), and the
# final buffer numbering of the payload depends on those aliases, so it is
# done at lowering.

triton_call_p = jex.core.Primitive("lazytriton_triton_call")
triton_call_p.multiple_results = True


def _impl(*args, **params):
    if any(is_ref(a) for a in args):
        # Refs are discharged by jit's lowering (eagerly too).
        with jax.disable_jit(False):
            return jax.jit(functools.partial(triton_call_p.bind, **params))(*args)
    return dispatch.apply_primitive(triton_call_p, *args, **params)


triton_call_p.def_impl(_impl)


@triton_call_p.def_effectful_abstract_eval
def _abstract_eval(*in_avals, out_types, **_):
    # The kernel may read and write every Ref it is given.
    effects = {e(i) for i, a in enumerate(in_avals) if isinstance(a, AbstractRef) for e in (ReadEffect, WriteEffect)}
    return [jax_core.ShapedArray(o.shape, o.dtype) for o in out_types], effects


# Never removed by JAX's dead-code elimination (XLA's is governed by has_side_effect).
# The rule is (used_outputs, eqn) up to jax 0.11, (used_outputs, live_inputs, eqn) from 0.12.
pe.dce_rules[triton_call_p] = lambda used_outputs, *rest: ([True] * len(rest[-1].invars), rest[-1])


def _discharge(in_avals, args, params):
    refs = [i for i, a in enumerate(in_avals) if isinstance(a, AbstractRef)]
    n_out = len(params["out_types"])
    out_types = params["out_types"] + tuple(
        jax.ShapeDtypeStruct(in_avals[i].inner_aval.shape, in_avals[i].inner_aval.dtype) for i in refs)
    aliases = tuple(sorted(params["aliases"] + tuple((i, n_out + k) for k, i in enumerate(refs))))
    outs = triton_call_p.bind(*args, **{**params, "out_types": out_types, "aliases": aliases})
    new_vals = [None] * len(in_avals)
    for k, i in enumerate(refs):
        new_vals[i] = outs[n_out + k]
    return new_vals, outs[:n_out]


if hasattr(state_discharge, "DischargeContext"):  # newer jax: the rule takes a context
    def _discharge_rule(ctx, *args, **params):
        return _discharge(ctx.in_avals, args, params)
else:
    def _discharge_rule(in_avals, out_avals, *args, **params):
        return _discharge(in_avals, args, params)

state_discharge.register_discharge_rule(triton_call_p)(_discharge_rule)


def _lowering(ctx, *operands, payload, out_types, aliases, has_side_effect, cost_estimate, **_):
    d = json.loads(payload)
    n_in = len(operands)
    alias = dict(aliases)
    for a in d["args"]:
        # An aliased input's parameter points at its output buffer: the handler
        # copies the input there first when XLA did not share them.
        if "input" in a:
            i = a.pop("input")
            a["buffer"] = n_in + alias[i] if i in alias else i
        elif "output" in a:
            a["buffer"] = n_in + a.pop("output")
    d["n_inputs"] = n_in
    d["aliases"] = [[int(i), int(o)] for i, o in sorted(alias.items())]
    flat = [len(alias)] + [v for pair in sorted(alias.items()) for v in pair]
    rule = jax.ffi.ffi_lowering(jax_ffi.TARGET, operand_output_aliases=alias, has_side_effect=has_side_effect)
    text = json.dumps(d, sort_keys=True, separators=(",", ":"))
    jax_ffi.compile_ahead(text, [int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                                 for a in (*ctx.avals_in, *ctx.avals_out)])
    return rule(ctx, *operands, payload=text,
                aliases=np.asarray(flat, np.int64), n_buffers=np.int64(n_in + len(out_types)),
                cost_estimate_json=json.dumps(dict(cost_estimate)) if cost_estimate else "")


mlir.register_lowering(triton_call_p, _lowering, platform="cuda")
mlir.register_lowering(triton_call_p, _lowering, platform="rocm")  # the same handler, over HIP


class NeedsGpu(NotImplementedError):
    """A triton_call lowered for a platform that cannot run Triton kernels (the CPU)."""


def _no_gpu_lowering(ctx, *operands, name, **_):
    # Instead of JAX's "MLIR translation rule ... not found for platform cpu": what is needed, and
    # what works without it (lowering for CUDA compiles nothing, so it needs no GPU).
    platforms = ", ".join(getattr(ctx.module_context, "platforms", None) or ["cpu"])
    raise NeedsGpu(
        f"{name}: a Triton kernel runs on a CUDA or ROCm GPU, and JAX is lowering this call for {platforms} "
        "(jax.devices() has no GPU here, or the computation was placed on the CPU). Install jax with a CUDA or "
        "ROCm plugin on a GPU machine; without a GPU, jax.jit(f).trace(...).lower(lowering_platforms=(\"cuda\",)) "
        "lowers the call (it compiles nothing until it runs on a GPU).")


mlir.register_lowering(triton_call_p, _no_gpu_lowering, platform="cpu")


def _jvp(primals, tangents, *, name, **_):
    raise NotImplementedError(
        f"{name} cannot be differentiated (as in jax-triton: jax_triton.triton_call does not support automatic "
        "differentiation). Use jax.custom_jvp or jax.custom_vjp to give the call a derivative rule, e.g. a "
        "backward kernel.")


ad.primitive_jvps[triton_call_p] = _jvp

_NOT_MAPPED = getattr(batching, "not_mapped", None)


def _batch(args, dims, **params):
    """vmap: the call runs once per batch element (lax.map), each seeing the
    shapes it was traced for."""
    if any(isinstance(jax.typeof(a), AbstractRef) for a in args):
        raise NotImplementedError(f"{params['name']}: jax.vmap over Ref arguments is not supported; pass arrays "
                                  "(with input_output_aliases) or batch outside the call")
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not _NOT_MAPPED)
    batched = [i for i, d in enumerate(dims) if d is not _NOT_MAPPED]
    moved = [batching.moveaxis(args[i], dims[i], 0) for i in batched]

    def one(xs):
        full = list(args)
        for i, x in zip(batched, xs):
            full[i] = x
        return tuple(triton_call_p.bind(*full, **params))

    outs = jax.lax.map(one, tuple(moved)) if size else None
    if outs is None:  # an empty batch: no launch
        outs = [jax.numpy.zeros((0, *o.shape), o.dtype) for o in params["out_types"]]
    return list(outs), [0] * len(params["out_types"])


batching.primitive_batchers[triton_call_p] = _batch
