// _core.LaunchBase, the base class of lazytriton.LazyKernel: the fields the
// launch hot path reads, as C slots that LazyKernel's own attribute
// assignments write; `k[grid]` (its mp_subscript: a _core.Launch, cached per
// kernel while the same int / tuple-of-ints grid object comes back); and
// `k.run(...)`, Triton's spelling of the same call. The call itself is
// launcher.cc's (launcher.h says how the two files divide).
#include <pybind11/pybind11.h>

#include <memory>

#include "launcher.h"

namespace lt::launcher {

PyTypeObject LaunchBaseType = {PyVarObject_HEAD_INIT(nullptr, 0)};

namespace {

void free_stub_refs(PyObject* capsule) { delete static_cast<std::vector<StubRef>*>(PyCapsule_GetPointer(capsule, nullptr)); }

}  // namespace

// Each stub's C entry (its `entry` capsule), or none: a Python callable.
PyObject* stub_refs_of(PyObject* stubs) {
  auto refs = std::make_unique<std::vector<StubRef>>();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(stubs); ++i) {
    PyObject* obj = PyTuple_GET_ITEM(stubs, i);
    StubRef ref{{nullptr, nullptr}, obj};
    PyObject* cap = PyObject_GetAttrString(obj, seam::kStubEntry);
    if (!cap) {
      if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return nullptr;
      PyErr_Clear();
    }
    if (cap) {
      auto* e = static_cast<pyargs::StubEntry*>(PyCapsule_GetPointer(cap, pyargs::kStubEntryCapsule));
      Py_DECREF(cap);
      if (!e) return nullptr;  // an `entry` that is not a stub's
      ref.entry = *e;
    } else if (!PyCallable_Check(obj)) {
      PyErr_Format(PyExc_TypeError, "lazytriton: %R is not a launch stub (no C entry, not callable)", obj);
      return nullptr;
    }
    refs->push_back(ref);
  }
  PyObject* capsule = PyCapsule_New(refs.get(), nullptr, free_stub_refs);
  if (capsule) refs.release();
  return capsule;
}

namespace {

PyObject* base_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* o = type->tp_alloc(type, 0);  // zeroed
  if (!o) return nullptr;
  auto* self = reinterpret_cast<LaunchBase*>(o);
  self->n_call = -1;
  self->stubs = PyTuple_New(0);
  self->stub_refs = self->stubs ? stub_refs_of(self->stubs) : nullptr;
  if (!self->stub_refs) return Py_DECREF(o), nullptr;
  return o;
}

int base_traverse(PyObject* o, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<LaunchBase*>(o);
  Py_VISIT(self->stubs);
  Py_VISIT(self->handle);
  Py_VISIT(self->cached);
  for (int i = 0; i < self->n_plans; ++i) {
    Py_VISIT(self->plans[i]->kwnames);
    Py_VISIT(self->plans[i]->defaults);
  }
  if (self->run_split) {
    Py_VISIT(self->run_split->kwnames);
    Py_VISIT(self->run_split->kept);
  }
  return 0;
}

int base_clear(PyObject* o) {
  auto* self = reinterpret_cast<LaunchBase*>(o);
  Py_CLEAR(self->stubs);
  Py_CLEAR(self->stub_refs);
  Py_CLEAR(self->handle);
  self->table = nullptr;
  Py_CLEAR(self->cached);
  while (self->n_plans > 0) {
    Plan* p = self->plans[--self->n_plans];
    self->plans[self->n_plans] = nullptr;
    delete p;
  }
  delete self->run_split;
  self->run_split = nullptr;
  return 0;
}

void base_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  base_clear(o);
  Py_TYPE(o)->tp_free(o);
}

// k[grid]: a Launch; the same one again while the same int / tuple-of-ints grid
// object comes back (other grids, e.g. closures, are not kept by the kernel).
PyObject* base_subscript(PyObject* o, PyObject* grid) {
  auto* self = reinterpret_cast<LaunchBase*>(o);
  auto* cached = reinterpret_cast<Launch*>(self->cached);
  if (cached && cached->grid == grid) return Py_NewRef(self->cached);
  Launch* launch = new_launch(o, grid);
  if (!launch) return nullptr;
  bool keep = PyLong_CheckExact(grid);
  if (PyTuple_CheckExact(grid)) {
    keep = true;
    for (Py_ssize_t i = 0; keep && i < PyTuple_GET_SIZE(grid); ++i) keep = PyLong_CheckExact(PyTuple_GET_ITEM(grid, i));
  }
  if (keep) {
    PyObject* old = self->cached;
    self->cached = Py_NewRef(reinterpret_cast<PyObject*>(launch));
    Py_XDECREF(old);
  }
  return reinterpret_cast<PyObject*>(launch);
}

PyMappingMethods base_mapping = {nullptr, base_subscript, nullptr};

