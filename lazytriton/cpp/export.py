"""Typed C++ launch functions for one kernel signature (`lazytriton export-cpp`).

For `kernels:add_kernel` with signature "*fp32,*fp32,*fp32,i32" and BLOCK=1024
this writes launch_add_kernel.h/.cc declaring

    void launch_add_kernel(lt::Stream stream, lt::Dim3 grid,
                           lt::DevicePtr x, lt::DevicePtr y, lt::DevicePtr out, int32_t n);

(and overloads taking a grid function or an explicit lt::BundleKernel), so C++
code launches with typed, checked arguments instead of packing void* arrays.
The functions go through lt::BundleKernel: the same winner selection and the
same launch path as any other C++ call.
"""
from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path
from typing import Any

from . import bundle
from ..model import tuples
from ..model.spec import kernel_spec
from ..model.arrays import DTYPE_IDS, DTYPES
from ..model.specialize import BUNDLE_OPTION_NAMES, CTYPES, FLOAT_TYPES, INT_CLASSES, INT_TYPES, check_option

# The C++ type a typed stub takes each scalar as: an integer as packed; tl.int1 as bool;
# half-precision floats as double: converted once, from the double, as Triton's launcher
# converts them (through float they could round twice).
CPP_TYPES = {**{t: CTYPES[t] for t in INT_TYPES}, "u1": "bool", "fp32": "float", "fp64": "double",
             "fp16": "double", "bf16": "double"}
