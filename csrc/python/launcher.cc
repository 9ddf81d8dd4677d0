// The `k[grid](*args, stream=s)` hot path in C, with no Python frame:
//
//   _core.LaunchBase  the base class of lazytriton.LazyKernel. `k[grid]` is its
//                     mp_subscript; the fields the hot path reads (_stubs,
//                     _handle, _n_call, _python_heuristics, _needs_probe) are
//                     C slots that LazyKernel's own attribute assignments write.
//   _core.Launch      what `k[grid]` returns (cached per kernel while the same
//                     int / tuple-of-ints grid object comes back). Its vectorcall
//                     binds the call, converts stream= and calls the stubs of
//                     k._stubs: True from a stub is a launch, None "not my
//                     argument shape", a tuple a call key with no winner yet.
//
// A call key with no winner is resolved here, once, through the kernel's
// resolve-once table (resolve_table.h), whose resolver is LazyKernel._resolve:
// the first call of a specialization crosses into Python once (to compile and
// tune) and comes back once (with the winner), then launches through the same
// stub. A call no stub takes asks Python for its stub (LazyKernel._add_stub:
// no compiler, the table-driven stub serves at once) and is dispatched again.
// Python binds what this file cannot (LazyKernel._run: heuristics evaluated in
// Python, keywords it has not bound yet); keyword calls are bound by plans that
// Python hands out once per (positional count, keyword names) through
// `LazyKernel._fast_plan`, cached here by the identity of the interpreter's
// kwnames tuple (a constant per call site), then by its contents.
//
// Only the public C API (3.10 and later) on the hot path; every object it
// touches is owned or kept alive by a reference it holds across any call that
// may run Python.
#include <pybind11/pybind11.h>

#include <Python.h>

#include <exception>
#include <vector>

#include "lazytriton/resolve_table.h"

namespace {

constexpr int kMaxPlans = 16;

// How the call tuple of a keyword call is made (see LazyKernel._fast_plan).
struct Plan {
  PyObject* kwnames = nullptr;  // owned; nullptr: a call without keywords
  Py_ssize_t nargs = 0;
  bool never = false;           // Python never binds such a call fast: go to _run
  Py_ssize_t stream = -1;       // index of stream= in kwnames, -1 if absent
  PyObject* defaults = nullptr; // owned tuple
  // Per parameter after the positional ones: >= 0, index of its value in the
  // vectorcall argument array; < 0, defaults[-1 - src].
  std::vector<Py_ssize_t> src;

  ~Plan() {
    Py_XDECREF(kwnames);
    Py_XDECREF(defaults);
  }
};

// How k.run's keywords split: where grid= and warmup= are, and the names left
// for the Launch. Made once per kwnames tuple (a constant per call site), so
// the leftovers are the same tuple every call and their plan is found by identity.
struct RunSplit {
  PyObject* kwnames = nullptr;  // owned
  PyObject* kept = nullptr;     // owned; nullptr when no keyword is left
  Py_ssize_t grid = -1, warmup = -1;
  std::vector<Py_ssize_t> kept_at;  // index in kwnames of each kept name

  ~RunSplit() {
    Py_XDECREF(kwnames);
    Py_XDECREF(kept);
  }
};

struct LaunchBase {
  PyObject_HEAD
  PyObject* stubs;              // list of generated stubs' launch functions
  PyObject* handle;             // int: address of the C++ lt::ResolveTable
  PyObject* python_heuristics;  // the fast path runs only while both are False
  PyObject* needs_probe;
  Py_ssize_t n_call;            // number of call parameters (-1: not set)
  PyObject* cached;             // Launch for the last int / tuple-of-ints grid
  int n_plans;                  // plans are only added, and freed with the object
  Plan* plans[kMaxPlans];
  RunSplit* run_split;          // k.run's last keyword split
};

struct Launch {
  PyObject_HEAD
  PyObject* kernel;  // a LaunchBase
  PyObject* grid;
  vectorcallfunc vectorcall;
};

PyTypeObject LaunchBaseType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject LaunchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Interned names and lazily imported modules, kept for the life of the process.
PyObject *s_stream, *s_run, *s_add_stub, *s_fast_plan, *s_modules, *s_cupy, *s_stream_handle, *s_get;
PyObject* g_sys;
PyObject* g_runtime;              // lazytriton.core.kernel
PyObject* g_stream_handle;        // lazytriton.core.kernel.stream_handle as defined there
PyObject* g_zero;

inline bool is_stream(PyObject* name) {
  return name == s_stream || PyUnicode_CompareWithASCIIString(name, "stream") == 0;
}

PyObject* tuple_of(PyObject* const* items, Py_ssize_t n) {
  PyObject* t = PyTuple_New(n);
  if (!t) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(items[i]));
  return t;
}