// k.run(*args, grid=..., stream=None, warmup=False, **kwargs), the signature of
// Triton's JITFunction.run: k[grid](*args, stream=..., **kwargs) without the
// Python frame. grid= and warmup= are taken out of the keywords; what is left
// goes to the Launch's call, so both spellings share one hot path.
RunSplit* make_split(PyObject* kwnames) {
  auto* sp = new RunSplit;
  sp->kwnames = Py_NewRef(kwnames);
  std::vector<PyObject*> kept;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    if (PyUnicode_CompareWithASCIIString(name, "grid") == 0) {
      sp->grid = i;
    } else if (PyUnicode_CompareWithASCIIString(name, "warmup") == 0) {
      sp->warmup = i;
    } else {
      sp->kept_at.push_back(i);
      kept.push_back(name);
    }
  }
  if (!kept.empty() && !(sp->kept = tuple_of(kept.data(), Py_ssize_t(kept.size())))) {
    delete sp;
    return nullptr;
  }
  return sp;
}

PyObject* base_run(PyObject* o, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  auto* self = reinterpret_cast<LaunchBase*>(o);
  if (kwnames && (!self->run_split || self->run_split->kwnames != kwnames)) {
    RunSplit* sp = make_split(kwnames);
    if (!sp) return nullptr;
    delete self->run_split;
    self->run_split = sp;
  }
  if (!kwnames || self->run_split->grid < 0) {
    PyErr_SetString(PyExc_TypeError, "run() missing required keyword argument: 'grid'");
    return nullptr;
  }
  // Everything read from the split before any Python runs (which may replace it).
  const RunSplit& sp = *self->run_split;
  PyObject* grid = args[nargs + sp.grid];
  PyObject* warmup = sp.warmup >= 0 ? args[nargs + sp.warmup] : nullptr;
  PyObject* names = Py_XNewRef(sp.kept);
  std::vector<PyObject*> heap;
  PyObject* inline_stack[32];
  PyObject** stack = inline_stack;
  size_t total = size_t(nargs) + sp.kept_at.size();
  if (total > 32) {
    heap.resize(total);
    stack = heap.data();
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) stack[i] = args[i];
  for (size_t j = 0; j < sp.kept_at.size(); ++j) stack[nargs + j] = args[nargs + sp.kept_at[j]];

  if (warmup) {
    int truth = PyObject_IsTrue(warmup);
    if (truth != 0) {
      if (truth > 0) {
        PyObject* kname = PyObject_GetAttrString(o, seam::kKernelName);
        if (!kname) PyErr_Clear();
        PyErr_Format(PyExc_NotImplementedError, "kernel %S: run(warmup=True) is not supported: lazytriton "
                     "compiles and tunes on the first real call (k.resolve(...) does it without launching)",
                     kname ? kname : Py_None);
        Py_XDECREF(kname);
      }
      Py_XDECREF(names);
      return nullptr;
    }
  }
  PyObject* launch = base_subscript(o, grid);
  PyObject* r = launch ? launch_vectorcall(launch, stack, size_t(nargs), names) : nullptr;
  Py_XDECREF(launch);
  Py_XDECREF(names);
  return r;
}

PyMethodDef base_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(base_run)), METH_FASTCALL | METH_KEYWORDS,
     "run(*args, grid, stream=None, warmup=False, **kwargs): launch, as k[grid](*args, stream=stream, **kwargs)."},
    {nullptr, nullptr, 0, nullptr},
};

// -- fields, read and written as attributes by LazyKernel's Python code ---------------------

int no_delete(PyObject* value, const char* name) {
  if (value) return 0;
  PyErr_Format(PyExc_TypeError, "cannot delete %s", name);
  return -1;
}

// _stubs: a sequence of stubs, held as a tuple (assign a new one to change it).
PyObject* get_stubs(PyObject* o, void*) { return Py_NewRef(reinterpret_cast<LaunchBase*>(o)->stubs); }

int set_stubs(PyObject* o, PyObject* value, void*) {
  if (no_delete(value, "_stubs") < 0) return -1;
  auto* self = reinterpret_cast<LaunchBase*>(o);
  PyObject* stubs = PySequence_Tuple(value);
  PyObject* refs = stubs ? stub_refs_of(stubs) : nullptr;
  if (!refs) return Py_XDECREF(stubs), -1;
  PyObject *old_stubs = self->stubs, *old_refs = self->stub_refs;
  self->stubs = stubs;
  self->stub_refs = refs;
  Py_XDECREF(old_stubs);  // a launch in flight holds its own references to both
  Py_XDECREF(old_refs);
  return 0;
}

PyObject* get_handle(PyObject* o, void*) {
  auto* self = reinterpret_cast<LaunchBase*>(o);
  return Py_NewRef(self->handle ? self->handle : Py_None);
}