_CPP_KEYWORDS = set("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield
decltype default delete do double dynamic_cast else enum explicit export extern false float for friend goto if
inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq""".split())
_OWN_NAMES = {"stream", "grid", "kernel", "bundle", "lt", "std"}  # the stub's own parameters


def _cpp_name(name: str) -> str:
    return name + "_" if name in _CPP_KEYWORDS or name in _OWN_NAMES else name


def cpp_literal(value: Any) -> str:
    if value is None:
        return "nullptr"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and -2**63 <= value < 2**63:
        return f"int64_t{{{value}}}"
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else _unsupported(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return _unsupported(value)


def _unsupported(value: Any) -> str:
    raise ValueError(f"constexpr value {value!r} cannot be written as a C++ constant")


_DESC_TYPE = re.compile(r"tensordesc<(\w+)\[\s*\d+(?:\s*,\s*\d+)*\s*\]>")


def runtime_params(desc: dict, signature: str, constexprs: dict) -> list[tuple[str, str]]:
    """(name, type) of each runtime argument, checked against the kernel."""
    name = desc["name"]
    types = tuples.split_top(signature)  # a tuple argument is one entry, "[*fp32,[i32,fp32]]"
    names = {p["name"] for p in desc["params"]}
    defaults = {p["name"]: p.get("default") for p in desc["params"]}
    for k, v in constexprs.items():
        if k in desc.get("overwritten", ()):  # its heuristic overwrites it (Triton's Heuristics.run)
            continue
        if k in desc["supplied"]:
            raise ValueError(f"kernel {name}: {k} is chosen by its autotune configs or heuristics; do not pass it")
        if k not in names and k not in BUNDLE_OPTION_NAMES:
            raise ValueError(f"kernel {name}: no parameter named {k!r} (parameters: {', '.join(sorted(names))})")
        if k in BUNDLE_OPTION_NAMES and k not in names:
            check_option(k, v, f"kernel {name}")
        elif isinstance(v, Word) and not isinstance(defaults.get(k), str):
            raise ValueError(f"kernel {name}: --constexpr {k}={v}: {v} is not a number, True, False or None; a "
                             f"string is quoted (--constexpr \"{k}='{v}'\")")
    runtime = [p for p in desc["params"] if not p["constexpr"] and p["name"] not in constexprs]
    for p in desc["params"]:
        if p["constexpr"] and p["name"] not in constexprs and "default" not in p:
            raise ValueError(f"kernel {name}: constexpr {p['name']} needs a value (--constexpr {p['name']}=...)")
    if len(types) != len(runtime):
        raise ValueError(f"kernel {name}: the signature {signature!r} has {len(types)} types but the kernel takes "
                         f"{len(runtime)} runtime arguments ({', '.join(p['name'] for p in runtime)})")
    out = []
    for p, entry in zip(runtime, types):
        # A tuple argument: one C++ parameter per element, in order (xs[1][0] -> xs_1_0).
        for sub, t in tuples.leaves(tuples.parse_type(entry)):
            leaf = tuples.leaf_name(p["name"], sub)
            desc_type = _DESC_TYPE.fullmatch(t)
            if not (t.startswith("*") or t in CPP_TYPES or desc_type):
                raise ValueError(f"kernel {name}, argument {leaf}: unknown type {t!r} in the signature")
            # As the C++ binder (csrc/embed/bundle_kernel.cc) would refuse it at the first launch.
            element = t[1:] if t.startswith("*") else desc_type.group(1) if desc_type else None
            if element is not None and element not in DTYPE_IDS:
                raise ValueError(f"kernel {name}, argument {leaf}: unknown element type in {t!r} (a Triton dtype: "
                                 f"{', '.join(DTYPES[:13])}, ...)")
            if sub and p["annotation"]:
                raise ValueError(f"kernel {name}, argument {p['name']}: annotated {p['annotation']}, not a tuple")
            if t in CPP_TYPES:
                _check_scalar(name, leaf, t, "" if sub else p["annotation"])
            out.append((p["name"] + "".join(f"_{i}" for i in sub), t))
    return out


def _check_scalar(name: str, leaf: str, t: str, annotation: str) -> None:
    """A scalar's type in the signature, as Triton types its value (bundle_kernel.cc checks the same)."""
    if annotation and annotation != t:
        raise ValueError(f"kernel {name}, argument {leaf}: annotated {annotation} in the kernel, but the signature "
                         f"says {t}")
    if not annotation and t in INT_TYPES and t not in INT_CLASSES:
        raise ValueError(f"kernel {name}, argument {leaf}: an unannotated int is i32, i64 or u64 (Triton's class of "
                         f"its value), not {t}")
    if not annotation and t in FLOAT_TYPES and t != "fp32":
        raise ValueError(f"kernel {name}, argument {leaf}: an unannotated float is passed as fp32, not {t}")


_ADDRESS_OPS = {"load", "store", "make_block_ptr", "make_tensor_descriptor", "atomic_add", "atomic_and",
                "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_xchg", "atomic_xor"}
_ADDRESS_KEYWORDS = ("pointer", "base")
_HINTS = {"multiple_of", "max_contiguous", "max_constancy"}  # return their first argument


def check_addresses(kernel_src: str, desc: dict, params: list[tuple[str, str]]) -> None:
    """Refuses a signature that declares a scalar where the kernel computes an
    address (tl.load/tl.store/atomics/block pointers) from runtime arguments
    none of which is declared a pointer: e.g. "*fp32,*fp32,*fp32,i32" for a
    kernel (x, y, n, out), which would compile `out` as an int and `n` as a pointer."""
    types = dict(params)
    tree = ast.parse(kernel_src)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assigned: dict[str, list[ast.expr]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    assigned.setdefault(t.id, []).append(node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) and node.value:
            assigned.setdefault(node.target.id, []).append(node.value)

    def bases(e: ast.expr, seen: frozenset = frozenset()) -> set[str]:
        """The runtime arguments an address expression is built from (through + and -)."""
        if isinstance(e, ast.Name):
            if e.id in types:
                return {e.id}
            if e.id in seen:
                return set()
            return set().union(*(bases(v, seen | {e.id}) for v in assigned.get(e.id, [])))
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
            return bases(e.left, seen) | bases(e.right, seen)
        if isinstance(e, ast.IfExp):
            return bases(e.body, seen) | bases(e.orelse, seen)
        if isinstance(e, ast.Call) and _callee(e) in _HINTS and e.args:
            return bases(e.args[0], seen)
        return set()

    for call in ast.walk(fn):
        if not isinstance(call, ast.Call) or _callee(call) not in _ADDRESS_OPS:
            continue
        addr = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in _ADDRESS_KEYWORDS),
                                                   None)
        found = bases(addr) if addr is not None else set()
        if found and not any(types[a].startswith(("*", "tensordesc")) for a in found):
            declared = ", ".join(f"{n}: {t}" for n, t in params)
            unused = [n for n, t in params if t.startswith("*") and n not in _all_bases(fn, bases)]
            also = f"; {', '.join(unused)} declared a pointer but never used as an address" if unused else ""
            raise ValueError(f"kernel {desc['name']}: the signature does not fit the kernel: "
                             f"{', '.join(sorted(found))} declared {', '.join(types[a] for a in sorted(found))} "
                             f"but the kernel uses it as an address ({ast.unparse(call)[:80]}){also}. The signature "
                             f"gives its runtime arguments in order ({declared}): check the order of the types")


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _all_bases(fn, bases) -> set[str]:
    out: set[str] = set()
    for call in ast.walk(fn):
        if isinstance(call, ast.Call) and _callee(call) in _ADDRESS_OPS and call.args:
            out |= bases(call.args[0])
    return out