// -- stream= ------------------------------------------------------------------------

// sys.modules.get("cupy") is not None: 1, 0, or -1 with an error set.
int cupy_imported() {
  PyObject* modules = PyObject_GetAttr(g_sys, s_modules);
  if (!modules) return -1;
  int found;
  if (PyDict_CheckExact(modules)) {
    PyObject* m = PyDict_GetItemWithError(modules, s_cupy);  // borrowed
    found = m ? m != Py_None : PyErr_Occurred() ? -1 : 0;
  } else {
    PyObject* m = PyObject_CallMethodOneArg(modules, s_get, s_cupy);
    found = m ? m != Py_None : -1;
    Py_XDECREF(m);
  }
  Py_DECREF(modules);
  return found;
}

// The int CUstream the stubs take: `stream if type(stream) is int else
// stream_handle(stream)`, exactly as LazyKernel._run computes it. `stream` is
// borrowed, nullptr when not passed (None). A new reference, or nullptr.
PyObject* stream_int(PyObject* stream) {
  if (stream && PyLong_CheckExact(stream)) return Py_NewRef(stream);
  if (!g_runtime && !(g_runtime = PyImport_ImportModule("lazytriton.core.kernel"))) return nullptr;
  PyObject* fn = PyObject_GetAttr(g_runtime, s_stream_handle);  // looked up per call, as Python does
  if (!fn) return nullptr;
  if (!stream) stream = Py_None;
  if (stream == Py_None && fn == g_stream_handle) {
    // stream_handle(None) is CuPy's current stream if CuPy is imported, else 0:
    // the common case needs no Python call.
    int cupy = cupy_imported();
    if (cupy <= 0) {
      Py_DECREF(fn);
      return cupy < 0 ? nullptr : Py_NewRef(g_zero);
    }
  }
  PyObject* s = PyObject_CallOneArg(fn, stream);
  Py_DECREF(fn);
  return s;
}

// A bad stream= (stream_handle's TypeError): the same error, naming the kernel as
// LazyKernel._run's does. Other errors are left as they are.
void name_stream_error(PyObject* kernel) {
  if (!PyErr_ExceptionMatches(PyExc_TypeError)) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject* name = PyObject_GetAttrString(kernel, "name");
  if (name && PyUnicode_Check(name) && value) {
    PyErr_Format(PyExc_TypeError, "kernel %U: %S", name, value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  } else {
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
  }
  Py_XDECREF(name);
}

// -- plans ----------------------------------------------------------------------------

// A new plan from Python, or nullptr: an error is set, or Python has no plan
// for such a call yet (it makes one when it first binds one).
Plan* make_plan(LaunchBase* k, Py_ssize_t nargs, PyObject* kwnames) {
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  Py_ssize_t stream = -1;
  std::vector<Py_ssize_t> kwpos;  // argument index of each keyword but stream=
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    if (stream < 0 && is_stream(PyTuple_GET_ITEM(kwnames, i)))
      stream = i;
    else
      kwpos.push_back(nargs + i);
  }
  PyObject* names = PyTuple_New(Py_ssize_t(kwpos.size()));
  if (!names) return nullptr;
  for (size_t j = 0; j < kwpos.size(); ++j)
    PyTuple_SET_ITEM(names, j, Py_NewRef(PyTuple_GET_ITEM(kwnames, kwpos[j] - nargs)));
  PyObject* n = PyLong_FromSsize_t(nargs);
  if (!n) return Py_DECREF(names), nullptr;
  PyObject* argv[4] = {nullptr, reinterpret_cast<PyObject*>(k), n, names};
  PyObject* r = PyObject_VectorcallMethod(s_fast_plan, argv + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  Py_DECREF(n);
  Py_DECREF(names);
  if (!r) return nullptr;
  if (r == Py_None) return Py_DECREF(r), nullptr;
  auto* p = new Plan;
  p->kwnames = Py_XNewRef(kwnames);
  p->nargs = nargs;
  p->stream = stream;
  if (r == Py_False) {
    p->never = true;
    Py_DECREF(r);
    return p;
  }
  bool ok = PyTuple_Check(r);
  PyObject* defaults = PyList_New(0);
  for (Py_ssize_t i = 0; ok && defaults && i < PyTuple_GET_SIZE(r); ++i) {
    PyObject* pick = PyTuple_GET_ITEM(r, i);
    if (PyLong_CheckExact(pick)) {
      Py_ssize_t j = PyLong_AsSsize_t(pick);
      ok = j >= 0 && j < Py_ssize_t(kwpos.size());
      if (ok) p->src.push_back(kwpos[j]);
    } else if (PyTuple_Check(pick) && PyTuple_GET_SIZE(pick) == 1) {
      p->src.push_back(-1 - PyList_GET_SIZE(defaults));
      ok = PyList_Append(defaults, PyTuple_GET_ITEM(pick, 0)) == 0;
    } else {
      ok = false;
    }
  }
  Py_DECREF(r);
  if (ok && defaults) p->defaults = PyList_AsTuple(defaults);
  Py_XDECREF(defaults);
  if (!p->defaults) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "lazytriton: internal error: malformed launch plan");
    delete p;
    return nullptr;
  }
  return p;
}

