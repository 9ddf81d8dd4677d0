// The C half of lazytriton.LazyKernel, shared by its two files:
//
//   launch_base.cc  _core.LaunchBase, the base class of LazyKernel: the fields
//                   the hot path reads (C slots that LazyKernel's own attribute
//                   assignments write), `k[grid]` and `k.run(...)`.
//   launcher.cc     _core.Launch, what `k[grid]` returns: its call binds the
//                   arguments, converts stream= and launches through the
//                   kernel's stubs, and hands a call it cannot launch yet to
//                   Python, once.
//
// Only the public C API on the hot path; every object it touches is owned or
// kept alive by a reference it holds across any call that may run Python.
#pragma once
#include <Python.h>

#include <vector>

#include "lazytriton/resolve_table.h"
#include "seam.h"
#include "stub_protocol.h"

namespace lt::launcher {

constexpr int kMaxPlans = 16;

// How the call of a keyword call is bound (see LazyKernel._fast_plan).
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

// One stub of k._stubs: its C entry, or (entry.launch null) a Python callable
// launch(handle, grid, stream, args) (the tests' stand-ins use that protocol).
struct StubRef {
  pyargs::StubEntry entry;
  PyObject* obj;  // borrowed from the tuple that holds the stubs
};

struct LaunchBase {
  PyObject_HEAD
  PyObject* stubs;              // tuple of the stub objects, tried in order
  PyObject* stub_refs;          // capsule of their StubRef array (no references: `stubs` holds them)
  PyObject* handle;             // int: address of the C++ lt::ResolveTable
  ResolveTable* table;          // the same, read
  bool python_heuristics;       // the fast path runs only while both are false
  bool needs_probe;
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

extern PyTypeObject LaunchBaseType;
extern PyTypeObject LaunchType;

// launcher.cc
bool ready_launch_type();
bool init_names();
PyObject* register_stream_handle_function();  // _core.register_stream_handle
PyObject* default_stream_function();          // _core.default_stream
// The stream of a call of these arguments that names none (launcher.cc says the rule).
bool default_stream(PyObject* const* args, Py_ssize_t n, cu::CUstream* out);
Launch* new_launch(PyObject* kernel, PyObject* grid);
PyObject* launch_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames);
PyObject* tuple_of(PyObject* const* items, Py_ssize_t n);

// launch_base.cc: the stub refs of `stubs` (a capsule, nullptr with an error set).
PyObject* stub_refs_of(PyObject* stubs);

}  // namespace lt::launcher
