// lazytriton._generic_stub: the launch stub of any argument shape, read from a
// table at run time instead of generated and compiled per shape. It serves a
// shape's first calls while its generated stub (lazytriton.runtime.stubgen) builds in
// the background, so no compiler runs on the critical path of a first call.
// Same interface and same bytes as a generated stub: its C entry (`entry`,
// stub_protocol.h StubEntry), launch(handle, grid, stream, args), key(args),
// params(args), key_words; the generated stub stays the steady-state path
// (straight-line code, no table walk).
//
// Slot table (built by specialize.Shape.table(), one tuple per argument):
//   (kind, dtype, int_code, annotated, specialize, in_key, divisibility, float_code)
//   kind: 0 ptr, 1 int, 2 float, 3 bool, 4 constexpr, 5 host tensor descriptor,
//         6 constexpr folded from the value (takes only None, a tl.constexpr, a @jit function)
//   int_code: unannotated, the class (0 i32, 1 i64, 2 u64); annotated, the type
//             (0 i8, 1 i16, 2 i32, 3 i64, 4 u8, 5 u16, 6 u32, 7 u64); a descriptor's rank
//   float_code: 0 fp16, 1 bf16, 2 fp32, 3 fp64
// Values are packed and keyed by encode.h, as in the generated stubs and the C++ bundles.
// Tuple arguments (lazytriton.model.tuples): Stub(..., arg_names, paths, tuples)
// reads slot i at paths[i] (argument index, then element indices) after
// checking every (path, length) of `tuples` is a tuple of that length; the
// grid callable sees the arg_names. Without them, slot i is argument i.
// Plain CPython API (no pybind11), like the generated stubs.
//
// A launch allocates nothing: a call's values live on the stack in arrays of
// fixed size (kMaxSlots, kMaxKeyWords, kMaxDescs), and Stub() refuses a table
// that would not fit them. The stack, not buffers kept in the stub, because a
// launch runs Python (data_ptr(), a grid callable) during which another thread
// or a nested launch may enter the same stub.
#include <Python.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "stub_protocol.h"

using namespace lt;
using namespace lt::pyargs;

namespace {

enum Kind { kPtr = 0, kInt = 1, kFloat = 2, kBool = 3, kConstexpr = 4, kDesc = 5, kFolded = 6 };

// Bounds of one call's stack storage. 512 slots: CUDA's classic 4 KB of kernel
// parameters holds 512 8-byte ones; a key word per slot, two for a constexpr,
// a descriptor's rank for a descriptor.
constexpr Py_ssize_t kMaxSlots = 512;
constexpr size_t kMaxDescs = 16;
constexpr size_t kMaxKeyWords = (2 * kMaxSlots + 63) / 64 + 2 * kMaxSlots + kMaxDescs * kMaxDescRank + 1;

const Ty kClassTypes[] = {Ty::kI32, Ty::kI64, Ty::kU64};  // specialize.INT_CLASSES
// specialize._FIXED_CODES
const Ty kFixedTypes[] = {Ty::kI8, Ty::kI16, Ty::kI32, Ty::kI64, Ty::kU8, Ty::kU16, Ty::kU32, Ty::kU64};
const Ty kFloatTypes[] = {Ty::kFp16, Ty::kBf16, Ty::kFp32, Ty::kFp64};  // specialize._FLOAT_CODES

struct SlotSpec {
  int kind, dtype, rank;
  bool annotated, specialize, in_key;
  IntSpec int_spec;  // ints: how encode_int packs them
  Ty ty;  // ints and floats: the parameter type
  size_t size;  // bytes of the kernel parameter
};

using Path = std::vector<Py_ssize_t>;

struct Layout {  // tuple arguments: where each slot is, and the tuples to check
  std::vector<Path> paths;  // per slot
  std::vector<std::pair<Path, Py_ssize_t>> tuples;  // outermost first
};

struct Stub {
  PyObject_HEAD
  StubEntry entry;  // {stub_launch, this}
  std::vector<SlotSpec>* slots;
  std::vector<std::string>* slot_names;  // per slot (a tuple's leaf: "xs[1]")
  PyObject** names;  // interned argument names, for grid callables
  Py_ssize_t n;  // slots
  Py_ssize_t n_args;  // call arguments (n unless there are tuple arguments)
  Layout* layout;  // nullptr: slot i is argument i
  size_t key_words;
  uint64_t shape_word;
};

// The object at `path` of the call; its enclosing tuples were checked.
PyObject* item_at(PyObject* const* args, const Path& path) {
  PyObject* o = args[path[0]];
  for (size_t d = 1; d < path.size(); ++d) o = PyTuple_GET_ITEM(o, path[d]);
  return o;
}

bool tuples_match(const Layout& l, PyObject* const* args) {
  for (const auto& [path, len] : l.tuples) {
    PyObject* t = item_at(args, path);
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != len) return false;
  }
  return true;
}

