"""Reading device arrays from Python objects: pointer, Triton dtype, size.

The C++ stubs ask this module once per Python type (how to read its pointer),
once per dtype object (its Triton dtype id) and once per constexpr object that
is not a None/bool/int/float (its value's index, constexpr_index); everything
after that happens in C++ by identity checks.
"""
from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any

from triton.language import constexpr
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor as TritonTensorDescriptor

# Triton element types, by id. The ids are baked into generated stubs, so only
# append to this list.
DTYPES = (
    "u1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
    "fp16", "bf16", "fp32", "fp64",
    "fp8e4nv", "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16",
)
DTYPE_IDS = {name: i for i, name in enumerate(DTYPES)}

# Names frameworks print for dtypes (numpy/cupy/jax/ml_dtypes/torch), to Triton's.
_ALIASES = {
    "bool": "u1", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32",
    "float64": "fp64", "double": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "float8_e4m3fnuz": "fp8e4b8",
    "float8_e5m2fnuz": "fp8e5b16",
    # Not ml_dtypes' float8_e4m3b11fnuz: its exponent bias is 11, fp8e4b15's is 15
    # (Triton refuses that dtype too).
}

# __cuda_array_interface__ typestr (without byte order) to Triton dtype.
_TYPESTR = {
    "b1": "u1", "i1": "i8", "i2": "i16", "i4": "i32", "i8": "i64",
    "u1": "u8", "u2": "u16", "u4": "u32", "u8": "u64",
    "f2": "fp16", "f4": "fp32", "f8": "fp64",
}

NOT_ARRAY, DATA_PTR_METHOD, DATA_DOT_PTR, CUDA_ARRAY_INTERFACE, DLPACK, TORCH, RECORDED = range(7)
# RECORDED: lazytriton's own DeviceArray, the record of a buffer whose maker vouches for it (the JAX
# handler's XLA buffers, on the device XLA launches the call on; stand-ins for compiling ahead and for
# tests): read by data_ptr(), and never put to the device check.

# DLPack device types whose memory a kernel can read (python_args.h checks the
# same): kDLCUDA and kDLCUDAManaged. Not kDLCPU (1) nor kDLCUDAHost (3).
DLPACK_DEVICE_TYPES = (2, 13)
_DLPACK_DEVICE_NAMES = {1: "CPU (host memory)", 2: "CUDA", 3: "CUDA pinned host memory", 4: "OpenCL", 7: "Vulkan",
                        8: "Metal", 9: "VPI", 10: "ROCm", 11: "ROCm pinned host memory", 12: "ext_dev",
                        13: "CUDA managed memory", 14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}


def triton_dtype(dtype: Any) -> str | None:
    """Triton's name for a framework dtype object (or string), or None."""
    name = getattr(dtype, "name", None) if not isinstance(dtype, str) else dtype
    if not isinstance(name, str):
        name = str(dtype)
    name = name.removeprefix("torch.").removeprefix("dtype(").strip("')\"")
    if name in DTYPE_IDS:
        return name
    if name[:1] in ("<", "|", "=") and name[1:] in _TYPESTR:  # a __cuda_array_interface__ typestr, "<f4"
        return _TYPESTR[name[1:]]
    return _ALIASES.get(name)


def dtype_id(dtype: Any) -> int:
    """Called by the C++ stubs once per dtype object."""
    name = triton_dtype(dtype)
    return DTYPE_IDS[name] if name is not None else -1


def pointer_strategy(obj: Any) -> int:
    """How the C++ stubs read the device pointer of objects of this type."""
    if isinstance(obj, (int, float, bool, str, type(None))):
        return NOT_ARRAY
    if _is_torch_tensor(obj):
        return TORCH  # data_ptr(), once is_cuda says the memory is on a GPU
    if type(obj) is DeviceArray:
        return RECORDED
    if callable(getattr(obj, "data_ptr", None)):
        return DATA_PTR_METHOD
    data = getattr(obj, "data", None)
    if isinstance(getattr(data, "ptr", None), int) and hasattr(obj, "__cuda_array_interface__"):
        return DATA_DOT_PTR  # CuPy: reads two attributes instead of building a dict
    if hasattr(obj, "__cuda_array_interface__"):
        return CUDA_ARRAY_INTERFACE
    if hasattr(obj, "__dlpack__"):
        return DLPACK
    return NOT_ARRAY


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and isinstance(getattr(obj, "is_cuda", None), bool) \
        and callable(getattr(obj, "data_ptr", None))