def _cpp_type(t: str) -> str:
    if t.startswith("*"):
        return "lt::DevicePtr"
    if t.startswith("tensordesc"):
        return "const lt::TensorDesc&"  # encoded into a CUtensorMap on every launch
    return CPP_TYPES[t]


def generate(desc: dict, signature: str, constexprs: dict, function: str | None = None) -> tuple[str, str, str]:
    """(header file name, header text, source text)."""
    function = function or f"launch_{desc['name']}"
    if not re.fullmatch(r"[A-Za-z_]\w*", function):
        raise ValueError(f"{function!r} is not a C++ function name")
    params = runtime_params(desc, signature, constexprs)
    # A value its heuristic overwrites is not the launch's: left out of the C++ constexprs.
    constexprs = {k: v for k, v in constexprs.items() if k not in desc.get("overwritten", ())}
    decl = [f"{_cpp_type(t)} {_cpp_name(n)}" for n, t in params]
    args = ", ".join(_cpp_name(n) for n, _ in params)
    plist = "".join(f", {d}" for d in decl)
    doc = ", ".join(f"{n}: {t}" for n, t in params)
    cx = ", ".join(f"{k}={v!r}" for k, v in sorted(constexprs.items())) or "none"
    cx_init = ", ".join(f'{{"{k}", {cpp_literal(v)}}}' for k, v in sorted(constexprs.items()))
    header = f"""// Generated by `lazytriton export-cpp` for {desc['source']}. Do not edit.
// kernel {desc['name']}({doc}); constexprs: {cx}
#pragma once
#include <lazytriton/bundle.h>

// The kernel in `bundle`, for this signature (its winners, lt::BundleKernel::winner()).
lt::BundleKernel {function}_handle(const lt::Bundle& bundle);

// Launch on lt::Bundle::default_bundle() (set_default(), else $LAZYTRITON_BUNDLE, else the cache's).
void {function}(lt::Stream stream, lt::Dim3 grid{plist});
void {function}(lt::Stream stream, const lt::GridFn& grid{plist});

// Launch through a handle from {function}_handle().
void {function}(const lt::BundleKernel& kernel, lt::Stream stream, lt::Dim3 grid{plist});
void {function}(const lt::BundleKernel& kernel, lt::Stream stream, const lt::GridFn& grid{plist});
"""
    source = f"""// Generated by `lazytriton export-cpp` for {desc['source']}. Do not edit.
#include "{function}.h"

namespace {{
const char* const kSource = "{desc['source']}";
const char* const kSignature = "{','.join(tuples.split_top(signature))}";

const lt::Constants& constexprs() {{
  static const lt::Constants c = {{{cx_init}}};
  return c;
}}

// Bound to the default bundle on first use (a failed first use is retried).
const lt::BundleKernel& default_kernel() {{
  static const lt::BundleKernel k = lt::Bundle::default_bundle().kernel(kSource, kSignature, constexprs());
  return k;
}}
}}  // namespace

lt::BundleKernel {function}_handle(const lt::Bundle& bundle) {{ return bundle.kernel(kSource, kSignature, constexprs()); }}

void {function}(const lt::BundleKernel& kernel, lt::Stream stream, lt::Dim3 grid{plist}) {{
  kernel.launch(stream, grid, {{{args}}});
}}

void {function}(const lt::BundleKernel& kernel, lt::Stream stream, const lt::GridFn& grid{plist}) {{
  kernel.launch(stream, grid, {{{args}}});
}}

void {function}(lt::Stream stream, lt::Dim3 grid{plist}) {{
  default_kernel().launch(stream, grid, {{{args}}});
}}

void {function}(lt::Stream stream, const lt::GridFn& grid{plist}) {{
  default_kernel().launch(stream, grid, {{{args}}});
}}
"""
    return f"{function}.h", header, source