// A descriptor's storage, left uninitialized until read() fills it: a call
// zeroes only what it uses.
union DescCell {
  DescCell() {}
  HostTensorDesc d;
};

// One call's values, on the stack: 8 bytes per argument (a parameter reads
// its low bytes, little-endian), the descriptors (in argument order), the key
// and the devices its arrays are on (array_reads.h fold_device).
struct Read {
  uint64_t key[kMaxKeyWords];
  uint64_t cell[kMaxSlots];
  DescCell descs[kMaxDescs];
  size_t n_desc = 0;
  int devices = kNoArrays;
};

// False: not this shape (no Python error set). The generated stub reads the same
// way (stubgen._arg_code); both pack through encode.h.
bool read(const Stub* s, PyObject* const* args, Py_ssize_t n, Read& r) {
  if (!s->slots || n != s->n_args) return false;
  if (s->layout && !tuples_match(*s->layout, args)) return false;
  std::fill_n(r.key, s->key_words, 0);
  std::fill_n(r.cell, s->n, 0);
  r.n_desc = 0;
  r.devices = kNoArrays;
  r.key[s->key_words - 1] = s->shape_word;
  size_t vw = (2 * size_t(s->n) + 63) / 64;
  for (Py_ssize_t i = 0; i < s->n; ++i) {
    const SlotSpec& sl = (*s->slots)[size_t(i)];
    PyObject* arg = s->layout ? item_at(args, s->layout->paths[size_t(i)]) : args[i];
    uint64_t& key_bits = r.key[size_t(2 * i) / 64];
    const int sh = int((2 * i) % 64);
    uint64_t* cell = &r.cell[size_t(i)];
    IntVal iv;
    double d = 0;
    switch (sl.kind) {
      case kPtr:
        if (!get_pointer(arg, sl.dtype, cell, &r.devices)) return false;
        key_bits |= ptr_bit(sl.specialize, *cell) << sh;
        break;
      case kInt: {
        uint64_t bits;
        if (!read_int(arg, &iv) || encode_int(sl.int_spec, iv, cell, &bits) != Fit::kOk) return false;
        key_bits |= bits << sh;
        if (sl.in_key) r.key[vw++] = iv.bits;
        break;
      }
      case kFloat:
        if (!(sl.annotated ? get_real(arg, &d) : get_float(arg, &d)) || encode_float(sl.ty, d, cell) != Fit::kOk)
          return false;
        if (sl.in_key) std::memcpy(&r.key[vw++], &d, 8);
        break;
      case kBool:
        if (!read_int(arg, &iv) || encode_flag(sl.annotated, iv, cell) != Fit::kOk) return false;
        if (sl.in_key) r.key[vw++] = iv.bits;
        break;
      case kDesc: {  // the block shape is the key: it is the kernel's type
        HostTensorDesc& desc = r.descs[r.n_desc++].d;
        desc = HostTensorDesc{};
        if (!get_tensor_desc(arg, sl.dtype, sl.rank, &desc, &r.devices)) return false;
        for (int j = 0; j < desc.rank; ++j) r.key[vw++] = uint64_t(desc.block[j]);
        break;
      }
      case kFolded:  // an array or a number here is another shape
        if (!is_folded_constexpr(arg)) return false;
        [[fallthrough]];
      default:  // constexpr
        constexpr_key(arg, &r.key[vw]);
        vw += 2;
    }
  }
  return true;
}

// Whether the call's arrays may be handed to a kernel on `device` (python_args.h launch_context):
// all there, else each pointer accessible from it.
bool arrays_here(const Stub* s, const Read& r, int device) {
  if (r.devices == kNoArrays || r.devices == device) return true;
  size_t k = 0;
  for (Py_ssize_t i = 0; i < s->n; ++i) {
    int kind = (*s->slots)[size_t(i)].kind;
    if (kind == kPtr && !accessible(r.cell[size_t(i)])) return false;
    if (kind == kDesc && !accessible(r.descs[k++].d.base)) return false;
  }
  return true;
}

