"""Triton's specialization rules, written once for every Python face.

What Triton's binder makes of a call argument, and what lazytriton's launchers
must therefore key on and pack: the slot of each argument (`slot_for`), the
shape of a call (`Shape`, whose `digest` names stubs and enters tuning keys),
the kernel parameter type and C type of each slot, the bundle's spec suffix
("16"/"1"/""), the annotated scalar types and their ranges, the checks of
values Triton's launcher refuses, the tuple-element defaults, JAX's fp64 rule
and the compile options each face takes; and Triton's own native specializer,
primed off a first call's path (`prime_specializer`). The stubs (stubgen), the bundles
(lazytriton.cpp.bundle), the JAX face and the cache key read them here; none
restates one. The C++ encoders (csrc/) follow the same rules.
"""
from __future__ import annotations

import hashlib
import logging
import math
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any

from . import tensor_desc, tuples
from .arrays import DTYPE_IDS, DTYPES, array_info, is_array, is_folded_constexpr
from .contract import (AMD_OPTION_NAMES, BUNDLE_OPTION_NAMES, FLOAT_TYPES, INT_CLASSES,  # noqa: F401
                       INT_TYPES, JAX_OPTION_NAMES, OPTION_NAMES, PROCESS_CONSTEXPR_TAGS, SLOT_KIND_CODES)

# -- types ---------------------------------------------------------------------------

# Integer types an annotation can fix (INT_TYPES), the classes Triton gives an unannotated
# int (INT_CLASSES, the first that holds it) and the float parameter types (FLOAT_TYPES)
# are contract's, shared with C++. The integer types' ranges:
INT_RANGES = {t: ((-2**(int(t[1:]) - 1), 2**(int(t[1:]) - 1) - 1) if t[0] == "i" else (0, 2**int(t[1:]) - 1))
              for t in INT_TYPES}
# The C type each scalar parameter type is packed as (Triton's launcher's bytes; tl.int1 is one byte).
CTYPES = {"i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "u8": "uint8_t",
          "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t", "u1": "uint8_t",
          "fp16": "uint16_t", "bf16": "uint16_t", "fp32": "float", "fp64": "double"}
# Annotations that can be passed as scalars: Triton's launcher converts a number to each.
SCALAR_TYPES = (*INT_TYPES, *FLOAT_TYPES, "u1")
# Annotations that fix a scalar parameter's type (Triton's annotation_type); the fp8 ones
# have no conversion in Triton's launcher, so a call passing one is refused.
SCALAR_ANNOTATIONS = frozenset(SCALAR_TYPES) | {d for d in DTYPES if d.startswith("fp8")}


def int_class(v: int, what: str) -> str:
    for t in INT_CLASSES:
        lo, hi = INT_RANGES[t]
        if lo <= v <= hi:
            return t
    raise ValueError(f"{what}: integer {v} does not fit 64 bits")


# -- slots and shapes ---------------------------------------------------------------------

# Codes of a slot table row (contract.SLOT_ROW; read by csrc/python/generic_stub.cc).
_FIXED_CODES = {t: i for i, t in enumerate(INT_TYPES)}
_CLASS_CODES = {t: i for i, t in enumerate(INT_CLASSES)}
_FLOAT_CODES = {t: i for i, t in enumerate(FLOAT_TYPES)}


