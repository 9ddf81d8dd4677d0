"""triton_call: binding a call to the kernel's parameters, as jax-triton 0.4
binds it, and binding the primitive."""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Sequence

import jax
import numpy as np
import triton
from jax._src.state.types import TransformedRef

from .. import _core
from . import ffi as jax_ffi
from ..model import tuples
from ..model.arrays import DTYPE_IDS, triton_dtype
from ..model.spec import PreHookRefused, kernel_spec
from ..model.specialize import JAX_OPTION_NAMES, check_option
from .primitive import is_ref, triton_call_p
from .site import site_payload
from .types import Call, TensorDescriptor, hook_refusal


def register() -> None:
    """Registers the XLA FFI handler for CUDA in this process. Tracing a
    triton_call does it; call it before running an executable that was not
    traced here (a deserialized jax.export artifact)."""
    jax_ffi.ensure_registered()


def triton_call(*args: Any, kernel: Any, out_type: Any = None,
                grid: int | tuple | Callable[[dict], Any], name: str = "",
                num_warps: int | None = None, num_stages: int | None = None, num_ctas: int | None = None,
                compute_capability: int | None = None, backend_options: dict | None = None,
                input_output_aliases: dict[int, int] | None = None,
                zeroed_outputs: Sequence[int] | Callable[[dict], Sequence[int]] = (),
                debug: bool | None = None, serialized_metadata: bytes = b"",
                cost_estimate: dict | None = None, has_side_effect: bool = False,
                enable_fp_fusion: bool | None = None, custom_call_target_name: str | None = None,
                **kwargs: Any) -> Any:
    """Calls a Triton kernel (jit, autotune or heuristics) on JAX arrays, as
    jax-triton 0.4's triton_call does.

    Operands are `args` (arrays, `jax.Ref`s and Python scalars, bound to the
    kernel's parameters in order) and the keywords that name a non-constexpr
    kernel parameter. A `Ref` is updated in place (no output is declared for
    it). An input named in `input_output_aliases` ({operand index: output
    index}, both into the flattened operands and outputs) is used directly by
    the kernel and is not declared again as an output parameter. Every kernel
    parameter left without a value receives an unaliased output of `out_type`
    (any pytree of objects with .shape and .dtype; `out_shape=` is its
    deprecated alias), in order. Other keywords are meta-parameters: constexpr
    values (the kernel's defaults fill those not given) and values the grid
    sees; for an autotuned kernel they drop the configs that set them
    otherwise. `grid` is an int, a tuple or a callable of the meta-parameters.
    `zeroed_outputs` are zeroed before every launch. `backend_options` are
    compile options (num_warps, num_stages, num_ctas, maxnreg, debug,
    launch_pdl, enable_fp_fusion). `has_side_effect=True` keeps XLA from
    removing a call whose outputs are unused; `cost_estimate` ({"flops",
    "bytes_accessed"}) is attached for profilers. `compute_capability`,
    `custom_call_target_name` and `serialized_metadata` are accepted for
    jax-triton compatibility and ignored: lazytriton compiles for the device
    it runs on.
    """
    del compute_capability, custom_call_target_name, serialized_metadata
    _refuse_hooks(kernel)
    spec = kernel_spec(kernel)
    label = f"triton_call {name or spec.name}" + (f" (kernel {spec.name})" if name and name != spec.name else "")
    if "out_shape" in kwargs and not any(p.name == "out_shape" for p in spec.params):
        if out_type is not None:
            raise TypeError(f"{label}: give out_type= or the deprecated out_shape=, not both")
        warnings.warn("triton_call: out_shape= is deprecated, use out_type=", DeprecationWarning, stacklevel=2)
        out_type = kwargs.pop("out_shape")
    if out_type is None:
        raise TypeError(f"{label}: out_type= (or the deprecated out_shape=) is required")
    flat_out, out_tree = jax.tree_util.tree_flatten(out_type)
    out_types = [_out_type(o, label) for o in flat_out]
    options = _options(label, backend_options, num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas,
                       debug=debug, enable_fp_fusion=enable_fp_fusion)
    call = _bind(kernel, label, list(args), kwargs, out_types, dict(input_output_aliases or {}))
    payload = site_payload(call, grid, zeroed_outputs, options)
    if jax_ffi.cuda_present():
        jax_ffi.ensure_registered()
    cost = None
    if cost_estimate:
        cost = tuple(sorted((str(k), int(v)) for k, v in dict(cost_estimate).items()))
    outs = triton_call_p.bind(*call.inputs, payload=payload, name=label, out_types=tuple(out_types),
                              aliases=tuple(sorted(call.aliases.items())), has_side_effect=bool(has_side_effect),
                              cost_estimate=cost, metaparams=_Frozen(_hashable_meta(call.meta)))
    return jax.tree_util.tree_unflatten(out_tree, outs)