// The plan for (nargs, kwnames), or nullptr (see make_plan; also when the
// cache is full: such calls go to Python's _run).
const Plan* find_plan(LaunchBase* k, Py_ssize_t nargs, PyObject* kwnames) {
  for (int i = 0; i < k->n_plans; ++i)
    if (k->plans[i]->kwnames == kwnames && k->plans[i]->nargs == nargs) return k->plans[i];
  if (kwnames) {  // a call with **kw builds a new names tuple each time
    for (int i = 0; i < k->n_plans; ++i) {
      const Plan* p = k->plans[i];
      if (p->nargs != nargs || !p->kwnames || PyTuple_GET_SIZE(p->kwnames) != PyTuple_GET_SIZE(kwnames)) continue;
      int eq = PyObject_RichCompareBool(p->kwnames, kwnames, Py_EQ);
      if (eq < 0) return nullptr;
      if (eq) return p;
    }
  }
  if (k->n_plans >= kMaxPlans) return nullptr;
  Plan* p = make_plan(k, nargs, kwnames);  // runs Python: other threads may add plans meanwhile
  if (!p) return nullptr;
  if (k->n_plans >= kMaxPlans) {
    delete p;
    return nullptr;
  }
  k->plans[k->n_plans++] = p;
  return p;
}

PyObject* bind(const Plan* p, PyObject* const* args) {
  Py_ssize_t n = p->nargs, tail = Py_ssize_t(p->src.size());
  PyObject* t = PyTuple_New(n + tail);
  if (!t) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(args[i]));
  for (Py_ssize_t j = 0; j < tail; ++j) {
    Py_ssize_t s = p->src[j];
    PyTuple_SET_ITEM(t, n + j, Py_NewRef(s >= 0 ? args[s] : PyTuple_GET_ITEM(p->defaults, -1 - s)));
  }
  return t;
}

// -- the call ---------------------------------------------------------------------------

// Resolves a call key a stub answered with, once, through the kernel's table
// (k._handle): its resolver is LazyKernel._resolve(key, (args, stream, grid,
// stub)). Without the GIL, so that a thread resolving the same key in Python is
// waited for, not blocked. 0, or -1 with a Python error set.
int resolve_key(PyObject* handle, PyObject* stub, PyObject* key, PyObject* grid, PyObject* stream,
                PyObject* args) {
  auto* table = static_cast<lt::ResolveTable*>(PyLong_AsVoidPtr(handle));
  if (!table) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "lazytriton: this kernel has no call table");
    return -1;
  }
  if (!PyTuple_Check(key)) {
    PyErr_Format(PyExc_RuntimeError, "lazytriton: internal error: a launch stub answered %R", key);
    return -1;
  }
  std::vector<uint64_t> words(size_t(PyTuple_GET_SIZE(key)));  // once per new specialization: not the hot path
  for (size_t i = 0; i < words.size(); ++i) {
    words[i] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(key, Py_ssize_t(i)));
    if (PyErr_Occurred()) return -1;
  }
  PyObject* ctx = PyTuple_Pack(4, args, stream, grid, stub);
  if (!ctx) return -1;
  int rc = 0;
  try {
    pybind11::gil_scoped_release nogil;
    table->resolve(words.data(), words.size(), ctx);
  } catch (pybind11::error_already_set& e) {  // the resolver's Python exception, as raised
    e.restore();
    rc = -1;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    rc = -1;
  }
  Py_DECREF(ctx);
  return rc;
}