@dataclass(frozen=True)
class Slot:
    """How one call argument is read. kind: ptr | int | float | bool | constexpr |
    desc (a host tensor descriptor: its block shape goes into the call key)."""
    kind: str
    dtype: int = -1  # ptr, desc: lazytriton.model.arrays.DTYPE_IDS value
    int_type: str = ""  # int: Triton type of this call ("i32"/"i64"/"u64", or the annotation)
    # Type fixed by the parameter's annotation. int: no class switching, and a
    # bool is taken too, as 0 or 1 with no bits keyed (as Triton's binder does);
    # float: an int or a bool is taken too; bool (tl.int1): an int is taken
    # too, as 0 or 1.
    annotated: bool = False
    specialize: bool = True  # ints: the == 1 bit (Triton folds a 1 into a constexpr); pointers: 16-byte alignment
    in_key: bool = False  # value goes into the call key (autotune key, read by heuristics)
    divisibility: bool = True  # ints: the % 16 bit (tt.divisibility 16)
    float_type: str = "fp32"  # float: the parameter type, fp16 | bf16 | fp32 | fp64
    rank: int = 0  # desc: the descriptor's rank
    # constexpr: made by the value, not declared (None, a tl.constexpr or a @triton.jit function
    # passed for a plain parameter, which Triton's binder folds into a constexpr). The stub then
    # takes only such values there: an array or a number is another specialization, one with a
    # kernel parameter this shape does not have.
    folded: bool = False

    def param_type(self) -> str:
        """The kernel parameter type the stub packs this argument as (a
        descriptor's: its dtype and rank; its block shape is per call)."""
        if self.kind == "ptr":
            return "*" + DTYPES[self.dtype]
        if self.kind == "desc":
            return f"tensordesc<{DTYPES[self.dtype]}>[rank {self.rank}]"
        return {"int": self.int_type, "float": self.float_type, "bool": "u1"}.get(self.kind, "constexpr")

    def ctype(self) -> str:
        """The C type of a scalar slot's packed value (pointers and constexprs: their 8-byte cell)."""
        if self.kind in ("int", "float", "bool"):
            return CTYPES[self.param_type()]
        if self.kind == "desc":
            return "HostTensorDesc"
        return "uint64_t"

    def code(self) -> str:
        # Fields added later only when they differ from what the older code
        # implied, so that unchanged shapes keep their digests (and tuning keys).
        text = (f"{self.kind}:{self.dtype}:{self.int_type}:{int(self.annotated)}:{int(self.specialize)}:"
                f"{int(self.in_key)}")
        if self.kind == "int" and self.divisibility != self.specialize:
            text += f":div{int(self.divisibility)}"
        if self.kind == "float" and self.float_type != "fp32":
            text += f":{self.float_type}"
        if self.kind == "desc":
            text += f":r{self.rank}"
        if self.folded:
            text += ":folded"
        return text

    def value_words(self) -> int:
        """Key words after the bit words that this slot takes."""
        if self.kind == "constexpr":
            return 2
        if self.kind == "desc":
            return self.rank  # its block shape: part of the kernel's type
        return 1 if self.in_key else 0


@dataclass(frozen=True)
class Shape:
    """How a call's arguments are read: one slot per leaf. Without tuple
    arguments a leaf is an argument (`paths`, `args` and `tuples` empty).
    With them (lazytriton.model.tuples), `paths[i]` is slot i's path (argument index,
    then element indices), `args` the call's argument names (what a grid
    callable sees) and `tuples` the (path, length) of every tuple argument and
    nested tuple, which the stub checks before reading the leaves."""
    names: tuple[str, ...]  # per slot: the argument's name, or the leaf's ("xs[1][0]")
    slots: tuple[Slot, ...]
    paths: tuple[tuple[int, ...], ...] = ()
    args: tuple[str, ...] = ()
    tuples: tuple[tuple[tuple[int, ...], int], ...] = ()

    @property
    def flat(self) -> bool:
        return not self.paths

    @property
    def arg_names(self) -> tuple[str, ...]:
        return self.names if self.flat else self.args

    def slot_paths(self) -> tuple[tuple[int, ...], ...]:
        return tuple((i,) for i in range(len(self.slots))) if self.flat else self.paths

    def call_leaves(self, n_call: int) -> int:
        """Slots of the first `n_call` arguments (the trailing pseudo-arguments left out)."""
        return sum(1 for path in self.slot_paths() if path[0] < n_call)

    def leaf_values(self, args: tuple) -> list:
        """The value of each slot in a call tuple of this shape."""
        if self.flat:
            return list(args[:len(self.slots)])
        out = []
        for path in self.paths:
            v = args
            for i in path:
                v = v[i]
            out.append(v)
        return out

    def digest(self) -> str:
        text = "|".join(f"{n}={s.code()}" for n, s in zip(self.names, self.slots))
        if not self.flat:  # only then: shapes without tuples keep their digests
            text += "|args=" + ",".join(self.args) + "|paths=" + ";".join(
                ".".join(map(str, p)) for p in self.paths) + "|tuples=" + ";".join(
                ".".join(map(str, p)) + f"#{n}" for p, n in self.tuples)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def shape_word(self) -> int:
        """The call key's last word: stubs of different shapes (dtypes, integer
        classes, ...) never share a key in a kernel's table."""
        return int(self.digest()[:16], 16)

    def bit_words(self) -> int:
        """The call key's first words: 2 bits per slot (== 1 or aligned, % 16)."""
        return (2 * len(self.slots) + 63) // 64

    def key_words(self) -> int:
        return self.bit_words() + sum(s.value_words() for s in self.slots) + 1

    def table(self) -> tuple:
        """The slot table of the table-driven stub (csrc/python/generic_stub.cc): a row of
        contract.SLOT_ROW's fields per slot."""
        rows = []
        for sl in self.slots:
            kind = SLOT_KIND_CODES["folded" if sl.folded else sl.kind]
            if sl.kind == "int":
                code = _FIXED_CODES[sl.int_type] if sl.annotated else _CLASS_CODES[sl.int_type]
            elif sl.kind == "desc":
                code = sl.rank
            else:
                code = 0
            rows.append((kind, sl.dtype, code, int(sl.annotated), int(sl.specialize), int(sl.in_key),
                         int(sl.divisibility), _FLOAT_CODES.get(sl.float_type, 2)))
        return tuple(rows)

    def portable_key(self, key: tuple, args: tuple) -> tuple:
        """`key` for the persistent cache: without the shape word (the tuning key
        has the slots), and each interned constexpr object's index (which
        depends on this process's history) replaced by the value itself."""
        out = list(key[:-1])
        w = self.bit_words()
        for s, v in zip(self.slots, self.leaf_values(args)):
            if s.kind == "constexpr" and out[w] in PROCESS_CONSTEXPR_TAGS:
                out[w + 1] = v
            w += s.value_words()
        return tuple(out)