def _refuse_hooks(kernel: Any) -> None:
    """Autotuner hooks are Python run around every launch; launches from C++
    (and inside CUDA graphs) cannot run them. A config pre_hook may only set
    tensor descriptors' block shapes (pre_hooks.py): it runs at trace time."""
    at = kernel if isinstance(kernel, triton.runtime.Autotuner) else None
    if at is None:
        return
    name = getattr(getattr(at, "base_fn", None), "__name__", None) or getattr(kernel.fn, "__name__", "kernel")
    if getattr(at, "user_defined_pre_hook", False) or getattr(at, "user_defined_post_hook", False):
        raise NotImplementedError(
            f"triton_call {name}: triton.autotune(pre_hook=/post_hook=) is not supported: lazytriton.jax launches "
            "from C++ and inside CUDA graphs, where no Python runs. Use reset_to_zero=/restore_value= of "
            "triton.autotune, zeroed_outputs=, or pass the buffer as a jax.Ref zeroed beforehand.")
    for i, c in enumerate(at.configs):
        if getattr(c, "post_hook", None) is not None:
            raise NotImplementedError(hook_refusal(name, i, c, "is a post_hook"))
    try:
        kernel_spec(kernel)
    except PreHookRefused as exc:
        raise NotImplementedError(hook_refusal(name, exc.index, at.configs[exc.index], exc.why)) from None


def _options(label: str, backend_options: dict | None, **explicit) -> dict:
    """Explicit num_warps=... merged with backend_options= (giving one in both raises, as in jax-triton)."""
    backend_options = dict(backend_options or {})
    explicit = {k: v for k, v in explicit.items() if v is not None}
    if conflicts := sorted(explicit.keys() & backend_options.keys()):
        raise ValueError(f"{label}: cannot specify {conflicts} both as explicit arguments and in backend_options")
    for k, v in backend_options.items():
        try:
            hash(v)
        except TypeError:
            raise TypeError(f"{label}: backend_options[{k!r}] must be hashable, got {v!r}") from None
        if k not in JAX_OPTION_NAMES:
            raise ValueError(f"{label}: backend_options[{k!r}] is not a compile option lazytriton takes "
                             f"({', '.join(JAX_OPTION_NAMES)})")
        if not isinstance(v, (bool, int, str)):
            raise TypeError(f"{label}: backend_options[{k!r}] must be a bool, int or str, got {v!r}")
    options = {**backend_options, **explicit}
    for k, v in options.items():
        check_option(k, v, label)
    return options


class _Frozen(dict):
    """A hashable dict for primitive parameters (jaxpr equations are compared and cached)."""

    def __hash__(self):
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))

    def __setitem__(self, *_):
        raise TypeError("immutable")


def _hashable_meta(meta: dict) -> dict:
    out = {}
    for k, v in meta.items():
        try:
            hash(v)
            out[k] = v
        except TypeError:
            out[k] = repr(v)
    return out


def _is_scalar(a: Any) -> bool:
    return a is None or isinstance(a, (bool, int, float, np.generic))


def _scalar(a: Any) -> Any:
    if isinstance(a, np.generic):
        return a.item()
    return a


def _out_type(leaf: Any, label: str):
    """One output's type: any object with .shape and .dtype (an array, a jax.ShapeDtypeStruct)."""
    try:
        return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype)
    except (AttributeError, TypeError):
        raise TypeError(f"{label}: out_type takes a pytree of objects with .shape and .dtype (arrays, "
                        f"jax.ShapeDtypeStruct((4096,), jnp.float32)), one per output; it holds {leaf!r} "
                        f"({type(leaf).__name__})") from None


