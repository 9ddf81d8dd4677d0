"""Generated C++ launch stubs: one per argument shape, built once (plain
CPython API, ~1 s of g++) and cached on disk (lazytriton.runtime.native). A stub
reads the Python arguments with typed C code, computes the call key, and
launches the resolved kernel without Python. While a shape's stub builds (in
the background), the table-driven stub of csrc/python/generic_stub.cc serves
its calls."""
from __future__ import annotations

import logging
import threading
from typing import Callable

from .. import settings
from . import native
from ..model.specialize import Shape, Slot

log = logging.getLogger("lazytriton.runtime.stubgen")


def _node_var(path: tuple) -> str:
    return "t_" + "_".join(map(str, path))


def _item_expr(path: tuple) -> str:
    """The C expression of the object at `path` of the call (its tuples checked first)."""
    if len(path) == 1:
        return f"args[{path[0]}]"
    return f"PyTuple_GET_ITEM({_node_var(path[:-1])}, {path[-1]})"


def _tuple_checks(shape: Shape) -> list[str]:
    """Statements that check every tuple of the call and name it, outermost first."""
    out = []
    for path, n in shape.tuples:
        v = _node_var(path)
        out += [f"PyObject* {v} = {_item_expr(path)};",
                f"if (!PyTuple_CheckExact({v}) || PyTuple_GET_SIZE({v}) != {n}) return false;"]
    return out


def _cbool(b: bool) -> str:
    return "true" if b else "false"


def _arg_code(i: int, s: Slot, value_word: int, path: tuple | None = None) -> tuple[str, list[str], int]:
    """(member declaration, statements reading slot i into a.s{i}, next value word)."""
    bit = f"a.key[{(2 * i) // 64}] |= "
    sh = (2 * i) % 64
    arg = _item_expr(path or (i,))
    out = []
    if s.kind == "ptr":
        member = f"{s.ctype()} s{i};"
        out.append(f"if (!get_pointer({arg}, {s.dtype}, &a.s{i}, &a.devices)) return false;")
        out.append(f"{bit}ptr_bit({_cbool(s.specialize)}, a.s{i}) << {sh};")
    elif s.kind == "int":  # packed and keyed by encode.h's encode_int (an annotated slot takes a bool too)
        member = f"{s.ctype()} s{i};"
        spec = f"{{Ty::k{s.int_type.upper()}, {_cbool(s.annotated)}, {_cbool(s.specialize)}, {_cbool(s.divisibility)}}}"
        out.append(f"if (!read_int({arg}, &iv) || encode_int({spec}, iv, &a.s{i}, &bits) != Fit::kOk) return false;")
        if s.specialize or s.divisibility:
            out.append(f"{bit}bits << {sh};")
        if s.in_key:
            out.append(f"a.key[{value_word}] = iv.bits;")
            value_word += 1
    elif s.kind == "float":
        member = f"{s.ctype()} s{i};"
        read = f"{'get_real' if s.annotated else 'get_float'}({arg}, &d)"
        out.append(f"if (!{read} || encode_float(Ty::k{s.float_type.capitalize()}, d, &a.s{i}) != Fit::kOk) "
                   "return false;")
        if s.in_key:
            out.append(f"std::memcpy(&a.key[{value_word}], &d, 8);")
            value_word += 1
    elif s.kind == "bool":  # tl.int1 (annotated): an int too, as its low byte (Triton's launcher)
        member = f"{s.ctype()} s{i};"
        out.append(f"if (!read_int({arg}, &iv) || encode_flag({_cbool(s.annotated)}, iv, &a.s{i}) != Fit::kOk) "
                   "return false;")
        if s.in_key:
            out.append(f"a.key[{value_word}] = iv.bits;")
            value_word += 1
    elif s.kind == "constexpr":
        member = f"{s.ctype()} s{i};"
        if s.folded:
            out.append(f"if (!is_folded_constexpr({arg})) return false;")
        out.append(f"constexpr_key({arg}, &a.key[{value_word}]);")
        value_word += 2
    elif s.kind == "desc":
        member = f"{s.ctype()} s{i};"
        out.append(f"if (!get_tensor_desc({arg}, {s.dtype}, {s.rank}, &a.s{i}, &a.devices)) return false;")
        for j in range(s.rank):
            out.append(f"a.key[{value_word}] = uint64_t(a.s{i}.block[{j}]);")
            value_word += 1
    else:
        raise ValueError(f"unknown slot kind {s.kind}")
    return member, out, value_word