// The C entry (stub_protocol.h StubEntry): what the launcher calls.
StubResult stub_launch(const void* self, ResolveTable* kernel, PyObject* grid, cu::CUstream stream,
                       PyObject* const* args, Py_ssize_t n, PyObject** key) {
  auto* s = static_cast<const Stub*>(self);
  Read r;
  if (!read(s, args, n, r)) return StubResult::kOtherShape;
  cu::CUcontext ctx = nullptr;
  int device = -1;
  // Arrays the current device cannot read: not this stub's call (before its key is resolved, so that
  // no tuning trial runs on them either); Python then refuses it, naming the argument.
  if (r.devices != kNoArrays && (ctx = launch_context(&device)) && !arrays_here(s, r, device))
    return StubResult::kOtherShape;
  const Entry* e = kernel->find(r.key, s->key_words);
  if (!e) return (*key = key_tuple(r.key, s->key_words)) ? StubResult::kUnresolved : StubResult::kError;
  Dim3 g;
  if (!eval_grid(grid, *e, s->names, args, s->n_args, &g, kernel->name().c_str())) return StubResult::kError;
  try {
    void* params[kMaxSlots + kMaxDescs * kMaxDescParams];
    DescParams packed[kMaxDescs];  // uninitialized: packing writes what it passes
    const LaunchMeta& m = e->kernel->meta();
    size_t np = 0, k = 0;
    for (Py_ssize_t i = 0; i < s->n; ++i) {
      if (!e->is_param[size_t(i)]) continue;
      if ((*s->slots)[size_t(i)].kind == kDesc) {
        np += pack_tensor_desc(m.tensordesc, m.tensordesc_abi, k, r.descs[k].d, packed[k], &params[np],
                               kernel->name(), (*s->slot_names)[size_t(i)].c_str());
        ++k;
      } else {
        params[np++] = &r.cell[size_t(i)];
      }
    }
    if (ctx) e->kernel->launch(ctx, stream, g, params, np);
    else e->kernel->launch(stream, g, params, np);
  } catch (const std::exception& ex) {
    raise(ex, kernel->name().c_str());
    return StubResult::kError;
  }
  return StubResult::kLaunched;
}

PyObject* stub_launch_py(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
  return launch_from_python(reinterpret_cast<Stub*>(self)->entry, argv, argc);
}

PyObject* stub_key(PyObject* self, PyObject* args) {
  auto* s = reinterpret_cast<Stub*>(self);
  PyObject* const* items;
  Py_ssize_t n;
  Read r;
  call_items(args, &items, &n);
  if (!read(s, items, n, r)) Py_RETURN_NONE;
  return key_tuple(r.key, s->key_words);
}

PyObject* stub_params(PyObject* self, PyObject* args) {
  auto* s = reinterpret_cast<Stub*>(self);
  PyObject* const* items;
  Py_ssize_t n;
  Read r;
  call_items(args, &items, &n);
  if (!read(s, items, n, r)) Py_RETURN_NONE;
  PyObject* t = PyTuple_New(s->n);
  if (!t) return nullptr;
  size_t k = 0;
  for (Py_ssize_t i = 0; i < s->n; ++i) {
    const SlotSpec& sl = (*s->slots)[size_t(i)];
    const char* bytes = reinterpret_cast<const char*>(&r.cell[size_t(i)]);
    PyObject* item = sl.kind == kConstexpr || sl.kind == kFolded ? Py_NewRef(Py_None)
                     : sl.kind == kDesc ? desc_tuple(r.descs[k++].d)
                                        : PyBytes_FromStringAndSize(bytes, Py_ssize_t(sl.size));
    if (!item) return Py_DECREF(t), nullptr;
    PyTuple_SET_ITEM(t, i, item);
  }
  return t;
}

// A path from a tuple of ints; false with an error set.
bool path_from(PyObject* o, Path* out) {
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) < 1) {
    PyErr_SetString(PyExc_ValueError, "Stub: a path is a non-empty tuple of ints");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i) {
    Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(o, i));
    if (v < 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Stub: a path index is negative");
      return false;
    }
    out->push_back(v);
  }
  return true;
}

