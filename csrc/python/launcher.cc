// `k[grid](*args, stream=s)`: the call of a _core.Launch, in C, with no Python
// frame (launcher.h says how the two files of LazyKernel's C half divide).
//
// Steady state: the call is bound (positional, or by a keyword plan Python
// handed out once per call site, cached here by the identity of the
// interpreter's kwnames tuple), stream= is converted, and the kernel's stubs
// are called through their C entries (stub_protocol.h StubEntry) with the bound
// arguments as an array: the first stub of the call's argument shape reads
// them, finds the winner of their call key and launches it.
//
// A call no stub can launch yet crosses into Python once: LazyKernel._first_call
// makes the stub of a new argument shape and resolves a new call key (the
// kernel's resolve-once table de-duplicates concurrent first calls), and the
// same stub then launches it. Python binds what this file cannot
// (LazyKernel._run: heuristics evaluated in Python, keywords it has not bound
// yet), and the bound call is launched the same way.
#include "launcher.h"

#include <exception>

namespace lt::launcher {
namespace {

// Interned names and lazily imported modules, kept for the life of the process.
PyObject *s_stream, *s_run, *s_first_call, *s_fast_plan, *s_modules, *s_cupy, *s_stream_handle, *s_get;
PyObject *s_torch, *s_raw_stream, *s_get_device;  // the stream rule's names on torch
PyObject* g_sys;
PyObject* g_runtime;        // lazytriton.runtime.kernel
PyObject* g_stream_handle;  // lazytriton.runtime.kernel.stream_handle as defined there

constexpr Py_ssize_t kInlineArgs = 64;  // a bound call of more arguments is held on the heap

inline bool is_stream(PyObject* name) {
  return name == s_stream || PyUnicode_CompareWithASCIIString(name, "stream") == 0;
}

// -- stream= ----------------------------------------------------------------------------

// sys.modules.get(name) (borrowed), nullptr if absent or None; nullptr with an error set on failure.
PyObject* imported(PyObject* name) {
  PyObject* modules = PyObject_GetAttr(g_sys, s_modules);
  if (!modules) return nullptr;
  PyObject* m;
  if (PyDict_CheckExact(modules)) {
    m = PyDict_GetItemWithError(modules, name);  // borrowed; sys.modules keeps it
  } else {
    m = PyObject_CallMethodOneArg(modules, s_get, name);
    Py_XDECREF(m);  // still held by sys.modules
  }
  Py_DECREF(modules);
  return m == Py_None ? nullptr : m;
}

// torch's pieces the stream rule reads, found once torch is imported (torch is never
// unloaded); tensor is null until then. Its stream getters are looked up on torch._C at
// each use, as Triton's driver reads them from torch (a replacement is seen).
struct Torch {
  PyObject* tensor = nullptr;  // torch.Tensor
  PyObject* c = nullptr;       // torch._C
};

const Torch& torch_state() {
  static Torch t;
  if (t.tensor) return t;
  PyObject* torch = imported(s_torch);
  PyObject* c = torch ? PyObject_GetAttrString(torch, "_C") : nullptr;
  PyObject* tensor = torch ? PyObject_GetAttrString(torch, "Tensor") : nullptr;
  if (c && tensor && PyType_Check(tensor)) {
    t = Torch{tensor, c};
  } else {  // not imported (yet), or being imported: asked again next time
    Py_XDECREF(c);
    Py_XDECREF(tensor);
  }
  PyErr_Clear();
  return t;
}

// Whether a torch tensor is among the call's arguments (tuples searched too).
bool has_tensor(PyObject* const* args, Py_ssize_t n, PyTypeObject* tensor, int depth = 0) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = args[i];
    if (PyObject_TypeCheck(a, tensor)) return true;
    if (PyTuple_Check(a) && depth < 8 && has_tensor(&PyTuple_GET_ITEM(a, 0), PyTuple_GET_SIZE(a), tensor, depth + 1))
      return true;
  }
  return false;
}