def is_array(obj: Any) -> bool:
    return pointer_strategy(obj) != NOT_ARRAY


def is_descriptor(obj: Any) -> bool:
    """A host tensor descriptor argument (Triton's class or a subclass)."""
    return isinstance(obj, TritonTensorDescriptor)


def is_tensor_descriptor(obj: Any) -> int:
    """Called by the C++ stubs once per type: 1 for a host tensor descriptor."""
    return int(is_descriptor(obj))


def is_folded_constexpr(obj: Any) -> int:
    """1 for a value Triton's binder turns into a constexpr when it is passed for a
    parameter not declared tl.constexpr: None, a tl.constexpr, a @triton.jit function.
    Stated here, not in lazytriton.model.specialize (which reads it), because the
    C++ stubs ask this module (once per type; None is checked in C)."""
    return int(obj is None or isinstance(obj, (constexpr, JITFunction)))


@dataclass(frozen=True)
class ArrayInfo:
    ptr: int
    dtype: str  # Triton dtype name
    nbytes: int | None  # None when the object does not tell


def array_info(obj: Any, what: str = "argument") -> ArrayInfo:
    """Pointer, Triton dtype and size of a device array; TypeError naming `what` otherwise."""
    strategy = pointer_strategy(obj)
    if strategy == NOT_ARRAY:
        raise TypeError(f"{what}: expected a device array (an object with __cuda_array_interface__, "
                        f"__dlpack__ or data_ptr()), got {type(obj).__name__}")
    cai = getattr(obj, "__cuda_array_interface__", None) if strategy in (DATA_DOT_PTR, CUDA_ARRAY_INTERFACE) else None
    if strategy == TORCH and not obj.is_cuda:
        raise TypeError(f"{what}: the tensor is on {obj.device}, not on a CUDA device, so a Triton kernel cannot "
                        "read it: move it to the GPU first (.cuda())")
    if strategy in (DATA_PTR_METHOD, TORCH, RECORDED):
        ptr = int(obj.data_ptr())
    elif strategy == DATA_DOT_PTR:
        ptr = int(obj.data.ptr)
    elif strategy == CUDA_ARRAY_INTERFACE:
        ptr = int(cai["data"][0])
    else:
        ptr, device = _dlpack_pointer(obj)
        if device not in DLPACK_DEVICE_TYPES:
            raise TypeError(f"{what}: the array is in {_DLPACK_DEVICE_NAMES.get(device, 'memory')} (DLPack device "
                            f"type {device}), not in CUDA device memory, so a Triton kernel cannot read it: copy it "
                            "to the GPU first")
    # An object with __cuda_array_interface__ but no .dtype: the interface's typestr says it
    # (array_reads.h reads it the same way).
    dtype = triton_dtype(obj.dtype) if hasattr(obj, "dtype") else None
    if dtype is None and cai is not None and not hasattr(obj, "dtype"):
        dtype = triton_dtype(str(cai.get("typestr", "")))
    if dtype is None:
        raise TypeError(f"{what}: unsupported dtype "
                        f"{getattr(obj, 'dtype', None) or (cai or {}).get('typestr', '?')!r} for a Triton kernel")
    return ArrayInfo(ptr, dtype, _nbytes(obj))


def _nbytes(obj: Any) -> int | None:
    n = getattr(obj, "nbytes", None)
    if isinstance(n, int):
        return n
    numel, elsize = getattr(obj, "numel", None), getattr(obj, "element_size", None)
    if callable(numel) and callable(elsize):  # torch-like
        return int(numel()) * int(elsize())
    return None


def _dlpack_pointer(obj: Any) -> tuple[int, int]:
    """(address, DLPack device type) of a __dlpack__ object."""
    ptr, device, _ = _dlpack_tensor(obj)
    return ptr, device


