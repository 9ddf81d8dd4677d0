"""The numbers Python and C++ share about Triton's contract, defined once.

Element type ids, the slot kinds of a call's slot table and their type codes,
the tags of a constexpr's key words, the compile options each face takes: the
Python faces import them from here, and the C++ side reads them from
csrc/include/lazytriton/contract.h, which is generated from this module
(`python lazytriton/model/contract.py` rewrites it; tests/test_contract.py fails,
naming the line, when the checked-in header differs from what this module
generates). The header is checked in so that building needs nothing new and
the public headers stay free of Python. Only append to the id lists: ids are
baked into generated stubs, cached keys and bundles.

This module imports nothing from lazytriton (it runs as a script).
"""
from __future__ import annotations

# -- element types -------------------------------------------------------------------

# Triton element types, by id (C++: enum Dtype).
DTYPES = (
    "u1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
    "fp16", "bf16", "fp32", "fp64",
    "fp8e4nv", "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16",
)
DTYPE_IDS = {name: i for i, name in enumerate(DTYPES)}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a Triton dtype."""
    if dtype == "u1" or dtype.startswith("fp8"):
        return 1
    return int(dtype.lstrip("uifbp")) // 8


def is_float_dtype(dtype: str) -> bool:
    return dtype.startswith(("fp", "bf"))


# -- scalar parameter types ----------------------------------------------------------------

# Integer types an annotation can fix (n: tl.int64); an annotated int slot's code is the index.
INT_TYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
# The type Triton gives an unannotated int: the first that holds it; an unannotated int slot's code.
INT_CLASSES = ("i32", "i64", "u64")
# Float parameter types; a float slot's code.
FLOAT_TYPES = ("fp16", "bf16", "fp32", "fp64")
# Every kernel parameter type the encoders know (C++: enum class Ty), in order.
PARAM_TYPES = ("ptr", *INT_TYPES, "u1", *FLOAT_TYPES, "desc")

# -- the slot table ------------------------------------------------------------------------

# How a slot is read (specialize.Slot.kind; "folded": a constexpr made by the value).
# C++: enum class SlotKind; a slot table row's first field.
SLOT_KINDS = ("ptr", "int", "float", "bool", "constexpr", "desc", "folded")
SLOT_KIND_CODES = {k: i for i, k in enumerate(SLOT_KINDS)}
# The fields of a slot table row (specialize.Shape.table), in order. code: an int's
# INT_TYPES (annotated) or INT_CLASSES index, a descriptor's rank; float_code: FLOAT_TYPES index.
SLOT_ROW = ("kind", "dtype", "code", "annotated", "specialize", "in_key", "divisibility", "float_code")

# The first of a constexpr's two key words (python_args.h constexpr_key): what the second holds.
# "interned": the value's index in this process's table (arrays.constexpr_index); "address":
# the object's address, should Python fail. Both depend on the process: the persistent key
# holds the value instead (specialize.Shape.portable_key).
CONSTEXPR_TAGS = {"none": 1, "bool": 2, "int": 3, "float": 4, "interned": 5, "address": 6}
PROCESS_CONSTEXPR_TAGS = (CONSTEXPR_TAGS["interned"], CONSTEXPR_TAGS["address"])

# -- compile options ---------------------------------------------------------------------

# Triton's AMD compile options, taken where the CUDA ones are (kernel calls, triton_call's
# backend_options, bundle calls) and, as Triton's idiom, in a config's kwargs.
AMD_OPTION_NAMES = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
# Compile options a call may pass as keyword arguments (k[grid](..., num_warps=4)).
OPTION_NAMES = ("num_warps", "num_stages", "num_ctas", "maxnreg", "debug", "launch_pdl", "ir_override",
                "enable_fp_fusion", "launch_cooperative_grid") + AMD_OPTION_NAMES
# The faces that take fewer. triton_call: jax-triton's options (its explicit arguments and
# backend_options).
JAX_OPTION_NAMES = tuple(n for n in OPTION_NAMES if n not in ("ir_override", "launch_cooperative_grid"))
# Those the C++ bundle binder (csrc/embed/bundle_kernel.cc) takes as options rather than as
# constexprs (C++: kCppOptionNames); a bundle written from Python takes the AMD ones as well.
CPP_OPTION_NAMES = tuple(n for n in OPTION_NAMES if n not in ("ir_override", "enable_fp_fusion")
                         and n not in AMD_OPTION_NAMES)
BUNDLE_OPTION_NAMES = CPP_OPTION_NAMES + AMD_OPTION_NAMES

# -- bundles -------------------------------------------------------------------------------

# The bundle manifest's format version (lazytriton.cpp.bundle writes it, the C++ reader checks it).
# 2: each variant carries its call's slot table (SLOT_ROW rows); a version 1 bundle is refused.
BUNDLE_VERSION = 2


# -- the generated header ----------------------------------------------------------------

def _camel(name: str) -> str:
    return "k" + name[0].upper() + name[1:]


def _list(items) -> str:
    return ", ".join(items)


def header() -> str:
    """csrc/include/lazytriton/contract.h, generated from the definitions above."""
    strs = lambda names: _list(f'"{n}"' for n in names)  # noqa: E731
    ty = lambda names: _list(f"Ty::{_camel(n)}" for n in names)  # noqa: E731
    dtypes = _list(f"{_camel(n)} = {i}" for i, n in enumerate(DTYPES))
    return f"""// Generated by lazytriton/model/contract.py: do not edit (run it to regenerate;