def _bind(kernel, label: str, args: list, kwargs: dict, out_types: list, aliases: dict) -> Call:
    """Binds as jax-triton 0.4 does: positional operands to the call
    parameters in order, keywords naming a non-constexpr parameter to it
    (operands), other keywords are meta-parameters; the outputs not aliased to
    an input fill the parameters left unbound, in order."""
    spec = kernel_spec(kernel)
    supplied = spec.supplied_names()
    params = [p for p in spec.params if p.name not in supplied]
    by_name = {p.name: p for p in params}
    operand_kw = {k: v for k, v in kwargs.items() if k in by_name and not by_name[k].is_constexpr}
    meta = {p.name: p.default for p in spec.params
            if p.is_constexpr and p.default is not inspect.Parameter.empty}
    # A keyword a heuristic sets stays a meta-parameter: the heuristic sees it and overwrites it
    # (site.py), as Triton's Heuristics.run does.
    meta.update({k: v for k, v in kwargs.items() if k not in operand_kw})
    runtime = [p for p in params if not p.is_constexpr]
    if aliases and any(is_ref(a) for a in [*args, *operand_kw.values()]):  # before any index check: the cause
        raise ValueError(f"{label}: input_output_aliases cannot be combined with Ref arguments: a Ref is already "
                         "updated in place (drop input_output_aliases, or pass arrays instead of Refs)")
    aliased_outs = set(aliases.values())
    if len(aliased_outs) != len(aliases):
        raise ValueError(f"{label}: input_output_aliases {aliases} must map distinct inputs to distinct outputs")
    for i, o in aliases.items():
        if not 0 <= o < len(out_types):
            raise ValueError(f"{label}: input_output_aliases {{{i}: {o}}}: output {o} is out of range "
                             f"({len(out_types)} outputs in out_type)")
    n_fill = len(out_types) - len(aliased_outs)

    if len(args) > len(params):
        raise TypeError(f"{label}: {len(args)} positional operands but the kernel takes {len(runtime)} besides its "
                        f"meta-parameters ({', '.join(p.name for p in runtime)})")
    given: dict[str, Any] = dict(zip((p.name for p in params), args))
    for k, v in operand_kw.items():
        if k in given:
            raise TypeError(f"{label}: got multiple values for argument {k!r} (given both positionally and as a keyword)")
        given[k] = v
    values, inputs, refs, layout = [], [], [], []
    operand_inputs = []  # per operand (non-constexpr parameter given a value), its input index or None
    unaliased = iter([o for o in range(len(out_types)) if o not in aliased_outs])
    missing = [p.name for p in runtime if p.name not in given]
    leaf_params, paths = [], []  # per entry of `values`: its parameter, and its path in a tuple argument

    def operand(p, path: tuple, v) -> None:
        """One operand: a parameter's value, or one element of a tuple argument (lazytriton.model.tuples)."""
        what = tuples.leaf_name(p.name, path)
        if isinstance(v, TransformedRef):
            raise NotImplementedError(f"{label}: argument {what} is a transformed Ref (ref.at[...]); pass "
                                      "the whole Ref")
        leaf_params.append(p)
        paths.append(path)
        if isinstance(v, TensorDescriptor):  # its base is the operand, the rest is static
            _check_tensor_descriptor(label, what, v)
            if is_ref(v.base):
                refs.append(len(inputs))
            values.append(("desc", len(inputs), v))
            operand_inputs.append(len(inputs))
            inputs.append(v.base)
            return
        if _is_scalar(v):
            v = _scalar(v)
            values.append(("scalar", v))
            operand_inputs.append(None)
            return
        if path and (isinstance(v, (list, dict, triton.language.constexpr)) or callable(v)):
            raise TypeError(f"{label}: argument {what} is a {type(v).__name__}; a tuple argument's elements are "
                            "arrays, Refs, Python scalars, None or tuples of these")
        if is_ref(v):
            refs.append(len(inputs))
        values.append(("input", len(inputs)))
        operand_inputs.append(len(inputs))
        inputs.append(v)

    for p in params:
        if p.name in given:
            v = given[p.name]
            if p.is_constexpr:
                if not _is_scalar(v):
                    raise TypeError(f"{label}: argument {p.name} is a tl.constexpr but receives "
                                    f"{'a tuple' if isinstance(v, (tuple, list)) else 'an array'}; pass "
                                    "meta-parameters (None, bool, int, float, str) as keyword arguments")
                v = _scalar(v)
                layout.append(len(values))
                leaf_params.append(p)
                paths.append(())
                values.append(("const", v))
                meta[p.name] = v
                continue
            if isinstance(v, list) or (isinstance(v, tuple) and type(v) is not tuple):
                raise TypeError(f"{label}: argument {p.name} is a {type(v).__name__}; pass a plain tuple")
            if isinstance(v, tuple):  # flattened: each element is one operand, as in jax-triton 0.4
                for sub, n in tuples.nodes(v):
                    node = tuples.at(v, sub)
                    if type(node) is not tuple:
                        raise TypeError(f"{label}: argument {tuples.leaf_name(p.name, sub)} is a "
                                        f"{type(node).__name__}; pass a plain tuple")
                layout.append(_layout_of(v, len(values)))
                for sub, leaf in tuples.leaves(v):
                    operand(p, sub, leaf)
                continue
            layout.append(len(values))
            operand(p, (), v)
            continue
        layout.append(len(values))
        leaf_params.append(p)
        paths.append(())
        if p.is_constexpr:
            if p.name in meta:
                values.append(("const", meta[p.name]))
            elif sum(1 for kind, *_ in values if kind == "output") < n_fill:
                raise TypeError(f"{label}: argument {p.name} is a tl.constexpr but receives an array (an output); "
                                "pass meta-parameters as keyword arguments")
            else:
                raise TypeError(f"{label}: meta-parameter {p.name} is not given and has no default")
        else:
            o = next(unaliased, None)
            if o is not None:
                values.append(("output", o))
            elif p.default is not inspect.Parameter.empty:
                values.append(("scalar", p.default))
            else:
                raise ValueError(_unfilled(label, n_fill, missing, aliases))
    if next(unaliased, None) is not None:
        raise ValueError(_unfilled(label, n_fill, missing, aliases))
    by_input = {}
    for i, o in aliases.items():
        if not 0 <= i < len(operand_inputs):
            raise ValueError(f"{label}: input_output_aliases {{{i}: {o}}}: operand {i} is out of range "
                             f"({len(operand_inputs)} operands; indices count the flattened non-constexpr operands "
                             "in parameter order, scalars included)")
        if operand_inputs[i] is None:
            raise ValueError(f"{label}: input_output_aliases {{{i}: {o}}}: operand {i} is a scalar, not an array")
        by_input[operand_inputs[i]] = o
        src, dst = inputs[operand_inputs[i]], out_types[o]
        if tuple(src.shape) != tuple(dst.shape) or np.dtype(src.dtype) != np.dtype(dst.dtype):
            raise ValueError(f"{label}: input_output_aliases {{{i}: {o}}}: the input is {src.dtype}{list(src.shape)} "
                             f"but output {o} is {dst.dtype}{list(dst.shape)}")
    return Call(kernel, spec, label, leaf_params, values, inputs, out_types, meta, by_input, params, paths, layout)