// The tuple layout of Stub(..., arg_names, paths, tuples): nullptr with an error set.
// Each path must stay inside the tuples declared before it (checked here, so
// that read() may index without bounds checks).
Layout* layout_from(PyObject* paths, PyObject* tuples, Py_ssize_t n, Py_ssize_t n_args) {
  auto l = std::make_unique<Layout>();
  if (!PyTuple_Check(paths) || !PyTuple_Check(tuples) || PyTuple_GET_SIZE(paths) != n) {
    PyErr_SetString(PyExc_ValueError, "Stub: paths (one per slot) and tuples must be tuples");
    return nullptr;
  }
  auto inside = [&](const Path& p, size_t declared) {  // p's prefixes are declared tuples of fitting length
    if (p[0] >= n_args) return false;
    for (size_t depth = 1; depth < p.size(); ++depth) {
      bool ok = false;
      for (size_t k = 0; k < declared && !ok; ++k) {
        const auto& [tp, len] = l->tuples[k];
        ok = tp.size() == depth && std::equal(tp.begin(), tp.end(), p.begin()) && p[depth] < len;
      }
      if (!ok) return false;
    }
    return true;
  };
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuples); ++i) {
    PyObject* row = PyTuple_GET_ITEM(tuples, i);
    Path p;
    Py_ssize_t len;
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 2 || !path_from(PyTuple_GET_ITEM(row, 0), &p) ||
        (len = PyLong_AsSsize_t(PyTuple_GET_ITEM(row, 1))) < 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Stub: a tuples row is (path, length)");
      return nullptr;
    }
    if (!inside(p, l->tuples.size())) {
      PyErr_SetString(PyExc_ValueError, "Stub: a tuple's path is not inside the tuples declared before it");
      return nullptr;
    }
    l->tuples.emplace_back(std::move(p), len);
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    Path p;
    if (!path_from(PyTuple_GET_ITEM(paths, i), &p)) return nullptr;
    if (!inside(p, l->tuples.size())) {
      PyErr_SetString(PyExc_ValueError, "Stub: a slot's path is not inside the declared tuples");
      return nullptr;
    }
    l->paths.push_back(std::move(p));
  }
  return l.release();
}

int stub_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* s = reinterpret_cast<Stub*>(self);
  PyObject *names, *table, *arg_names = nullptr, *paths = nullptr, *tuples = nullptr;
  unsigned long long shape_word;
  Py_ssize_t key_words;
  if (!PyArg_ParseTuple(args, "O!O!nK|O!OO", &PyTuple_Type, &names, &PyTuple_Type, &table, &key_words, &shape_word,
                        &PyTuple_Type, &arg_names, &paths, &tuples))
    return -1;
  if (s->slots) {
    PyErr_SetString(PyExc_RuntimeError, "Stub: already initialized");
    return -1;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(names);
  if (PyTuple_GET_SIZE(table) != n || key_words < 1) {
    PyErr_SetString(PyExc_ValueError, "Stub(names, table, key_words, shape_word): one table row per name");
    return -1;
  }
  Layout* layout = nullptr;
  Py_ssize_t n_args = n;
  if (arg_names) {
    n_args = PyTuple_GET_SIZE(arg_names);
    if (!paths || !tuples || !(layout = layout_from(paths, tuples, n, n_args))) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Stub: arg_names needs paths and tuples");
      return -1;
    }
  }
  PyObject* grid_names = arg_names ? arg_names : names;
  auto slots = std::make_unique<std::vector<SlotSpec>>(size_t(n));
  auto fail = [&](const char* why) {
    if (why) PyErr_SetString(PyExc_ValueError, why);
    delete layout;
    return -1;
  };
  // The bounds of a launch's stack storage (see the top of this file).
  if (n > kMaxSlots || size_t(key_words) > kMaxKeyWords) {
    PyErr_Format(PyExc_ValueError, "Stub: %zd slots and %zd key words; the table-driven stub takes at most %zd "
                 "and %zu (LAZYTRITON_STUB_BUILD=sync builds the generated stub, which has no such bound)",
                 n, key_words, kMaxSlots, kMaxKeyWords);
    return fail(nullptr);
  }
  size_t n_desc = 0, words = (2 * size_t(n) + 63) / 64 + 1;  // the bit words and the shape word, then per slot
  for (Py_ssize_t i = 0; i < n; ++i) {
    SlotSpec& sl = (*slots)[size_t(i)];
    int int_code, annotated, specialize, in_key, divisibility, float_code;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(table, i), "iiiiiiii", &sl.kind, &sl.dtype, &int_code, &annotated,
                          &specialize, &in_key, &divisibility, &float_code))
      return fail(nullptr);
    sl.annotated = annotated, sl.specialize = specialize, sl.in_key = in_key;
    sl.rank = int_code;
    sl.ty = Ty::kPtr;
    if (sl.kind == kInt) {
      if (int_code < 0 || int_code >= (annotated ? 8 : 3)) return fail("Stub: bad int_code in a slot table row");
      sl.ty = annotated ? kFixedTypes[int_code] : kClassTypes[int_code];
      sl.int_spec = {sl.ty, sl.annotated, sl.specialize, bool(divisibility)};
    } else if (sl.kind == kFloat) {
      if (float_code < 0 || float_code > 3) return fail("Stub: bad float_code in a slot table row");
      sl.ty = kFloatTypes[float_code];
    } else if (sl.kind == kBool) {
      sl.ty = Ty::kU1;
    }
    sl.size = sl.kind == kInt || sl.kind == kFloat || sl.kind == kBool ? param_bytes(sl.ty) : 8;
    if (sl.kind == kDesc) {
      if (sl.rank < 1 || sl.rank > kMaxDescRank) return fail("Stub: a descriptor slot's rank is 1 to 5");
      if (++n_desc > kMaxDescs)
        return fail("Stub: more than 16 tensor descriptor slots "
                    "(LAZYTRITON_STUB_BUILD=sync builds the generated stub, which has no such bound)");
    }
    words += sl.kind == kDesc ? size_t(sl.rank) : sl.kind == kConstexpr || sl.kind == kFolded ? 2 : sl.in_key;
  }
  if (words != size_t(key_words)) return fail("Stub: key_words does not match the slot table");  // read() relies on it
  auto* slot_names = new std::vector<std::string>;  // a descriptor's errors name its slot
  for (Py_ssize_t i = 0; i < n; ++i) {
    const char* nm = PyUnicode_Check(PyTuple_GET_ITEM(names, i)) ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i)) : "?";
    slot_names->push_back(nm ? nm : "?");
  }
  PyErr_Clear();
  auto** interned = new PyObject*[size_t(n_args) + 1]();
  for (Py_ssize_t i = 0; i < n_args; ++i) {
    PyObject* nm = PyTuple_GET_ITEM(grid_names, i);
    Py_INCREF(nm);
    if (PyUnicode_CheckExact(nm)) PyUnicode_InternInPlace(&nm);
    interned[i] = nm;
  }
  s->slots = slots.release();
  s->slot_names = slot_names;
  s->names = interned;
  s->n = n;
  s->n_args = n_args;
  s->layout = layout;
  s->key_words = size_t(key_words);
  s->shape_word = shape_word;
  s->entry = {stub_launch, s};
  return 0;
}