// tests/test_contract.py checks this file is what it generates). The numbers Python
// and C++ share about Triton's contract: element type ids, kernel parameter types,
// slot kinds and type codes of a slot table, constexpr key tags, compile options.
#pragma once
#include <cstdint>

namespace lt {{

// Triton element types, by id (contract.DTYPES).
enum Dtype : int8_t {{ kNoDtype = -1, {dtypes} }};
constexpr int kNumDtypes = {len(DTYPES)};
inline constexpr const char* kDtypeNames[] = {{{strs(DTYPES)}}};
inline constexpr int kDtypeBytes[] = {{{_list(str(dtype_bytes(d)) for d in DTYPES)}}};
inline constexpr bool kDtypeIsFloat[] = {{{_list("true" if is_float_dtype(d) else "false" for d in DTYPES)}}};

// A kernel parameter type as Triton spells it ("i32", "fp16", "u1"), plus pointers and
// host tensor descriptors (contract.PARAM_TYPES).
enum class Ty : uint8_t {{ {_list(_camel(n) for n in PARAM_TYPES)} }};
inline constexpr const char* kTyNames[] = {{{strs(PARAM_TYPES)}}};

// How a slot of a call's slot table is read (contract.SLOT_KINDS).
enum class SlotKind : int {{ {_list(f"{_camel(n)} = {i}" for i, n in enumerate(SLOT_KINDS))} }};
constexpr int kNumSlotKinds = {len(SLOT_KINDS)};
constexpr int kSlotRowFields = {len(SLOT_ROW)};  // {_list(SLOT_ROW)}
// A slot's type code: an annotated int's type, an unannotated int's class, a float's type.
inline constexpr Ty kIntTypes[] = {{{ty(INT_TYPES)}}};
inline constexpr Ty kIntClasses[] = {{{ty(INT_CLASSES)}}};
inline constexpr Ty kFloatTypes[] = {{{ty(FLOAT_TYPES)}}};

// The first of a constexpr's two key words: what the second holds (contract.CONSTEXPR_TAGS).
enum class ConstexprTag : uint64_t {{ {_list(f"{_camel(n)} = {v}" for n, v in CONSTEXPR_TAGS.items())} }};

// Compile options the C++ bundle binder takes as options, not constexprs (contract.CPP_OPTION_NAMES).
inline constexpr const char* kCppOptionNames[] = {{{strs(CPP_OPTION_NAMES)}}};

// The bundle manifest's format version (contract.BUNDLE_VERSION): its variants carry their slot tables.
constexpr int kBundleVersion = {BUNDLE_VERSION};

}}  // namespace lt
"""


if __name__ == "__main__":
    import pathlib

    out = pathlib.Path(__file__).resolve().parents[2] / "csrc" / "include" / "lazytriton" / "contract.h"
    out.write_text(header())
    print(f"wrote {out}")