def _check_kernel_name(kernel: str) -> None:
    """A module name as Python imports it (importlib's own words for a path are about packages)."""
    module = kernel.partition(":")[0]
    if module and not all(part.isidentifier() for part in module.split(".")):
        where, stem = os.path.split(module[:-3] if module.endswith(".py") else module)
        hint = (f": to import {stem} from {where}, give `--path {where} {stem}:{kernel.partition(':')[2]}`"
                if where and stem.isidentifier() else "")
        raise ValueError(f"kernel {kernel!r}: {module!r} is not a module name (module:function, as in "
                         f"my_kernels:add_kernel){hint}")


def export(kernel: str, signature: str, constexprs: dict | None = None, out_dir: str | Path = ".",
           function: str | None = None, python_path: list[str] | tuple = ()) -> list[Path]:
    """Writes <function>.h and <function>.cc for `kernel` ("module:function")
    into out_dir; returns their paths."""
    _check_kernel_name(kernel)
    for p in python_path:
        if not os.path.isdir(p):
            raise ValueError(f"--path {p}: no such directory")
    for p in reversed(list(python_path)):
        if p not in sys.path:
            sys.path.insert(0, p)
    if os.getcwd() not in sys.path:  # as `python -m` does: the kernel's module may be in the current directory
        sys.path.append(os.getcwd())
    try:
        obj = bundle.load_source(kernel)
    except ImportError as exc:
        raise ImportError(f"{exc.args[0].split('; put')[0]}; searched --path {list(python_path) or '(none given)'}, "
                          f"the current directory {os.getcwd()} and sys.path: give the module's directory with "
                          "--path DIR") from exc
    desc = bundle.describe(obj, kernel)
    constexprs = dict(constexprs or {})
    check_addresses(kernel_spec(obj).fn.src, desc, runtime_params(desc, signature, constexprs))
    hname, header, source = generate(desc, signature, constexprs, function)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    h, cc = out / hname, out / (hname[:-2] + ".cc")
    h.write_text(header)
    cc.write_text(source)
    return [h, cc]


class Word(str):
    """A --constexpr value that is no Python literal (BLOCK=abc): taken as a string only for a
    constexpr whose default is a string (runtime_params), else refused."""


def parse_constexpr(text: str) -> tuple[str, Any]:
    """NAME=VALUE with VALUE a Python literal (1024, 2.5, True, None, 'x'); else a Word."""

    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--constexpr {text!r}: expected NAME=VALUE")
    try:
        return name.strip(), ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        return name.strip(), Word(value.strip())


def cli_main(args) -> int:
    try:
        constexprs = dict(parse_constexpr(c) for c in args.constexpr)
        files = export(args.kernel, args.signature, constexprs, args.out_dir, args.function, args.path)
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # --out-dir cannot be made or written
        print(f"error: cannot write the launch functions into --out-dir {args.out_dir}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    for f in files:
        print(f)
    return 0
