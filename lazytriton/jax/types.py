"""What the JAX face's modules share: the bound call (Call), the kernel's
identity a call site records, the tensor descriptor argument, the default
compile options, and the refusal text for autotuner hooks."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import numpy as np

from ..cache import keys
from ..model.spec import kernel_spec

# Compile options lazytriton's compiler takes (backend_options= and the explicit arguments).
OPTION_DEFAULTS = {"num_ctas": 1, "enable_fp_fusion": True, "debug": False, "launch_pdl": False}


def _strides_from_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    size = int(np.prod(shape))
    strides = []
    for d in shape:
        size = size // d
        strides.append(size)
    return tuple(strides)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
    """Host-side TMA descriptor for use with :func:`triton_call` (jax-triton
    0.4's): `base` is the operand, the rest is static. The handler encodes its
    CUtensorMap on every execution from the operand's address."""

    base: jax.Array
    shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    strides: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    block_shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    layout: Any | None = dataclasses.field(default=None, metadata=dict(static=True))
    padding: str = dataclasses.field(default="zero", metadata=dict(static=True))
    round_f32_to_tf32: bool = dataclasses.field(default=False, metadata=dict(static=True))

    def __post_init__(self):
        if self.padding not in ("zero", "nan"):
            raise ValueError(f"padding must be 'zero' or 'nan', got {self.padding!r}")
        if not (len(self.shape) == len(self.strides) == len(self.block_shape)):
            raise ValueError(
                "shape, strides, and block_shape must have the same length, got"
                f" {len(self.shape)}, {len(self.strides)}, {len(self.block_shape)}")

    @classmethod
    def from_array(cls, array: jax.Array, block_shape: Sequence[int], layout: Any | None = None,
                   padding: str = "zero", round_f32_to_tf32: bool = False) -> "TensorDescriptor":
        """Constructs a :class:`TensorDescriptor` from a JAX array."""
        return cls(array, array.shape, _strides_from_shape(array.shape), tuple(block_shape), layout, padding,
                   round_f32_to_tf32)


def hook_refusal(name: str, i: int, c: Any, why: str) -> str:
    return (f"triton_call {name}: autotune config {i} ({c}) has a pre_hook, which is not supported: "
            "lazytriton.jax launches from C++ and inside CUDA graphs, where no Python runs. Remove the hook: "
            "zero buffers with reset_to_zero= or zeroed_outputs=, or prepare them in JAX before the call (a "
            f"pre_hook that only sets tensor descriptors' block_shape is supported; this one {why}).")


@functools.lru_cache(maxsize=256)
def kernel_identity(kernel: Any) -> dict:
    spec = kernel_spec(kernel)
    fn = spec.fn.fn
    fingerprint = keys.kernel_fingerprint(spec.fn)
    ident = {"module": fn.__module__, "qualname": fn.__qualname__, "name": spec.name, "fingerprint": fingerprint}
    ident["id"] = f"{ident['module']}:{ident['qualname']}:{fingerprint[:16]}"
    return ident


@dataclasses.dataclass
class Call:
    """A triton_call bound to the kernel's parameters, as the handler will
    launch it: one value per call parameter (the parameters not set by autotune
    configs or heuristics), in the kernel's order. This binding is the only
    one: the payload carries it whole, and both the tuning launches and the
    C++ launches read their arguments from it, so they cannot disagree."""
    kernel: Any
    spec: Any
    label: str
    params: list  # per value: its call parameter (spec.Param)
    values: list  # per leaf: ("input", i) | ("output", o) | ("scalar", v) | ("const", v) | ("desc", i, d)
    inputs: list  # the array and Ref operands, in parameter order (the custom call's operands)
    out_types: list
    meta: dict  # meta-parameters: constexpr values, the kernel's defaults, names only the grid reads
    aliases: dict  # input index -> output index (the kernel writes that input; no parameter for the output)
    # A tuple argument is flattened (lazytriton.model.tuples): each element is one value, `paths` gives its
    # path in the tuple (() for a whole parameter), `layout` per call parameter the index of its value,
    # or for a tuple argument nested lists of its elements' indices.
    call_params: list = dataclasses.field(default_factory=list)
    paths: list = dataclasses.field(default_factory=list)
    layout: list = dataclasses.field(default_factory=list)