// Calls the stubs in k._stubs: 1 if one launched (resolving its call key
// first if it has no winner yet), 0 if no stub takes these arguments, -1 on error.
int call_stubs(LaunchBase* k, PyObject* grid, PyObject* stream, PyObject* args) {
  PyObject* stubs = Py_NewRef(k->stubs);  // Python may replace or grow the list meanwhile
  PyObject* handle = Py_NewRef(k->handle);
  PyObject* argv[5] = {nullptr, handle, grid, stream, args};
  int result = 0;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(stubs) && result == 0; ++i) {
    PyObject* stub = Py_NewRef(PyList_GET_ITEM(stubs, i));
    PyObject* r = PyObject_Vectorcall(stub, argv + 1, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (r && r != Py_True && r != Py_None) {  // a call key with no winner yet
      PyObject* key = r;
      r = resolve_key(handle, stub, key, grid, stream, args) < 0
              ? nullptr
              : PyObject_Vectorcall(stub, argv + 1, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
      if (r && r != Py_True) {
        PyErr_Format(PyExc_RuntimeError, "lazytriton: internal error: the call key %R was resolved but its stub "
                     "did not launch it", key);
        Py_CLEAR(r);
      }
      Py_DECREF(key);
    }
    Py_DECREF(stub);
    result = !r ? -1 : r == Py_True ? 1 : 0;
    Py_XDECREF(r);
  }
  Py_DECREF(handle);
  Py_DECREF(stubs);
  return result;
}

// Launches a bound call: through k's stubs; when none takes it, Python adds the
// stub of its argument shape (LazyKernel._add_stub) and it is dispatched again.
PyObject* dispatch(LaunchBase* k, PyObject* kernel, PyObject* grid, PyObject* stream, PyObject* args) {
  int r = call_stubs(k, grid, stream, args);
  if (r == 0) {
    PyObject* argv[3] = {nullptr, kernel, args};
    PyObject* added = PyObject_VectorcallMethod(s_add_stub, argv + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (!added) return nullptr;
    Py_DECREF(added);
    r = call_stubs(k, grid, stream, args);
    if (r == 0) {
      PyErr_Format(PyExc_RuntimeError, "kernel %S: internal error: the stub made for these arguments rejected them",
                   kernel);
      return nullptr;
    }
  }
  if (r < 0) return nullptr;
  Py_RETURN_NONE;
}

// What Python binds: kernel._run(grid, stream, args, kwargs) returns the call
// tuple and the stream as an int, then dispatched as a bound call.
PyObject* slow(Launch* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* pos = tuple_of(args, nargs);
  PyObject* kwargs = pos ? PyDict_New() : nullptr;
  if (!kwargs) return Py_XDECREF(pos), nullptr;
  PyObject* stream = Py_None;
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    if (is_stream(name)) {
      stream = args[nargs + i];
    } else if (PyDict_SetItem(kwargs, name, args[nargs + i]) < 0) {
      Py_DECREF(pos);
      Py_DECREF(kwargs);
      return nullptr;
    }
  }
  PyObject* argv[6] = {nullptr, self->kernel, self->grid, stream, pos, kwargs};
  PyObject* r = PyObject_VectorcallMethod(s_run, argv + 1, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  Py_DECREF(pos);
  Py_DECREF(kwargs);
  if (!r) return nullptr;
  if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(r, 0))) {
    PyErr_Format(PyExc_RuntimeError, "kernel %S: internal error: _run returned %R, not (call tuple, stream)",
                 self->kernel, r);
    Py_DECREF(r);
    return nullptr;
  }
  PyObject* out = dispatch(reinterpret_cast<LaunchBase*>(self->kernel), self->kernel, self->grid,
                           PyTuple_GET_ITEM(r, 1), PyTuple_GET_ITEM(r, 0));
  Py_DECREF(r);
  return out;
}