# -- value -> slot -------------------------------------------------------------------------


@dataclass(frozen=True)
class Flags:
    """What a kernel parameter's declaration says about specializing it.
    specialize: off under do_not_specialize; align: off under
    do_not_specialize_on_alignment; annotation: without "tl." ("" if none)."""
    constexpr: bool = False
    annotation: str = ""
    specialize: bool = True
    align: bool = True

    @property
    def divisible(self) -> bool:
        """Triton's % 16 / 16-byte alignment attribute: do_not_specialize turns it off too."""
        return self.specialize and self.align


# Triton's binder specializes a tuple's elements with its defaults, whatever the
# parameter's annotation and do_not_specialize lists say.
TUPLE_ELEMENT = Flags()


def flags_of(p: Any) -> Flags:
    """The flags of a lazytriton.model.spec.Param."""
    return Flags(p.is_constexpr, p.annotation.removeprefix("tl."), not p.do_not_specialize,
                 not p.do_not_specialize_on_alignment)


def takes_tuple(f: Flags, v: Any) -> bool:
    """A tuple value read leaf by leaf (a constexpr or a scalar-annotated parameter is one slot)."""
    return tuples.is_tuple(v) and not f.constexpr and f.annotation not in SCALAR_ANNOTATIONS


def slot_for(f: Flags, v: Any, in_key: bool, what: str) -> Slot:
    """How the stubs read value `v` of a parameter declared as `f`: the kernel
    parameter type Triton's binder gives it, and the bits its specializer keys
    on. `what` ("kernel k, argument n") starts any error raised."""
    if f.constexpr:
        return Slot("constexpr")
    if f.annotation in SCALAR_ANNOTATIONS:
        return _annotated_slot(f, v, in_key, what)
    if is_folded_constexpr(v):
        return Slot("constexpr", folded=True)  # folded into the binary (Triton: a constexpr, keyed by value)
    if isinstance(v, bool):
        return Slot("bool", in_key=in_key)
    if isinstance(v, int):
        # Triton: == 1 becomes a constexpr unless do_not_specialize; % 16 == 0
        # gets tt.divisibility unless do_not_specialize(_on_alignment).
        return Slot("int", int_type=int_class(v, what), specialize=f.specialize, divisibility=f.divisible,
                    in_key=in_key)
    if isinstance(v, float):
        return Slot("float", in_key=in_key)
    if is_array(v):
        info = array_info(v, what)
        return Slot("ptr", dtype=DTYPE_IDS[info.dtype], specialize=f.divisible)
    if tensor_desc.is_descriptor(v):
        # Triton specializes a descriptor on its dtype and block shape only (its type).
        d = tensor_desc.read(v, what)
        return Slot("desc", dtype=DTYPE_IDS[d.dtype], rank=d.rank)
    raise TypeError(f"{what}: unsupported argument type {type(v).__name__} "
                    "(expected a device array, a tensor descriptor, int, float, bool, None or a tuple of these)")