def generate(shape: Shape, module_name: str) -> str:
    n = len(shape.slots)
    n_args = len(shape.arg_names)
    words = shape.key_words()
    value_word = (2 * n + 63) // 64
    members, body = [], [f"  {line}" for line in _tuple_checks(shape)]
    for i, (s, path) in enumerate(zip(shape.slots, shape.slot_paths())):
        member, lines, value_word = _arg_code(i, s, value_word, path)
        members.append(f"  {member}  // {shape.names[i]}: {s.code()}")
        body += [f"  {line}" for line in lines]
    # The call's pointers, for when its arrays are not all on the current device (python_args.h).
    pointers = [f"a.s{i}" if s.kind == "ptr" else f"a.s{i}.base" for i, s in enumerate(shape.slots)
                if s.kind in ("ptr", "desc")]
    reachable = " && ".join(f"accessible({p})" for p in pointers) or "true"
    pack, n_desc = [], 0
    for i, s in enumerate(shape.slots):
        if s.kind == "desc":  # encoded for the resolved kernel (may throw: inside the try)
            pack.append(f"    DescParams d{n_desc};")
            pack.append(f"    if (e->is_param[{i}]) np += pack_tensor_desc(e->kernel->meta().tensordesc, "
                        f"e->kernel->meta().tensordesc_abi, {n_desc}, a.s{i}, d{n_desc}, params + np, kernel->name(), "
                        f"\"{shape.names[i]}\");")
            n_desc += 1
        else:
            pack.append(f"    if (e->is_param[{i}]) params[np++] = &a.s{i};")
    packed = [f"  PyTuple_SET_ITEM(t, {i}, "
              + ("Py_NewRef(Py_None)" if s.kind == "constexpr" else f"desc_tuple(a.s{i})" if s.kind == "desc" else
                 f"PyBytes_FromStringAndSize(reinterpret_cast<const char*>(&a.s{i}), sizeof(a.s{i}))") + ");"
              for i, s in enumerate(shape.slots)]
    n_params = f"kSlots + 1 + {n_desc} * kMaxDescParams"
    # The call's argument names (a tuple argument is one name): what a grid callable sees.
    names = ", ".join(f'"{nm}"' for nm in shape.arg_names) or '""'
    # Plain CPython API, no pybind11: its headers made a stub's build take ~5 s of g++.
    return f"""// Generated by lazytriton.runtime.stubgen for argument shape {shape.digest()}. Do not edit.
#include <Python.h>

#include <cstring>

#include "stub_protocol.h"

using namespace lt;
using namespace lt::pyargs;

namespace {{
constexpr Py_ssize_t kArgs = {n_args};  // call arguments
constexpr Py_ssize_t kSlots = {n};  // their leaves (a tuple argument has one per element)
constexpr size_t kKeyWords = {words};
constexpr uint64_t kShapeWord = 0x{shape.shape_word():016x}ULL;  // the key's last word
const char* kNames[] = {{{names}}};
PyObject* g_names[kArgs + 1];

// The call's arguments in their kernel parameter types, its call key and the
// devices its arrays are on (array_reads.h fold_device).
struct Args {{
  uint64_t key[kKeyWords] = {{}};
  int devices = kNoArrays;
{chr(10).join(members)}
}};

// False: not this stub's shape (no Python error set).
[[maybe_unused]] bool read(PyObject* const* args, Py_ssize_t n, Args& a) {{
  if (n != kArgs) return false;
  a.key[kKeyWords - 1] = kShapeWord;
  [[maybe_unused]] IntVal iv;
  [[maybe_unused]] uint64_t bits;
  [[maybe_unused]] double d;
{chr(10).join(body)}
  return true;
}}

// Whether the call's arrays may be handed to a kernel on `device` (python_args.h launch_context):
// all there, else each pointer accessible from it.
[[maybe_unused]] bool arrays_here(const Args& a, int device) {{
  return a.devices == kNoArrays || a.devices == device || ({reachable});
}}

// The C entry (stub_protocol.h StubEntry): what the launcher calls.
StubResult launch_c(const void*, ResolveTable* kernel, PyObject* grid, cu::CUstream stream, PyObject* const* args,
                    Py_ssize_t n, PyObject** key) {{
  Args a;
  if (!read(args, n, a)) return StubResult::kOtherShape;
  cu::CUcontext ctx = nullptr;
  int device = -1;
  // Arrays the current device cannot read: not this stub's call (before its key is resolved, so that
  // no tuning trial runs on them either); Python then refuses it, naming the argument.
  if (a.devices != kNoArrays && (ctx = launch_context(&device)) && !arrays_here(a, device))
    return StubResult::kOtherShape;
  const Entry* e = kernel->find(a.key, kKeyWords);
  if (!e) return (*key = key_tuple(a.key, kKeyWords)) ? StubResult::kUnresolved : StubResult::kError;
  Dim3 g;
  if (!eval_grid(grid, *e, g_names, args, kArgs, &g, kernel->name().c_str())) return StubResult::kError;
  try {{
    void* params[{n_params}];
    size_t np = 0;
{chr(10).join(pack)}
    if (ctx) e->kernel->launch(ctx, stream, g, params, np);
    else e->kernel->launch(stream, g, params, np);
  }} catch (const std::exception& ex) {{
    raise(ex, kernel->name().c_str());
    return StubResult::kError;
  }}
  return StubResult::kLaunched;
}}

const StubEntry kEntry = {{launch_c, nullptr}};

// launch(handle, grid, stream, args) -> True (launched), a key tuple
// (unresolved: resolve it and call again) or None (not this stub's shape).
PyObject* launch(PyObject*, PyObject* const* argv, Py_ssize_t argc) {{ return launch_from_python(kEntry, argv, argc); }}

// key(args) -> the call key tuple, or None (not this stub's shape).
PyObject* key(PyObject*, PyObject* args) {{
  PyObject* const* items;
  Py_ssize_t n;
  Args a;
  call_items(args, &items, &n);
  if (!read(items, n, a)) Py_RETURN_NONE;
  return key_tuple(a.key, kKeyWords);
}}

// params(args) -> per slot (leaf), the bytes the stub passes to the kernel (None for
// a constexpr slot), or None (not this stub's shape). For tests: no GPU needed.
PyObject* params(PyObject*, PyObject* args) {{
  PyObject* const* items;
  Py_ssize_t n;
  Args a;
  call_items(args, &items, &n);
  if (!read(items, n, a)) Py_RETURN_NONE;
  PyObject* t = PyTuple_New(kSlots);
  if (!t) return nullptr;
{chr(10).join(packed)}
  for (Py_ssize_t i = 0; i < kSlots; ++i)
    if (!PyTuple_GET_ITEM(t, i)) return Py_DECREF(t), nullptr;
  return t;
}}

PyMethodDef kLaunchDef = {{"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(launch)), METH_FASTCALL,
                          "Launch through this stub."}};
PyMethodDef kKeyDef = {{"key", key, METH_O, "The call key of these arguments."}};
PyMethodDef kParamsDef = {{"params", params, METH_O, "The kernel parameter bytes of these arguments."}};

PyModuleDef kModule = {{PyModuleDef_HEAD_INIT, "{module_name}", "lazytriton launch stub", -1, nullptr}};

bool add(PyObject* m, const char* name, PyObject* value) {{
  if (!value) return false;
  int r = PyModule_AddObjectRef(m, name, value);
  Py_DECREF(value);
  return r == 0;
}}
}}  // namespace

PyMODINIT_FUNC PyInit_{module_name}() {{
  for (Py_ssize_t i = 0; i < kArgs; ++i) g_names[i] = PyUnicode_InternFromString(kNames[i]);
  PyObject* m = PyModule_Create(&kModule);
  if (!m) return nullptr;
  if (!add(m, "launch", PyCFunction_New(&kLaunchDef, nullptr)) || !add(m, "key", PyCFunction_New(&kKeyDef, nullptr)) ||
      !add(m, "params", PyCFunction_New(&kParamsDef, nullptr)) ||
      !add(m, "entry", PyCapsule_New(const_cast<StubEntry*>(&kEntry), kStubEntryCapsule, nullptr)) ||
      PyModule_AddIntConstant(m, "key_words", long(kKeyWords)) < 0) {{
    Py_DECREF(m);
    return nullptr;
  }}
  return m;
}}
"""