def _dlpack_tensor(obj: Any) -> tuple[int, int, int]:
    """(address, DLPack device type, device id) of a __dlpack__ object."""
    import ctypes

    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    addr = get(capsule, b"dltensor")
    data = ctypes.c_void_p.from_address(addr).value or 0
    # DLTensor: data(8) device(type 4, id 4) ndim(4) dtype(4) shape(8) strides(8) byte_offset(8)
    device = ctypes.c_int32.from_address(addr + 8).value
    device_id = ctypes.c_int32.from_address(addr + 12).value
    offset = ctypes.c_uint64.from_address(addr + 40).value
    return data + offset, device, device_id


ANY_DEVICE = -2  # managed memory: any device may be handed it


def array_device(obj: Any) -> int | None:
    """The device a device array says its memory is on, as the stubs read it
    (array_reads.h pointer_of): torch's get_device(), CuPy's data.device_id, a
    DLPack tensor's device id (ANY_DEVICE for managed memory); None when the
    object does not say (a data_ptr() or __cuda_array_interface__ object)."""
    strategy = pointer_strategy(obj)
    if strategy == RECORDED:
        return ANY_DEVICE
    try:
        if strategy == TORCH:
            return int(obj.get_device())
        if strategy == DATA_DOT_PTR:
            device = getattr(obj.data, "device_id", None)
            return int(device) if isinstance(device, int) and device >= 0 else None
        if strategy == DLPACK:
            _, kind, device = _dlpack_tensor(obj)
            return device if kind == 2 else ANY_DEVICE  # kDLCUDA; kDLCUDAManaged
    except Exception:  # noqa: BLE001 (then the driver is asked, as for an object that does not say)
        return None
    return None


# -- constexpr values ------------------------------------------------------------------

# Constexpr arguments other than None/bool/int/float, interned for the life of
# the process: the stubs key such an argument on its index here, so equal values
# share a key and a value's key is never reused for another (the table keeps
# each one alive).
_constexpr_index: dict = {}
_constexpr_values: list = []
_constexpr_lock = threading.Lock()


def _value_key(v: Any) -> Any:
    """A hashable key equal only for values that Triton cannot tell apart: type
    included at every level of a tuple (1, 1.0 and True differ), floats by bits."""
    t = type(v)
    if isinstance(v, float):
        return t, struct.pack("<d", v)
    if isinstance(v, tuple):
        return t, tuple(_value_key(x) for x in v)
    return t, v


def constexpr_index(value: Any) -> int:
    """Called by the C++ stubs for a constexpr object they have not seen: the
    index of its value (hashable values by equality, others by identity)."""
    try:
        key = _value_key(value)
        hash(key)
    except Exception:  # unhashable: by identity, kept alive so the identity stays unique
        key = ("id", id(value))
    with _constexpr_lock:
        index = _constexpr_index.get(key)
        if index is None:
            index = _constexpr_index[key] = len(_constexpr_values)
            _constexpr_values.append(value)
        return index


class PointerArg:
    """What Triton's specializer sees for one of our arrays: data_ptr() and dtype."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype: str):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return f"PointerArg(0x{self.ptr:x}, {self.dtype})"


class DeviceArray:
    """A device buffer known only by address, Triton dtype and size: what the
    JAX handler and C++ embedders hand to the Python resolver. Readable by the
    stubs (data_ptr) and by any consumer of __cuda_array_interface__."""

    __slots__ = ("ptr", "dtype", "nbytes", "shape")

    def __init__(self, ptr: int, dtype: str, nbytes: int, shape: tuple[int, ...] | None = None):
        if dtype not in DTYPE_IDS:
            raise TypeError(f"unknown Triton dtype {dtype!r}")
        self.ptr, self.dtype, self.nbytes = int(ptr), dtype, int(nbytes)
        self.shape = tuple(shape) if shape is not None else (self.nbytes // max(1, itemsize(dtype)),)

    def data_ptr(self) -> int:
        return self.ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        typestr = {v: k for k, v in _TYPESTR.items()}.get(self.dtype, f"V{itemsize(self.dtype)}")
        return {"shape": self.shape, "typestr": "<" + typestr, "data": (self.ptr, False), "version": 3}

    def __repr__(self) -> str:
        return f"DeviceArray(0x{self.ptr:x}, {self.dtype}, {self.nbytes} bytes)"


def itemsize(dtype: str) -> int:
    """Bytes per element of a Triton dtype."""
    if dtype == "u1" or dtype.startswith("fp8"):
        return 1
    return int(dtype.lstrip("uifbp")) // 8
