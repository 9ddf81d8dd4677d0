// The launch stubs' protocol: the C entry through which the launcher
// (launcher.cc) calls a stub, the Python face of the same entry, and how a
// launch error becomes a Python exception. Included by every stub (the
// generated ones and the table-driven one) and by lazytriton._core.
#pragma once
#include <Python.h>

#include <cstring>
#include <exception>
#include <string>

#include "python_args.h"

namespace lt::pyargs {

// A launch stub reads one argument shape. The launcher calls it through its C
// entry, with the bound call as an array (no Python call, no tuple, no ints to
// convert); Python and the tests call the same entry through the stub's
// launch(handle, grid, stream, args).
enum class StubResult : int {
  kError = -1,      // a Python error is set
  kOtherShape = 0,  // not this stub's argument shape
  kLaunched = 1,
  kUnresolved = 2,  // no winner for its call key yet: *key is set (a new reference)
};

struct StubEntry {
  // Reads args[0..n), finds the winner of their call key in `table` and launches it on `stream`.
  StubResult (*launch)(const void* stub, ResolveTable* table, PyObject* grid, cu::CUstream stream,
                       PyObject* const* args, Py_ssize_t n, PyObject** key);
  const void* stub;  // the stub's own data (the table-driven stub's slot table)
};
// A stub exposes its entry as the attribute `entry`: a capsule of this name,
// valid while the stub object lives.
constexpr const char* kStubEntryCapsule = "lazytriton.stub_entry";

// The items of a call tuple. Anything else is no argument shape's (the stubs
// answer None): n = -1.
inline void call_items(PyObject* args, PyObject* const** items, Py_ssize_t* n) {
  bool tuple = PyTuple_Check(args);
  *items = tuple ? &PyTuple_GET_ITEM(args, 0) : nullptr;
  *n = tuple ? PyTuple_GET_SIZE(args) : -1;
}

// A key tuple from its words.
inline PyObject* key_tuple(const uint64_t* key, size_t n) {
  PyObject* t = PyTuple_New(Py_ssize_t(n));
  for (size_t i = 0; t && i < n; ++i) {
    PyObject* w = PyLong_FromUnsignedLongLong(key[i]);
    if (!w) return Py_DECREF(t), nullptr;
    PyTuple_SET_ITEM(t, Py_ssize_t(i), w);
  }
  return t;
}

// A stub's launch(handle, grid, stream, args) -> True (launched), the call key
// (no winner yet: resolve it, then call again) or None (another argument shape).
inline PyObject* launch_from_python(const StubEntry& entry, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 4 || !entry.launch) {
    PyErr_SetString(PyExc_TypeError, argc != 4 ? "launch(handle, grid, stream, args)" : "an uninitialized stub");
    return nullptr;
  }
  auto* table = static_cast<ResolveTable*>(PyLong_AsVoidPtr(argv[0]));
  auto stream = static_cast<cu::CUstream>(PyLong_AsVoidPtr(argv[2]));
  if (PyErr_Occurred()) return nullptr;
  PyObject* const* items;
  Py_ssize_t n;
  call_items(argv[3], &items, &n);
  if (!table) {
    PyErr_SetString(PyExc_ValueError, "launch: handle is not a call table's");
    return nullptr;
  }
  PyObject* key = nullptr;
  switch (entry.launch(entry.stub, table, argv[1], stream, items, n, &key)) {
    case StubResult::kLaunched:
      Py_RETURN_TRUE;
    case StubResult::kOtherShape:
      Py_RETURN_NONE;
    case StubResult::kUnresolved:
      return key;
    default:
      return nullptr;
  }
}

// lazytriton.RuntimeFailure (registered by lazytriton._core for lt::Error),
// looked up once; RuntimeError should that fail.
inline PyObject* runtime_failure() {
  static PyObject* type = nullptr;  // set under the GIL; kept for the life of the process
  if (!type) {
    PyObject* core = PyImport_ImportModule("lazytriton._core");
    PyObject* t = core ? PyObject_GetAttrString(core, "RuntimeFailure") : nullptr;
    Py_XDECREF(core);
    if (!t || !PyExceptionClass_Check(t)) {
      PyErr_Clear();
      Py_XDECREF(t);
      t = Py_NewRef(PyExc_RuntimeError);
    }
    if (type) Py_DECREF(t);  // another thread got there first (the import can switch threads)
    else type = t;
  }
  return type;
}

// Raises a C++ error of a launch as a Python exception whose message names the
// kernel: lazytriton.RuntimeFailure for lazytriton's own errors (lt::Error), else
// RuntimeError.
inline PyObject* raise(const std::exception& e, const char* kernel = nullptr) {
  PyObject* type = dynamic_cast<const Error*>(&e) ? runtime_failure() : PyExc_RuntimeError;
  std::string prefix = std::string("kernel ") + (kernel ? kernel : "");
  if (kernel && std::strncmp(e.what(), prefix.c_str(), prefix.size()) != 0)
    PyErr_Format(type, "kernel %s: %s", kernel, e.what());
  else
    PyErr_SetString(type, e.what());
  return nullptr;
}

}  // namespace lt::pyargs