def load_stub(shape: Shape, background: bool = False, kernel: str | None = None):
    """The built stub module for `shape`, building it on first use (blocking;
    `background`: the compiler runs at a lower CPU priority). `kernel` names the
    kernel whose call needs it in what is logged about the stub."""
    name = f"lt_stub_{shape.digest()}"
    what = f"launch stub {name} for ({', '.join(shape.names)})"
    return native.load_module(name, lambda: generate(shape, name), f"kernel {kernel}: {what}" if kernel else what,
                       background=background)


_generic: dict[str, object] = {}
_building: dict[str, threading.Thread] = {}
_lock = threading.Lock()  # guards _building


def generic_stub(shape: Shape):
    """The table-driven stub for `shape` (csrc/python/generic_stub.cc): same
    interface and bytes as the generated one, no compiler."""
    from .. import _generic_stub

    d = shape.digest()
    stub = _generic.get(d)
    if stub is None:
        layout = () if shape.flat else (shape.args, shape.paths, shape.tuples)
        stub = _generic.setdefault(d, _generic_stub.Stub(shape.names, shape.table(), shape.key_words(),
                                                         shape.shape_word(), *layout))
    return stub


def stub_now(shape: Shape, on_built: Callable[[object], None] | None = None, kernel: str | None = None):
    """The stub for `shape` without waiting for a compiler: the generated one if
    it is loaded or on disk, else the table-driven one, while the generated one
    builds on a background thread; `on_built(module)` is then called with it
    (on that thread). LAZYTRITON_STUB_BUILD=sync builds in the caller instead;
    =off never builds (the table-driven stub serves every call: no C++ compiler needed)."""
    mode = settings.stub_build()
    if mode == "off":
        return generic_stub(shape)
    name = f"lt_stub_{shape.digest()}"
    module = native.loaded(name)
    if module is not None:
        return module
    if mode == "sync" or native.built_and_intact(name):
        return load_stub(shape, kernel=kernel)

    def build():
        try:
            built = load_stub(shape, background=True, kernel=kernel)
        except Exception as exc:  # the table-driven stub goes on serving these calls
            if not native.exiting():
                log.warning("%s; calls of this shape keep the table-driven stub", exc)
            return
        finally:
            with _lock:
                _building.pop(name, None)
        if on_built is not None:
            on_built(built)

    with _lock:
        if name not in _building:
            t = _building[name] = threading.Thread(target=build, name=f"lazytriton-stub-{name}", daemon=True)
            t.start()
    return generic_stub(shape)


def stub_if_built(shape: Shape, kernel: str | None = None):
    """The generated stub for `shape` if it is loaded or on disk, else the
    table-driven one; never starts a compiler (for callers that only need the
    call key, e.g. the JAX handler's first execution)."""
    name = f"lt_stub_{shape.digest()}"
    module = native.loaded(name)
    if module is not None:
        return module
    if native.built_and_intact(name):
        return load_stub(shape, kernel=kernel)
    return generic_stub(shape)


def wait_for_builds(timeout: float | None = None) -> None:
    """Waits for the background stub builds under way (tests, benchmarks)."""
    with _lock:
        threads = list(_building.values())
    for t in threads:
        t.join(timeout)