// A stream handle from a Python int result (a new reference consumed). False with an error set.
bool stream_from(PyObject* v, cu::CUstream* out) {
  if (!v) return false;
  *out = static_cast<cu::CUstream>(PyLong_AsVoidPtr(v));
  Py_DECREF(v);
  return !PyErr_Occurred();
}

// torch's current stream of the launch device (the current context's; torch's current
// device when no context is current): what Triton's launcher asks torch for. A torch
// built without CUDA has no such getter: its tensors are on no GPU, and 0 is as good.
bool torch_stream(const Torch& t, cu::CUstream* out) {
  PyObject* getter = PyObject_GetAttr(t.c, s_raw_stream);
  if (!getter) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return false;
    PyErr_Clear();
    *out = nullptr;
    return true;
  }
  int device = -1;
  pyargs::launch_context(&device);
  PyObject* d = nullptr;
  if (device >= 0) {
    d = PyLong_FromLong(device);
  } else if (PyObject* current = PyObject_GetAttr(t.c, s_get_device)) {
    d = PyObject_CallNoArgs(current);
    Py_DECREF(current);
  }
  PyObject* s = d ? PyObject_CallOneArg(getter, d) : nullptr;
  Py_XDECREF(d);
  Py_DECREF(getter);
  return stream_from(s, out);
}

// CuPy's current stream (cupy.cuda.get_current_stream().ptr), looked up per call as Python would.
bool cupy_stream(PyObject* cupy, cu::CUstream* out) {
  PyObject* cuda = PyObject_GetAttrString(cupy, "cuda");
  PyObject* s = cuda ? PyObject_CallMethod(cuda, "get_current_stream", nullptr) : nullptr;
  Py_XDECREF(cuda);
  PyObject* ptr = s ? PyObject_GetAttrString(s, "ptr") : nullptr;
  Py_XDECREF(s);
  return stream_from(ptr, out);
}

}  // namespace

// The stream of a call that names none (stream= absent or None), the one rule of every face
// that launches from Python: a call with a torch tensor among its arguments goes to torch's
// current stream of the launch device, as Triton's launcher does (so `with torch.cuda.stream`,
// torch.cuda.graph and torch.compile's CUDA graphs direct it); else, with CuPy imported, to
// CuPy's current stream; else to torch's current stream where torch is imported (Triton's
// rule for any call); else to the legacy default stream 0. False with an error set.
bool default_stream(PyObject* const* args, Py_ssize_t n, cu::CUstream* out) {
  *out = nullptr;
  const Torch& t = torch_state();
  if (t.tensor && has_tensor(args, n, reinterpret_cast<PyTypeObject*>(t.tensor))) return torch_stream(t, out);
  PyObject* cupy = imported(s_cupy);
  if (cupy) return cupy_stream(cupy, out);
  if (PyErr_Occurred()) return false;
  return t.tensor ? torch_stream(t, out) : true;
}