// _handle: the address of the kernel's lt::ResolveTable (ResolveTable.handle), or 0.
int set_handle(PyObject* o, PyObject* value, void*) {
  if (no_delete(value, "_handle") < 0) return -1;
  auto* self = reinterpret_cast<LaunchBase*>(o);
  void* table = PyLong_AsVoidPtr(value);
  if (PyErr_Occurred()) return -1;
  PyObject* old = self->handle;
  self->handle = Py_NewRef(value);
  self->table = static_cast<ResolveTable*>(table);
  Py_XDECREF(old);
  return 0;
}

template <size_t Offset>
PyObject* get_flag(PyObject* o, void*) {
  return PyBool_FromLong(*reinterpret_cast<bool*>(reinterpret_cast<char*>(o) + Offset));
}

template <size_t Offset>
int set_flag(PyObject* o, PyObject* value, void* name) {
  if (no_delete(value, static_cast<const char*>(name)) < 0) return -1;
  int truth = PyObject_IsTrue(value);
  if (truth < 0) return -1;
  *reinterpret_cast<bool*>(reinterpret_cast<char*>(o) + Offset) = truth;
  return 0;
}

PyObject* get_n_call(PyObject* o, void*) { return PyLong_FromSsize_t(reinterpret_cast<LaunchBase*>(o)->n_call); }

int set_n_call(PyObject* o, PyObject* value, void*) {
  if (no_delete(value, "_n_call") < 0) return -1;
  Py_ssize_t n = PyLong_AsSsize_t(value);
  if (n == -1 && PyErr_Occurred()) return -1;
  reinterpret_cast<LaunchBase*>(o)->n_call = n;
  return 0;
}

// (positional count, keyword names or None, "fast" | "slow") for each cached plan.
PyObject* get_plans(PyObject* o, void*) {
  auto* self = reinterpret_cast<LaunchBase*>(o);
  PyObject* out = PyList_New(0);
  for (int i = 0; out && i < self->n_plans; ++i) {
    const Plan* p = self->plans[i];
    PyObject* row = Py_BuildValue("(nOs)", p->nargs, p->kwnames ? p->kwnames : Py_None, p->never ? "slow" : "fast");
    if (!row || PyList_Append(out, row) < 0) Py_CLEAR(out);
    Py_XDECREF(row);
  }
  return out;
}

PyGetSetDef base_getset[] = {
    {"_stubs", get_stubs, set_stubs,
     "The stubs tried in order by k[grid](...) (a tuple; assign a sequence to change them).", nullptr},
    {"_handle", get_handle, set_handle, "Address of the C++ lt::ResolveTable the stubs look winners up in.",
     nullptr},
    {"_python_heuristics", get_flag<offsetof(LaunchBase, python_heuristics)>,
     set_flag<offsetof(LaunchBase, python_heuristics)>, "Heuristics evaluated in Python on every call.",
     const_cast<char*>("_python_heuristics")},
    {"_needs_probe", get_flag<offsetof(LaunchBase, needs_probe)>, set_flag<offsetof(LaunchBase, needs_probe)>,
     "Heuristics not probed yet.", const_cast<char*>("_needs_probe")},
    {"_n_call", get_n_call, set_n_call, "Number of call parameters.", nullptr},
    {"_launch_plans", get_plans, nullptr, "The keyword-call plans cached by the C launcher (for tests).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

bool ready_base_type() {
  PyTypeObject* b = &LaunchBaseType;
  b->tp_name = "lazytriton._core.LaunchBase";
  b->tp_basicsize = sizeof(LaunchBase);
  b->tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  b->tp_doc = "Base class of lazytriton.LazyKernel: `k[grid]` and the launch hot path, in C.";
  b->tp_new = base_new;
  b->tp_dealloc = base_dealloc;
  b->tp_traverse = base_traverse;
  b->tp_clear = base_clear;
  b->tp_as_mapping = &base_mapping;
  b->tp_getset = base_getset;
  b->tp_methods = base_methods;
  return PyType_Ready(b) >= 0;
}

}  // namespace
}  // namespace lt::launcher

void bind_launcher(pybind11::module_& m) {
  using namespace lt::launcher;
  if (!init_names() || !ready_base_type() || !ready_launch_type()) throw pybind11::error_already_set();
  PyObject* reg = register_stream_handle_function();
  if (!reg) throw pybind11::error_already_set();
  m.attr("LaunchBase") = pybind11::handle(reinterpret_cast<PyObject*>(&LaunchBaseType));
  m.attr("Launch") = pybind11::handle(reinterpret_cast<PyObject*>(&LaunchType));
  m.attr("register_stream_handle") = pybind11::reinterpret_steal<pybind11::object>(reg);
  PyObject* dflt = default_stream_function();
  if (!dflt) throw pybind11::error_already_set();
  m.attr("default_stream") = pybind11::reinterpret_steal<pybind11::object>(dflt);
}