def _layout_of(value: tuple, start: int) -> list:
    """A tuple argument as nested lists of the indices its leaves take in the call's values, from `start`."""
    counter = iter(range(start, start + sum(1 for _ in tuples.leaves(value))))

    def walk(v):
        return [walk(x) for x in v] if isinstance(v, tuple) else next(counter)

    return walk(value)


def _check_tensor_descriptor(label: str, name: str, d: TensorDescriptor) -> None:
    """What jax-triton refuses, and what no launch could encode (checked again,
    with the operand's real address, on every execution)."""
    if d.layout is not None:
        raise NotImplementedError(f"{label}: argument {name}: a TensorDescriptor with a layout (a Gluon kernel's) is "
                                  "not supported by lazytriton.jax")
    aval = jax.typeof(d.base)
    aval = getattr(aval, "inner_aval", aval)
    if d.round_f32_to_tf32 and np.dtype(aval.dtype) != np.float32:
        raise ValueError("TMA descriptors with round_f32_to_tf32=True must have a float32 input type, but got "
                         f"{aval.dtype}")
    dtype = triton_dtype(np.dtype(aval.dtype).name)
    if dtype is None:
        raise TypeError(f"{label}: argument {name}: a TensorDescriptor over {aval.dtype}, which Triton kernels "
                        "cannot take")
    why = _core.check_tensor_desc((0, DTYPE_IDS[dtype], tuple(int(x) for x in d.shape),
                                   tuple(int(x) for x in d.strides), tuple(int(x) for x in d.block_shape),
                                   d.padding == "nan", bool(d.round_f32_to_tf32)))
    if why:
        raise ValueError(f"{label}: argument {name}: {why}")


def _unfilled(label: str, n_fill: int, missing: list, aliases: dict) -> str:
    msg = (f"{label}: out_type has {n_fill} unaliased outputs, but {len(missing)} kernel parameters have no "
           f"argument ({', '.join(missing) or 'none'}); each such parameter receives one unaliased output, in order")
    if aliases:
        msg += (". Since jax-triton 0.4 an input named in input_output_aliases is used directly by the kernel and is "
                "NOT declared again as an output parameter: remove that output pointer from the kernel (it writes "
                "the input's parameter), or pass the input as a jax.new_ref Ref with no output")
    return msg