namespace {

// The CUstream of stream= (`stream`, borrowed; nullptr when not passed) for a call
// of these arguments: an int as it is, else stream_handle(stream), exactly as
// LazyKernel._run computes it (no stream: default_stream). False with an error set.
bool stream_of(PyObject* stream, PyObject* const* args, Py_ssize_t n, cu::CUstream* out) {
  if (stream && PyLong_CheckExact(stream)) {
    *out = static_cast<cu::CUstream>(PyLong_AsVoidPtr(stream));
    return !PyErr_Occurred();
  }
  if (!g_runtime && !(g_runtime = PyImport_ImportModule(seam::kKernelModule))) return false;
  PyObject* fn = PyObject_GetAttr(g_runtime, s_stream_handle);  // looked up per call, as Python does
  if (!fn) return false;
  if (!stream) stream = Py_None;
  if (stream == Py_None && fn == g_stream_handle) {  // not replaced: the rule needs no Python frame
    Py_DECREF(fn);
    return default_stream(args, n, out);
  }
  PyObject* s = PyObject_CallOneArg(fn, stream);
  Py_DECREF(fn);
  return stream_from(s, out);
}

// A bad stream= (stream_handle's TypeError): the same error, naming the kernel as
// LazyKernel._run's does. Other errors are left as they are.
void name_stream_error(PyObject* kernel) {
  if (!PyErr_ExceptionMatches(PyExc_TypeError)) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject* name = PyObject_GetAttrString(kernel, seam::kKernelName);
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

// -- plans ------------------------------------------------------------------------------

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

// The bound call of plan `p` into out[0 .. p->nargs + p->src.size()), borrowed:
// from the caller's arguments and the plan's defaults (the plan lives as long as the kernel).
void bind(const Plan* p, PyObject* const* args, PyObject** out) {
  Py_ssize_t n = p->nargs;
  for (Py_ssize_t i = 0; i < n; ++i) out[i] = args[i];
  for (size_t j = 0; j < p->src.size(); ++j) {
    Py_ssize_t s = p->src[j];
    out[n + Py_ssize_t(j)] = s >= 0 ? args[s] : PyTuple_GET_ITEM(p->defaults, -1 - s);
  }
}

// -- launching a bound call ----------------------------------------------------------------

// A bound call, and what Python is handed when it needs it.
struct Call {
  Launch* launch;
  LaunchBase* k;
  cu::CUstream stream;
  PyObject* const* args;
  Py_ssize_t n;
  PyObject* tuple = nullptr;       // owned, made on first use
  PyObject* stream_int = nullptr;  // owned, made on first use

  ~Call() {
    Py_XDECREF(tuple);
    Py_XDECREF(stream_int);
  }
  PyObject* args_tuple() { return tuple ? tuple : (tuple = tuple_of(args, n)); }
  PyObject* stream_obj() { return stream_int ? stream_int : (stream_int = PyLong_FromVoidPtr(stream)); }
};

using pyargs::StubResult;

// One stub's answer for the call; kUnresolved sets *key (a new reference).
StubResult call_stub(Call& c, const StubRef& s, PyObject** key) {
  if (s.entry.launch) {
    if (!c.k->table) {
      PyErr_SetString(PyExc_RuntimeError, "lazytriton: this kernel has no call table");
      return StubResult::kError;
    }
    return s.entry.launch(s.entry.stub, c.k->table, c.launch->grid, c.stream, c.args, c.n, key);
  }
  PyObject* args = c.args_tuple();
  PyObject* stream = args ? c.stream_obj() : nullptr;
  if (!stream) return StubResult::kError;
  PyObject* argv[5] = {nullptr, c.k->handle ? c.k->handle : Py_None, c.launch->grid, stream, args};
  PyObject* r = PyObject_Vectorcall(s.obj, argv + 1, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  if (!r) return StubResult::kError;
  if (r == Py_True || r == Py_None) {
    Py_DECREF(r);
    return r == Py_True ? StubResult::kLaunched : StubResult::kOtherShape;
  }
  *key = r;
  return StubResult::kUnresolved;
}

// LazyKernel._first_call(stub, key, args, stream, grid): the one crossing into
// Python of a call no stub can launch yet. 0: resolved, the stub launches it; 1:
// Python launched it (online tuning: a candidate timed on this call); -1 with an
// error set.
int first_call(Call& c, PyObject* stub, PyObject* key) {
  PyObject* args = c.args_tuple();
  PyObject* stream = args ? c.stream_obj() : nullptr;
  if (!stream) return -1;
  PyObject* argv[7] = {nullptr, c.launch->kernel, stub ? stub : Py_None, key ? key : Py_None, args, stream,
                       c.launch->grid};
  PyObject* r = PyObject_VectorcallMethod(s_first_call, argv + 1, 6 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  if (!r) return -1;
  int launched = r == Py_True;
  Py_DECREF(r);
  return launched;
}

// Tries the kernel's stubs in order: 1 if one launched (after the first call of
// its key if it had no winner yet), 0 if none takes the call, -1 on error.
int try_stubs(Call& c) {
  // Held for the loop: a stub runs Python (data_ptr(), a grid callable), which may replace k._stubs.
  PyObject* stubs = Py_NewRef(c.k->stubs);
  PyObject* refs = Py_NewRef(c.k->stub_refs);
  auto* table = static_cast<const std::vector<StubRef>*>(PyCapsule_GetPointer(refs, nullptr));
  int result = table ? 0 : -1;
  for (size_t i = 0; table && result == 0 && i < table->size(); ++i) {
    const StubRef& s = (*table)[i];
    PyObject* key = nullptr;
    StubResult r = call_stub(c, s, &key);
    if (r == StubResult::kUnresolved) {
      PyObject* again = nullptr;
      int first = first_call(c, s.obj, key);
      r = first < 0 ? StubResult::kError : first ? StubResult::kLaunched : call_stub(c, s, &again);
      if (r != StubResult::kLaunched && r != StubResult::kError) {
        PyErr_Format(PyExc_RuntimeError, "lazytriton: internal error: the call key %R was resolved but its stub "
                     "did not launch it", key);
        r = StubResult::kError;
      }
      Py_XDECREF(again);
    }
    Py_XDECREF(key);
    result = r == StubResult::kLaunched ? 1 : r == StubResult::kError ? -1 : 0;
  }
  Py_DECREF(refs);
  Py_DECREF(stubs);
  return result;
}

// Launches a bound call through the kernel's stubs; when none takes it, Python
// makes the stub of its argument shape (and resolves its key), and it is tried again.
PyObject* dispatch(Call& c) {
  int r = try_stubs(c);
  if (r == 0) {
    int first = first_call(c, nullptr, nullptr);
    r = first < 0 ? -1 : first ? 1 : try_stubs(c);
    if (r == 0) {
      PyErr_Format(PyExc_RuntimeError, "kernel %S: internal error: the stub made for these arguments rejected them",
                   c.launch->kernel);
      return nullptr;
    }
  }
  if (r < 0) return nullptr;
  Py_RETURN_NONE;
}

// What Python binds: kernel._run(grid, stream, args, kwargs) returns the call
// tuple and the stream as an int, then launched as a bound call.
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
  PyObject* call = PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2 ? PyTuple_GET_ITEM(r, 0) : nullptr;
  PyObject* s = call ? PyTuple_GET_ITEM(r, 1) : nullptr;
  if (!call || !PyTuple_Check(call) || !PyLong_Check(s)) {
    PyErr_Format(PyExc_RuntimeError, "kernel %S: internal error: _run returned %R, not (call tuple, stream)",
                 self->kernel, r);
    Py_DECREF(r);
    return nullptr;
  }
  Call c{self, reinterpret_cast<LaunchBase*>(self->kernel), static_cast<cu::CUstream>(PyLong_AsVoidPtr(s)),
         &PyTuple_GET_ITEM(call, 0), PyTuple_GET_SIZE(call), Py_NewRef(call), Py_NewRef(s)};
  Py_DECREF(r);
  return PyErr_Occurred() ? nullptr : dispatch(c);
}

}  // namespace

PyObject* tuple_of(PyObject* const* items, Py_ssize_t n) {
  PyObject* t = PyTuple_New(n);
  if (!t) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(items[i]));
  return t;
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
  if (k->python_heuristics || k->needs_probe || !k->stubs) return slow(self, args, nargs, kwnames);
  PyObject* const* call = args;
  Py_ssize_t n = nargs;
  PyObject* stream = nullptr;
  PyObject* inline_bound[kInlineArgs];
  std::vector<PyObject*> heap_bound;
  if (nargs != k->n_call || !(nkw == 0 || (nkw == 1 && is_stream(PyTuple_GET_ITEM(kwnames, 0))))) {
    const Plan* p = find_plan(k, nargs, kwnames);
    if (!p && PyErr_Occurred()) return nullptr;
    if (!p || p->never) return slow(self, args, nargs, kwnames);
    n = p->nargs + Py_ssize_t(p->src.size());
    PyObject** bound = inline_bound;
    if (n > kInlineArgs) {
      heap_bound.resize(size_t(n));
      bound = heap_bound.data();
    }
    bind(p, args, bound);
    call = bound;
    if (p->stream >= 0) stream = args[nargs + p->stream];
  } else if (nkw) {
    stream = args[nargs];
  }
  cu::CUstream s;
  if (!stream_of(stream, call, n, &s)) {
    name_stream_error(self->kernel);
    return nullptr;
  }
  Call c{self, k, s, call, n};
  return dispatch(c);
}

// -- Launch ------------------------------------------------------------------------------

namespace {

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

// lazytriton.runtime.kernel.stream_handle as runtime/kernel.py defines it, so that the
// launcher can tell it from a replacement (monkeypatching), which it then calls.
PyObject* register_stream_handle(PyObject*, PyObject* fn) {
  PyObject* old = g_stream_handle;
  g_stream_handle = Py_NewRef(fn);
  Py_XDECREF(old);
  Py_RETURN_NONE;
}

PyMethodDef register_def = {"register_stream_handle", register_stream_handle, METH_O,
                            "Tell the launcher which function is lazytriton.runtime.kernel.stream_handle."};

}  // namespace

PyTypeObject LaunchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

Launch* new_launch(PyObject* kernel, PyObject* grid) {
  Launch* self = PyObject_GC_New(Launch, &LaunchType);
  if (!self) return nullptr;
  self->kernel = Py_NewRef(kernel);
  self->grid = Py_NewRef(grid);
  self->vectorcall = launch_vectorcall;
  PyObject_GC_Track(self);
  return self;
}

bool init_names() {
  s_stream = PyUnicode_InternFromString("stream");
  s_run = PyUnicode_InternFromString(seam::kRun);
  s_first_call = PyUnicode_InternFromString(seam::kFirstCall);
  s_fast_plan = PyUnicode_InternFromString(seam::kFastPlan);
  s_modules = PyUnicode_InternFromString("modules");
  s_cupy = PyUnicode_InternFromString("cupy");
  s_torch = PyUnicode_InternFromString("torch");
  s_raw_stream = PyUnicode_InternFromString("_cuda_getCurrentRawStream");
  s_get_device = PyUnicode_InternFromString("_cuda_getDevice");
  s_stream_handle = PyUnicode_InternFromString(seam::kStreamHandle);
  s_get = PyUnicode_InternFromString("get");
  g_sys = PyImport_ImportModule("sys");
  return s_stream && s_run && s_first_call && s_fast_plan && s_modules && s_cupy && s_torch && s_raw_stream &&
         s_get_device && s_stream_handle && s_get && g_sys;
}

PyObject* register_stream_handle_function() { return PyCFunction_New(&register_def, nullptr); }

namespace {
// _core.default_stream(args) -> int: default_stream for Python's callers (LazyKernel.resolve, _run).
PyObject* default_stream_py(PyObject*, PyObject* args) {
  if (!PyTuple_Check(args)) {
    PyErr_SetString(PyExc_TypeError, "default_stream(args): args must be the call tuple");
    return nullptr;
  }
  cu::CUstream s;
  if (!default_stream(&PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), &s)) return nullptr;
  return PyLong_FromVoidPtr(s);
}
PyMethodDef default_stream_def = {"default_stream", default_stream_py, METH_O,
                                  "The CUstream a call of these arguments launches on when it names none."};
}  // namespace

PyObject* default_stream_function() { return PyCFunction_New(&default_stream_def, nullptr); }

bool ready_launch_type() {
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

}  // namespace lt::launcher
