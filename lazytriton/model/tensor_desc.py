"""Host-side tensor descriptors as kernel arguments.

A `triton.tools.tensor_descriptor.TensorDescriptor` (or lazytriton's own
`TensorDescriptor`, which takes any array lazytriton accepts as its base:
CuPy, torch, anything with __cuda_array_interface__ or __dlpack__) is read
here into a `DescInfo`: base pointer, dtype, shape, strides, block shape,
padding. The kernel's type depends on the dtype and the block shape only
(`tensordesc<fp16[64, 64]>`, Triton's specializer); the rest is encoded into a
CUtensorMap by the C++ core on every launch (csrc/core/tensor_desc.cc).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from triton.tools.tensor_descriptor import TensorDescriptor as TritonTensorDescriptor

from .arrays import DTYPE_IDS, PointerArg, array_info, is_array, is_descriptor, itemsize

__all__ = ["TensorDescriptor", "DescInfo", "is_descriptor", "read"]


def _ints(v: Any, what: str, field: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x.__index__()) if not isinstance(x, int) else x for x in v)
    except (TypeError, AttributeError):
        raise TypeError(f"{what}: the descriptor's {field} must be a sequence of ints, got {v!r}") from None
    if any(isinstance(x, bool) for x in out):
        raise TypeError(f"{what}: the descriptor's {field} must be a sequence of ints, got {v!r}")
    return out


@dataclass(frozen=True)
class DescInfo:
    """One descriptor argument as the launch paths read it."""
    ptr: int
    dtype: str  # Triton dtype name
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements
    block: tuple[int, ...]
    nan: bool  # padding == "nan"
    tf32: bool  # round_f32_to_tf32
    nbytes: int  # bytes from the base to the furthest element it reaches (what a tuning trial may write)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def as_tuple(self, name: str | None = None) -> tuple:
        """What the C++ core takes (lazytriton._core: pack_tensor_desc, Entry sources)."""
        t = (self.ptr, DTYPE_IDS[self.dtype], self.shape, self.strides, self.block, self.nan, self.tf32)
        return t + (name,) if name is not None else t

    def with_block(self, block: Sequence[int]) -> "DescInfo":
        return dataclasses.replace(self, block=tuple(int(b) for b in block))

    def type_string(self, block: Sequence[int] | None = None) -> str:
        """Triton's type of the kernel parameter, e.g. tensordesc<fp16[64, 64]>."""
        return f"tensordesc<{self.dtype}{list(block if block is not None else self.block)}>"


def read(obj: Any, what: str) -> DescInfo:
    """A descriptor's DescInfo, checked as every launch path checks it (the
    C++ core's check_tensor_desc); ValueError/TypeError naming `what` otherwise."""
    from .. import _core

    base = getattr(obj, "base", None)
    if not is_array(base):
        raise TypeError(f"{what}: the tensor descriptor's base must be a device array, got {type(base).__name__}")
    info = array_info(base, f"{what} (the descriptor's base)")
    shape = _ints(obj.shape, what, "shape")
    strides = _ints(obj.strides, what, "strides")
    block = _ints(obj.block_shape, what, "block_shape")
    if not (len(shape) == len(strides) == len(block)):
        raise ValueError(f"{what}: the descriptor's shape {list(shape)}, strides {list(strides)} and block_shape "
                         f"{list(block)} must have the same length (its rank)")
    padding = getattr(obj, "padding", "zero")
    if padding not in ("zero", "nan"):
        raise ValueError(f"{what}: the descriptor's padding must be 'zero' or 'nan', got {padding!r}")
    tf32 = bool(getattr(obj, "round_f32_to_tf32", False))
    # What the descriptor reaches, whatever the base object's own size (a strided view).
    nbytes = (sum((s - 1) * st for s, st in zip(shape, strides)) + 1) * itemsize(info.dtype)
    d = DescInfo(info.ptr, info.dtype, shape, strides, block, padding == "nan", tf32, max(int(nbytes), 0))
    if not 1 <= d.rank <= 5:
        raise ValueError(f"{what}: a tensor descriptor has rank 1 to 5, this one {d.rank} (shape {list(shape)})")
    why = _core.check_tensor_desc(d.as_tuple())
    if why:
        raise ValueError(f"{what}: {why}")
    return d


def bind_value(info: DescInfo, block: Sequence[int] | None = None) -> TritonTensorDescriptor:
    """What Triton's binder sees for a descriptor argument: its dtype and block
    shape decide the kernel's type (no specialization otherwise)."""
    d = object.__new__(TritonTensorDescriptor)  # no __post_init__: it would call torch methods
    d.base = PointerArg(info.ptr, info.dtype)
    d.shape, d.strides = list(info.shape), list(info.strides)
    d.block_shape = list(block if block is not None else info.block)
    d.padding = "nan" if info.nan else "zero"
    d.round_f32_to_tf32 = info.tf32
    return d


def unchecked(base: Any, shape, strides, block_shape, padding: str = "zero",
              round_f32_to_tf32: bool = False) -> "TensorDescriptor":
    """A TensorDescriptor made without its checks: the launch path reads (and
    checks) it, naming the kernel and the argument (the JAX handler's, C++ lazy mode's)."""
    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape = base, list(shape), list(strides), list(block_shape)
    d.padding, d.round_f32_to_tf32 = padding, bool(round_f32_to_tf32)
    return d


def _strides_of(array: Any) -> tuple[int, ...]:
    """Element strides of an array: torch's stride(), else byte strides
    (.strides, __cuda_array_interface__), else C-contiguous."""
    shape = tuple(array.shape)
    stride = getattr(array, "stride", None)
    if callable(stride):
        return tuple(int(s) for s in stride())
    size = itemsize(array_info(array).dtype)
    byte_strides = getattr(array, "strides", None)
    if byte_strides is None:
        cai = getattr(array, "__cuda_array_interface__", None)
        byte_strides = cai.get("strides") if isinstance(cai, dict) else None
    if byte_strides is not None:
        return tuple(int(s) // size for s in byte_strides)
    out, n = [], 1
    for s in reversed(shape):
        out.append(n)
        n *= int(s)
    return tuple(reversed(out))


@dataclass
class TensorDescriptor(TritonTensorDescriptor):
    """Triton's host-side TensorDescriptor over any device array lazytriton
    accepts (CuPy, torch, __cuda_array_interface__, __dlpack__): the same
    fields (base, shape, strides in elements, block_shape, padding,
    round_f32_to_tf32) and checks, with the checks errors rather than asserts.

        desc = lazytriton.TensorDescriptor.from_tensor(cupy_array, [64, 64])
    """
    round_f32_to_tf32: bool = False

    def __post_init__(self):
        self.shape, self.strides = list(self.shape), list(self.strides)
        self.block_shape = list(self.block_shape)
        read(self, "TensorDescriptor")

    @classmethod
    def from_tensor(cls, tensor: Any, block_shape: Sequence[int], padding: str = "zero",
                    round_f32_to_tf32: bool = False) -> "TensorDescriptor":
        return cls(tensor, list(tensor.shape), list(_strides_of(tensor)), list(block_shape), padding,
                   round_f32_to_tf32)