def _annotated_slot(f: Flags, v: Any, in_key: bool, what: str) -> Slot:
    """A parameter annotated with a scalar type (n: tl.int64, x: tl.float16):
    Triton's signature has that type whatever the value, its launcher converts
    the value to it, and only an int value is specialized: % 16 (never folded
    into a constexpr when == 1)."""
    ann = f.annotation
    if ann not in SCALAR_TYPES:
        raise TypeError(f"{what}: a scalar parameter annotated {ann} cannot be passed (Triton's launcher has no "
                        f"conversion to {ann} either)")
    if not isinstance(v, (int, float)):
        got = "None" if v is None else "a device array" if is_array(v) else type(v).__name__
        raise TypeError(f"{what}: expects a number for its annotated type {ann}, got {got}")
    if ann in INT_TYPES:
        # A bool is 0 or 1 (no specialization, the stub checks); a float is refused
        # by check_launchable, as Triton's launcher refuses it.
        if isinstance(v, int) and not isinstance(v, bool):
            lo, hi = INT_RANGES[ann]
            if not lo <= v <= hi:
                raise ValueError(f"{what}: integer {v} does not fit its annotated type {ann} "
                                 f"(from {lo} to {hi})")
        return Slot("int", int_type=ann, annotated=True, specialize=False, divisibility=f.divisible, in_key=in_key)
    if ann == "u1":  # tl.int1: a bool, or an int passed as its low byte (as Triton does)
        if isinstance(v, int) and not -2**63 <= v < 2**63:
            raise ValueError(f"{what}: integer {v} does not fit 64 bits")
        return Slot("bool", annotated=True, in_key=in_key)
    try:  # a float type: the stub converts as Triton's launcher does, which refuses these
        d = float(v)
        if ann == "fp16":
            struct.pack("<e", d)
    except OverflowError as exc:
        raise OverflowError(f"{what}: {v!r} does not fit its annotated type {ann} ({exc})") from None
    return Slot("float", float_type=ann, annotated=True, in_key=in_key)


def holds_array(v: Any) -> bool:
    """An array or a tensor descriptor (whose contents, shape, strides the call key
    does not hold), or a tuple with one among its elements."""
    return any(is_array(leaf) or tensor_desc.is_descriptor(leaf) for _, leaf in tuples.leaves(v))


def check_launchable(slot: Slot, v: Any, what: str) -> None:
    """A value whose slot is its parameter's type but that Triton's launcher
    refuses to convert to it: a float for an integer or tl.int1 parameter."""
    if slot.annotated and slot.kind in ("int", "bool") and isinstance(v, float):
        raise TypeError(f"{what}: a float ({v!r}) cannot be passed as {slot.param_type()}, its annotated type "
                        "(Triton's launcher takes only ints and bools for an integer parameter)")


def kernel_type(slot: Slot, v: Any, what: str) -> str:
    """The kernel parameter type in Triton's spelling: a descriptor's holds its
    block shape (tensordesc<fp16[64, 64]>), which is per call, not per slot."""
    if slot.kind == "desc":
        return tensor_desc.read(v, what).type_string()
    return slot.param_type()


def spec_suffix(slot: Slot, v: Any) -> str:
    """Triton's specialization of one argument as a signature writes it: "1" (an int
    folded into a constexpr), "16" (divisible, or a 16-byte aligned pointer) or ""."""
    if slot.kind == "ptr":
        return "16" if slot.specialize and array_info(v).ptr % 16 == 0 else ""
    if slot.kind != "int" or isinstance(v, bool) or not isinstance(v, int):
        return ""  # Triton specializes ints only (a bool for an int annotation is 0 or 1, unkeyed)
    if slot.specialize and v == 1:
        return "1"
    return "16" if slot.divisibility and v % 16 == 0 else ""


# -- JAX's fp64 rule ---------------------------------------------------------------------

_F32_TINY, _F32_MAX = 2.0**-126, float.fromhex("0x1.fffffep+127")
# The float type a Python float widens to when fp32 cannot hold it. The binder
# keeps it (Triton's own signature says fp32 for every Python float).
WIDE_FLOAT = "fp64"


def needs_fp64(v: Any) -> bool:
    """jax-triton's rule for a Python float passed to an unannotated parameter:
    fp32 when fp32 holds it (or it is 0, inf or nan), else fp64."""
    if type(v) is not float:
        return False
    a = abs(v)
    return not (math.isnan(v) or math.isinf(v) or a == 0.0 or _F32_TINY <= a <= _F32_MAX)


