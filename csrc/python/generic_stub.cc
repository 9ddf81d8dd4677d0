// lazytriton._generic_stub: the launch stub of any argument shape, read from a
// table at run time instead of generated and compiled per shape. It serves a
// shape's first calls while its generated stub (lazytriton.runtime.stubgen) builds in
// the background, so no compiler runs on the critical path of a first call.
// Same interface and same bytes as a generated stub: its C entry (`entry`,
// stub_protocol.h StubEntry), launch(handle, grid, stream, args), key(args),
// params(args), key_words; the generated stub stays the steady-state path
// (straight-line code, no table walk).
//
// Slot table (built by specialize.Shape.table(), one tuple per argument): the fields of
// contract.SLOT_ROW, (kind, dtype, code, annotated, specialize, in_key, divisibility, float_code),
// with the kinds and codes of contract.h (SlotKind; code: kIntTypes index when annotated, else
// kIntClasses index, or a descriptor's rank; float_code: kFloatTypes index), generated from
// lazytriton/model/contract.py.
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

#include "slot_table.h"
#include "stub_protocol.h"

using namespace lt;
using namespace lt::pyargs;

namespace {

using K = SlotKind;

// Bounds of one call's stack storage. 512 slots: CUDA's classic 4 KB of kernel
// parameters holds 512 8-byte ones; a key word per slot, two for a constexpr,
// a descriptor's rank for a descriptor.
constexpr Py_ssize_t kMaxSlots = 512;
constexpr size_t kMaxDescs = 16;
constexpr size_t kMaxKeyWords = key_bit_words(kMaxSlots) + 2 * kMaxSlots + kMaxDescs * kMaxDescRank + 1;

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

// False: not this shape (no Python error set). The generated stub reads through the same
// read_slot (slot_table.h), with its table folded in.
bool read(const Stub* s, PyObject* const* args, Py_ssize_t n, Read& r) {
  if (!s->slots || n != s->n_args) return false;
  if (s->layout && !tuples_match(*s->layout, args)) return false;
  std::fill_n(r.key, s->key_words, 0);
  std::fill_n(r.cell, s->n, 0);
  r.n_desc = 0;
  r.devices = kNoArrays;
  r.key[s->key_words - 1] = s->shape_word;
  size_t vw = key_bit_words(size_t(s->n));
  for (size_t i = 0; i < size_t(s->n); ++i) {
    const SlotSpec& sl = (*s->slots)[i];
    PyObject* arg = s->layout ? item_at(args, s->layout->paths[i]) : args[i];
    if (!read_slot(sl, arg, i, &r.cell[i], &r.descs[r.n_desc].d, r.key, &vw, &r.devices)) return false;
    r.n_desc += sl.kind == K::kDesc;
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
  if (r.devices != kNoArrays && (ctx = launch_context(&device)) &&
      !arrays_here(s->slots->data(), size_t(s->n), r.cell, r.descs, r.devices, device))
    return StubResult::kOtherShape;
  const Entry* e = kernel->find(r.key, s->key_words);
  if (!e) return (*key = key_tuple(r.key, s->key_words)) ? StubResult::kUnresolved : StubResult::kError;
  Dim3 g;
  if (!eval_grid(grid, *e, s->names, args, s->n_args, &g, kernel->name().c_str())) return StubResult::kError;
  try {
    void* params[kMaxSlots + kMaxDescs * kMaxDescParams];
    DescParams packed[kMaxDescs];  // uninitialized: packing writes what it passes
    size_t k = 0;
    size_t np = pack_params(*e->kernel, kernel->name(), size_t(s->n), [&](size_t i) {
      return param_of((*s->slots)[i], *e, i, r.cell, r.descs, &k, (*s->slot_names)[i].c_str());
    }, packed, params);
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
  return params_tuple(s->slots->data(), size_t(s->n), r.cell, r.descs);
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
  size_t n_desc = 0, words = key_bit_words(size_t(n)) + 1;  // the bit words and the shape word, then per slot
  for (Py_ssize_t i = 0; i < n; ++i) {
    int kind, dtype, code, annotated, specialize, in_key, divisibility, float_code;
    static_assert(kSlotRowFields == 8, "a slot table row's fields (contract.SLOT_ROW) are parsed here");
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(table, i), "iiiiiiii", &kind, &dtype, &code, &annotated, &specialize,
                          &in_key, &divisibility, &float_code))
      return fail(nullptr);
    if (const char* why = slot_row_error(kind, dtype, code, annotated, float_code))
      return fail((std::string("Stub: a slot table row: ") + why).c_str());
    if (kind == int(K::kDesc)) {
      if (++n_desc > kMaxDescs)
        return fail("Stub: more than 16 tensor descriptor slots "
                    "(LAZYTRITON_STUB_BUILD=sync builds the generated stub, which has no such bound)");
    }
    const SlotSpec sl = (*slots)[size_t(i)] =
        slot_spec(kind, dtype, code, annotated, specialize, in_key, divisibility, float_code);
    words += value_words(sl);
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