void stub_dealloc(PyObject* self) {
  auto* s = reinterpret_cast<Stub*>(self);
  delete s->slots;
  delete s->slot_names;
  delete s->layout;
  if (s->names) {
    for (Py_ssize_t i = 0; i < s->n_args; ++i) Py_XDECREF(s->names[i]);
    delete[] s->names;
  }
  Py_TYPE(self)->tp_free(self);
}

PyMethodDef kMethods[] = {
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(stub_launch_py)), METH_FASTCALL,
     "launch(handle, grid, stream, args) -> True (launched), the call key (unresolved) or None (another shape)."},
    {"key", stub_key, METH_O, "The call key of these arguments, or None (another shape)."},
    {"params", stub_params, METH_O, "The kernel parameter bytes of these arguments, or None (another shape)."},
    {nullptr, nullptr, 0, nullptr}};

PyObject* stub_key_words(PyObject* self, void*) {
  return PyLong_FromSize_t(reinterpret_cast<Stub*>(self)->key_words);
}

PyObject* stub_entry(PyObject* self, void*) {
  auto* s = reinterpret_cast<Stub*>(self);
  if (!s->slots) {
    PyErr_SetString(PyExc_RuntimeError, "Stub: not initialized");
    return nullptr;
  }
  return PyCapsule_New(&s->entry, kStubEntryCapsule, nullptr);
}

PyGetSetDef kGetSet[] = {{"key_words", stub_key_words, nullptr, "Words in a call key.", nullptr},
                         {"entry", stub_entry, nullptr, "The C entry the launcher calls (valid while this stub lives).",
                          nullptr},
                         {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject StubType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_generic_stub", "Table-driven launch stubs.", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__generic_stub() {
  StubType.tp_name = "lazytriton._generic_stub.Stub";
  StubType.tp_basicsize = sizeof(Stub);
  StubType.tp_flags = Py_TPFLAGS_DEFAULT;
  StubType.tp_doc = "Stub(names, table, key_words, shape_word): a launch stub read from a slot table.";
  StubType.tp_new = PyType_GenericNew;
  StubType.tp_init = stub_init;
  StubType.tp_dealloc = stub_dealloc;
  StubType.tp_methods = kMethods;
  StubType.tp_getset = kGetSet;
  if (PyType_Ready(&StubType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&kModule);
  if (!m) return nullptr;
  if (PyModule_AddObjectRef(m, "Stub", reinterpret_cast<PyObject*>(&StubType)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