PyObject* launch_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<Launch*>(callable);
  auto* k = reinterpret_cast<LaunchBase*>(self->kernel);
  if (!k) {
    PyErr_SetString(PyExc_RuntimeError, "lazytriton: this launch object was cleared");
    return nullptr;
  }
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  if (k->python_heuristics == Py_False && k->needs_probe == Py_False && k->stubs && PyList_CheckExact(k->stubs) &&
      k->handle) {
    PyObject* call = nullptr;
    PyObject* stream = nullptr;
    if (nargs == k->n_call && (nkw == 0 || (nkw == 1 && is_stream(PyTuple_GET_ITEM(kwnames, 0))))) {
      call = tuple_of(args, nargs);  // what _bind_call returns: the positional arguments
      if (nkw) stream = args[nargs];
      if (!call) return nullptr;
    } else {
      const Plan* p = find_plan(k, nargs, kwnames);
      if (!p && PyErr_Occurred()) return nullptr;
      if (p && !p->never) {
        if (p->stream >= 0) stream = args[nargs + p->stream];
        if (!(call = bind(p, args))) return nullptr;
      }
    }
    if (call) {
      PyObject* s = stream_int(stream);
      if (!s) name_stream_error(self->kernel);
      PyObject* r = s ? dispatch(k, self->kernel, self->grid, s, call) : nullptr;
      Py_XDECREF(s);
      Py_DECREF(call);
      return r;
    }
  }
  return slow(self, args, nargs, kwnames);
}

// -- Launch ------------------------------------------------------------------------------

int launch_traverse(PyObject* o, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<Launch*>(o);
  Py_VISIT(self->kernel);
  Py_VISIT(self->grid);
  return 0;
}

int launch_clear(PyObject* o) {
  auto* self = reinterpret_cast<Launch*>(o);
  Py_CLEAR(self->kernel);
  Py_CLEAR(self->grid);
  return 0;
}

void launch_dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  launch_clear(o);
  PyObject_GC_Del(o);
}

PyObject* launch_repr(PyObject* o) {
  auto* self = reinterpret_cast<Launch*>(o);
  if (!self->kernel) return PyUnicode_FromString("<lazytriton launch>");
  return PyUnicode_FromFormat("<lazytriton launch %R[%R]>", self->kernel, self->grid);
}

PyObject* launch_get_kernel(PyObject* o, void*) {
  auto* self = reinterpret_cast<Launch*>(o);
  return Py_NewRef(self->kernel ? self->kernel : Py_None);
}

PyObject* launch_get_grid(PyObject* o, void*) {
  auto* self = reinterpret_cast<Launch*>(o);
  return Py_NewRef(self->grid ? self->grid : Py_None);
}

PyGetSetDef launch_getset[] = {
    {"kernel", launch_get_kernel, nullptr, "The LazyKernel this launches.", nullptr},
    {"grid", launch_get_grid, nullptr, "The grid: an int, a tuple of up to 3 ints or a callable of the meta dict.",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

Launch* new_launch(PyObject* kernel, PyObject* grid) {
  Launch* self = PyObject_GC_New(Launch, &LaunchType);
  if (!self) return nullptr;
  self->kernel = Py_NewRef(kernel);
  self->grid = Py_NewRef(grid);
  self->vectorcall = launch_vectorcall;
  PyObject_GC_Track(self);
  return self;
}

// -- LaunchBase ---------------------------------------------------------------------------

PyObject* base_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* o = type->tp_alloc(type, 0);  // zeroed
  if (!o) return nullptr;
  reinterpret_cast<LaunchBase*>(o)->n_call = -1;
  return o;
}

int base_traverse(PyObject* o, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<LaunchBase*>(o);
  Py_VISIT(self->stubs);
  Py_VISIT(self->handle);
  Py_VISIT(self->python_heuristics);
  Py_VISIT(self->needs_probe);
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
  Py_CLEAR(self->handle);
  Py_CLEAR(self->python_heuristics);
  Py_CLEAR(self->needs_probe);
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
// goes to the Launch's vectorcall, so both spellings share one hot path.
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
        PyObject* kname = PyObject_GetAttrString(o, "name");
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

// Object fields, read and written as attributes by LazyKernel's Python code.
template <size_t Offset>
PyObject* get_field(PyObject* o, void* name) {
  PyObject* v = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + Offset);
  if (!v) {
    PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", Py_TYPE(o)->tp_name,
                 static_cast<const char*>(name));
    return nullptr;
  }
  return Py_NewRef(v);
}