# -- compile options -----------------------------------------------------------------------

# The compile options each face takes (OPTION_NAMES, JAX_OPTION_NAMES, BUNDLE_OPTION_NAMES,
# AMD_OPTION_NAMES) are contract's: the C++ bundle binder reads them too.

# The value each compile option takes (the fields of Triton's CUDAOptions / HIPOptions); None
# is the backend's default. Checked where the option is given: Triton would fail on a wrong
# one only inside the first compile, with an error that names neither the kernel nor the option.
_INT_OPTIONS = {"num_warps": 1, "num_stages": 0, "num_ctas": 1, "maxnreg": 1, "waves_per_eu": 0,
                "matrix_instr_nonkdim": 0, "kpack": 0}  # name -> the least value it takes
_BOOL_OPTIONS = ("debug", "launch_pdl", "enable_fp_fusion", "launch_cooperative_grid")


def check_option(name: str, value: Any, what: str) -> None:
    """Refuses a compile option's value that no compile could take; `what` names the kernel
    (and the face), e.g. "kernel add"."""
    if value is None:
        return
    if name in _INT_OPTIONS:
        least = _INT_OPTIONS[name]
        takes = "an int, a power of 2" if name == "num_warps" else f"an int >= {least}"
        if type(value) is bool or not isinstance(value, int):
            raise TypeError(f"{what}: {name}={value!r}: {name} takes {takes}")
        if value < least or (name == "num_warps" and value & (value - 1)):
            raise ValueError(f"{what}: {name}={value!r}: {name} takes {takes}")
    elif name in _BOOL_OPTIONS:
        if not isinstance(value, int):  # Triton reads these for their truth
            raise TypeError(f"{what}: {name}={value!r}: {name} takes True or False")
    elif name == "ir_override" and not isinstance(value, str):
        raise TypeError(f"{what}: ir_override={value!r}: ir_override takes the name of an IR file (a str)")


# -- Triton's native specializer, primed off a first call's path -------------------------

_specializer_ready = threading.Lock()
_specializer_primed = False


def prime_specializer() -> None:
    """Makes the first use of Triton's native specializer (3.5+), which imports
    modules (Gluon's, about 0.1 s) and, in a process that has not imported
    torch, would import torch only to register a fast path for torch.Tensor:
    seconds of a first call in a JAX process. This first use runs with torch
    hidden from this thread's imports (other threads still import it); torch
    tensors still specialize identically, through the specializer's data_ptr
    fallback."""
    global _specializer_primed
    if _specializer_primed:
        return
    with _specializer_ready:
        if _specializer_primed:
            return
        try:
            from triton._C.libtriton import native_specialize_impl
            from triton.backends.compiler import BaseBackend
        except ImportError:  # a Triton without the native specializer imports nothing extra
            native_specialize_impl = None
        if native_specialize_impl is not None:
            hide = "torch" not in sys.modules
            if hide:
                _HideTorch.thread = threading.get_ident()
                sys.meta_path.insert(0, _HideTorch)  # `import torch` raises ImportError, which Triton clears
            try:
                native_specialize_impl(BaseBackend, 16, False, True, True)
            finally:
                if hide:
                    sys.meta_path.remove(_HideTorch)
                    _HideTorch.thread = None
        _specializer_primed = True


class _HideTorch:
    thread: int | None = None  # the thread priming the specializer

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "torch" and threading.get_ident() == cls.thread:
            raise ModuleNotFoundError("hidden while Triton's specializer starts", name="torch")
        return None


_priming: threading.Thread | None = None


def prime_in_background() -> None:
    """prime_specializer on a thread of its own, once (when a kernel is wrapped)."""
    global _priming
    if _priming is None and not _specializer_primed:
        # Not a daemon: a process that ends while it primes (a short script
        # whose first call found its winner on disk) waits for it; a daemon
        # thread stopped inside Triton's C++ at exit aborts the process
        # ("terminate called ... FATAL: exception not rethrown").
        _priming = threading.Thread(target=_prime_quietly, name="lazytriton-prime-specializer", daemon=False)
        _priming.start()


def _prime_quietly() -> None:
    try:
        prime_specializer()
    except Exception as exc:  # the first bind calls it again and raises where a caller sees it
        logging.getLogger(__name__).debug("priming Triton's specializer failed: %s", exc)