template <size_t Offset>
int set_field(PyObject* o, PyObject* value, void*) {
  auto** slot = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + Offset);
  PyObject* old = *slot;
  *slot = Py_XNewRef(value);  // nullptr: del
  Py_XDECREF(old);
  return 0;
}

PyObject* get_n_call(PyObject* o, void*) { return PyLong_FromSsize_t(reinterpret_cast<LaunchBase*>(o)->n_call); }

int set_n_call(PyObject* o, PyObject* value, void*) {
  if (!value) {
    PyErr_SetString(PyExc_TypeError, "cannot delete _n_call");
    return -1;
  }
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
    {"_stubs", get_field<offsetof(LaunchBase, stubs)>, set_field<offsetof(LaunchBase, stubs)>,
     "The stubs' launch functions, tried in order by k[grid](...).", const_cast<char*>("_stubs")},
    {"_handle", get_field<offsetof(LaunchBase, handle)>, set_field<offsetof(LaunchBase, handle)>,
     "Address of the C++ lt::ResolveTable, passed to the stubs.", const_cast<char*>("_handle")},
    {"_python_heuristics", get_field<offsetof(LaunchBase, python_heuristics)>,
     set_field<offsetof(LaunchBase, python_heuristics)>, "Heuristics evaluated in Python on every call.",
     const_cast<char*>("_python_heuristics")},
    {"_needs_probe", get_field<offsetof(LaunchBase, needs_probe)>, set_field<offsetof(LaunchBase, needs_probe)>,
     "Heuristics not probed yet.", const_cast<char*>("_needs_probe")},
    {"_n_call", get_n_call, set_n_call, "Number of call parameters.", nullptr},
    {"_launch_plans", get_plans, nullptr, "The keyword-call plans cached by the C launcher (for tests).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

bool ready_types() {
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
  if (PyType_Ready(b) < 0) return false;

  PyTypeObject* l = &LaunchType;
  l->tp_name = "lazytriton._core.Launch";
  l->tp_basicsize = sizeof(Launch);
  l->tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  l->tp_doc = "k[grid]: call it with the kernel's arguments (and stream=) to launch.";
  l->tp_dealloc = launch_dealloc;
  l->tp_traverse = launch_traverse;
  l->tp_clear = launch_clear;
  l->tp_repr = launch_repr;
  l->tp_call = PyVectorcall_Call;
  l->tp_vectorcall_offset = offsetof(Launch, vectorcall);
  l->tp_getset = launch_getset;
  return PyType_Ready(l) >= 0;
}

}  // namespace

// lazytriton.core.kernel.stream_handle as core/kernel.py defines it, so that the
// launcher can tell it from a replacement (monkeypatching), which it then calls.
static PyObject* register_stream_handle(PyObject*, PyObject* fn) {
  PyObject* old = g_stream_handle;
  g_stream_handle = Py_NewRef(fn);
  Py_XDECREF(old);
  Py_RETURN_NONE;
}

void bind_launcher(pybind11::module_& m) {
  s_stream = PyUnicode_InternFromString("stream");
  s_run = PyUnicode_InternFromString("_run");
  s_add_stub = PyUnicode_InternFromString("_add_stub");
  s_fast_plan = PyUnicode_InternFromString("_fast_plan");
  s_modules = PyUnicode_InternFromString("modules");
  s_cupy = PyUnicode_InternFromString("cupy");
  s_stream_handle = PyUnicode_InternFromString("stream_handle");
  s_get = PyUnicode_InternFromString("get");
  g_sys = PyImport_ImportModule("sys");
  g_zero = PyLong_FromLong(0);
  if (!s_stream || !s_run || !s_add_stub || !s_fast_plan || !s_modules || !s_cupy || !s_stream_handle || !s_get || !g_sys ||
      !g_zero || !ready_types())
    throw pybind11::error_already_set();
  m.attr("LaunchBase") = pybind11::handle(reinterpret_cast<PyObject*>(&LaunchBaseType));
  m.attr("Launch") = pybind11::handle(reinterpret_cast<PyObject*>(&LaunchType));
  static PyMethodDef def = {"register_stream_handle", register_stream_handle, METH_O,
                            "Tell the launcher which function is lazytriton.core.kernel.stream_handle."};
  m.attr("register_stream_handle") =
      pybind11::reinterpret_steal<pybind11::object>(PyCFunction_New(&def, nullptr));
}
