// Reading kernel arguments from Python objects on the launch hot path, shared
// by the _core module and the launch stubs (generated and table-driven): arrays
// (array_reads.h), host tensor descriptors, ints, floats, constexprs and the
// grid. Every helper answers "does this object match the stub's signature?" in
// a few pointer compares once its type and dtype have been seen. Reading only:
// how a value is packed and keyed is encode.h's, shared with the C++ bundles.
#pragma once
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "array_reads.h"
#include "lazytriton/encode.h"
#include "lazytriton/resolve_table.h"
#include "lazytriton/tensor_desc.h"

namespace lt::pyargs {

// Whether objects of this type are host tensor descriptors (decided once per
// type by lazytriton.model.arrays.is_tensor_descriptor).
inline bool is_tensor_desc_type(PyObject* obj) {
  static IdentityCache<16> cache;
  return answer_per_type(cache, lt::seam::kIsTensorDescriptor, obj) == 1;
}

// A value Triton's binder folds into a constexpr when it is passed for a
// parameter not declared tl.constexpr: None, a tl.constexpr, a @triton.jit
// function (decided once per type by lazytriton.model.arrays.is_folded_constexpr).
// A slot made from such a value takes only such values (specialize.Slot.folded).
inline bool is_folded_constexpr(PyObject* obj) {
  if (obj == Py_None) return true;
  static IdentityCache<16> cache;
  return answer_per_type(cache, lt::seam::kIsFoldedConstexpr, obj) == 1;
}

// `n` ints from a sequence attribute (list, tuple, torch.Size; items with __index__).
inline bool read_ints(PyObject* obj, PyObject* attr, int n, int64_t* out) {
  PyObject* seq = PyObject_GetAttr(obj, attr);
  PyObject* fast = seq ? PySequence_Fast(seq, "") : nullptr;
  Py_XDECREF(seq);
  bool ok = fast && PySequence_Fast_GET_SIZE(fast) == n;
  for (int i = 0; ok && i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
    int overflow = 0;
    if (PyLong_Check(item)) {
      out[i] = PyLong_AsLongLongAndOverflow(item, &overflow);
    } else {
      PyObject* idx = PyNumber_Index(item);
      out[i] = idx ? PyLong_AsLongLongAndOverflow(idx, &overflow) : -1;
      ok = idx != nullptr;
      Py_XDECREF(idx);
    }
    ok = ok && !overflow && !(out[i] == -1 && PyErr_Occurred());
  }
  Py_XDECREF(fast);
  if (!ok) PyErr_Clear();
  return ok;
}

// A host tensor descriptor argument of element type `want_dtype` and rank
// `rank`, valid as a descriptor (tensor_desc.h check_tensor_desc). False means
// "not this stub's signature": Python's slow path then names the problem. Its
// base's device is folded into `devices` (array_reads.h fold_device).
inline bool get_tensor_desc(PyObject* obj, int want_dtype, int rank, HostTensorDesc* d, int* devices) {
  if (!is_tensor_desc_type(obj)) return false;
  const Names& n = names();
  PyObject* base = PyObject_GetAttr(obj, n.base);
  bool ok = base && get_pointer(base, want_dtype, &d->base, devices);
  Py_XDECREF(base);
  if (!ok) return PyErr_Clear(), false;
  d->dtype = want_dtype;
  d->rank = rank;
  if (!read_ints(obj, n.shape, rank, d->shape) || !read_ints(obj, n.strides, rank, d->strides) ||
      !read_ints(obj, n.block_shape, rank, d->block))
    return false;
  PyObject* padding = PyObject_GetAttr(obj, n.padding);
  ok = padding && PyUnicode_Check(padding);
  d->nan_padding = ok && PyUnicode_CompareWithASCIIString(padding, "nan") == 0;
  ok = ok && (d->nan_padding || PyUnicode_CompareWithASCIIString(padding, "zero") == 0);
  Py_XDECREF(padding);
  if (!ok) return PyErr_Clear(), false;
  PyObject* tf32 = PyObject_GetAttr(obj, n.tf32);  // absent in Triton 3.5/3.6: False
  d->tf32 = tf32 == Py_True;
  if (!tf32) PyErr_Clear();
  Py_XDECREF(tf32);
  return check_tensor_desc(*d).empty();
}

// A descriptor as params(args) reports it: (base, dtype, shape, strides,
// block, nan padding, tf32), the tuple lazytriton.model.tensor_desc reads too.
inline PyObject* desc_tuple(const HostTensorDesc& d) {
  auto ints = [&](const int64_t* v) {
    PyObject* t = PyTuple_New(d.rank);
    for (int i = 0; t && i < d.rank; ++i) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(v[i]));
    return t;
  };
  return Py_BuildValue("(KiNNNOO)", (unsigned long long)d.base, d.dtype, ints(d.shape), ints(d.strides),
                       ints(d.block), d.nan_padding ? Py_True : Py_False, d.tf32 ? Py_True : Py_False);
}

// -- where a call launches ------------------------------------------------------------------
// A stub launches in the current context (kernel.cc), on its device. A call whose arrays
// are all there (the devices its reads folded, array_reads.h) launches at once; else each
// pointer must pass Triton's own check (accessible()), and a call with one that does not
// is "not this stub's": Python then refuses it, naming the argument and both devices.

// The current context and its device, or nullptr when the driver cannot say (the
// launch itself then reports why).
inline cu::CUcontext launch_context(int* device) noexcept {
  try {
    cu::CUcontext ctx = current_context();
    *device = launch_device(ctx);
    return ctx;
  } catch (...) {
    return nullptr;
  }
}

// Whether a kernel in the current context may read `ptr` (a null pointer always).
inline bool accessible(uint64_t ptr) noexcept { return ptr == 0 || pointer_accessible(ptr); }

// An int or a bool as the encoders take it (encode.h): false (no error set)
// for anything else, and for ints outside [-2**63, 2**64 - 1].
inline bool read_int(PyObject* obj, IntVal* v) {
  if (!PyLong_Check(obj)) return false;
  v->is_bool = PyBool_Check(obj);
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(obj, &overflow);
  v->big = overflow > 0;
  if (overflow < 0) return false;
  if (overflow > 0) {
    v->bits = PyLong_AsUnsignedLongLong(obj);
    if (PyErr_Occurred()) return PyErr_Clear(), false;
  } else {
    v->bits = uint64_t(x);
  }
  return true;
}

// A float argument (an unannotated parameter: Python floats only).
inline bool get_float(PyObject* obj, double* value) {
  if (!PyFloat_Check(obj)) return false;
  *value = PyFloat_AS_DOUBLE(obj);
  return true;
}

// A number for a float-annotated parameter: a float, an int or a bool, as
// Triton's launcher converts it (PyFloat_AsDouble).
inline bool get_real(PyObject* obj, double* value) {
  if (PyFloat_Check(obj)) {
    *value = PyFloat_AS_DOUBLE(obj);
    return true;
  }
  if (!PyLong_Check(obj)) return false;
  *value = PyLong_AsDouble(obj);
  if (*value == -1.0 && PyErr_Occurred()) return PyErr_Clear(), false;  // beyond a double
  return true;
}

// Key of a constexpr object that is not None/bool/int/float: the index of its
// value in lazytriton.model.arrays' per-process table (equal values, one index; the
// table keeps every value alive). The objects seen last are remembered here by
// identity, kept alive too. False: Python failed (no error left set).
inline bool constexpr_index(PyObject* obj, uint64_t* index) {
  static IdentityCache<64> seen;
  int i;
  if (seen.get(obj, &i)) return *index = uint64_t(i), true;
  i = ask_python(lt::seam::kConstexprIndex, obj);
  if (i < 0) return PyErr_Clear(), false;
  seen.put(obj, i);
  *index = uint64_t(i);
  return true;
}

// Two key words for a constexpr argument: exact for None/bool/int/float, the
// interned value's index for anything else (5), or, should Python fail, the
// object's address with the object kept alive for good (6).
inline void constexpr_key(PyObject* obj, uint64_t* w) {
  int overflow = 0;
  if (obj == Py_None) {
    w[0] = 1, w[1] = 0;
  } else if (PyBool_Check(obj)) {
    w[0] = 2, w[1] = obj == Py_True;
  } else if (PyLong_Check(obj) && (w[1] = uint64_t(PyLong_AsLongLongAndOverflow(obj, &overflow)), !overflow)) {
    w[0] = 3;
  } else if (PyFloat_Check(obj)) {
    double d = PyFloat_AS_DOUBLE(obj);
    std::memcpy(&w[1], &d, 8);
    w[0] = 4;
  } else {
    PyErr_Clear();
    if (constexpr_index(obj, &w[1])) {
      w[0] = 5;
    } else {
      Py_INCREF(obj);
      w[0] = 6, w[1] = reinterpret_cast<uint64_t>(obj);
    }
  }
}

// One grid dimension: an int (or an object with __index__) in [0, 2**31 - 1].
// 0: fine; 1: not an int; 2: out of range.
inline int grid_dim(PyObject* v, unsigned* out) {
  int overflow = 0;
  long long d = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : PyLong_AsLongLong(v);
  if (d == -1 && PyErr_Occurred()) {
    bool type_error = PyErr_ExceptionMatches(PyExc_TypeError);
    PyErr_Clear();
    return type_error ? 1 : 2;
  }
  if (overflow || d < 0 || d > 0x7fffffffLL) return 2;
  *out = unsigned(d);
  return 0;
}

// Grid from an int or a tuple/list of 1 to 3 ints. Returns false with a Python
// exception set on bad input, naming the kernel when `kernel` is given (and the
// grid callable when `from` is the callable that returned `grid`).
inline bool read_grid(PyObject* grid, Dim3* out, const char* kernel = nullptr, PyObject* from = nullptr) {
  int bad = 0;  // 1: an entry is not an int; 2: an entry out of range; 3: not an int or a sequence; 4: not 1 to 3 entries
  if (PyLong_Check(grid)) {
    bad = grid_dim(grid, &out->x);
  } else if (PyTuple_Check(grid) || PyList_Check(grid)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(grid);
    PyObject** items = PySequence_Fast_ITEMS(grid);
    unsigned* dims[3] = {&out->x, &out->y, &out->z};
    if (n < 1 || n > 3) bad = 4;
    for (Py_ssize_t i = 0; !bad && i < n; ++i) bad = grid_dim(items[i], dims[i]);
  } else {
    bad = 3;
  }
  if (!bad) return true;
  const char* why = bad == 1   ? "each grid dimension must be an int"
                    : bad == 2 ? "each grid dimension must be in [0, 2**31 - 1]"
                               : "a grid is an int or a tuple of 1 to 3 non-negative ints";
  PyObject* type = bad == 2 || bad == 4 ? PyExc_ValueError : PyExc_TypeError;
  std::string prefix = kernel ? std::string("kernel ") + kernel + ": " : std::string();
  if (from)
    PyErr_Format(type, "%sbad grid %R (returned by the grid callable %R): %s", prefix.c_str(), grid, from, why);
  else
    PyErr_Format(type, "%sbad grid %R: %s", prefix.c_str(), grid, why);
  return false;
}

// The meta dict a grid callable sees: the call's arguments by name plus the
// winning config's meta-parameters (stored as Entry::user).
inline PyObject* grid_meta(const Entry& e, PyObject* const* names, PyObject* const* args, Py_ssize_t n) {
  PyObject* base = static_cast<PyObject*>(e.user.get());
  PyObject* d = base ? PyDict_Copy(base) : PyDict_New();
  if (!d) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i)
    if (PyDict_SetItem(d, names[i], args[i]) < 0) return Py_DECREF(d), nullptr;
  return d;
}

inline bool eval_grid(PyObject* grid, const Entry& e, PyObject* const* names, PyObject* const* args, Py_ssize_t n,
                      Dim3* out, const char* kernel = nullptr) {
  if (!PyCallable_Check(grid)) return read_grid(grid, out, kernel);
  PyObject* meta = grid_meta(e, names, args, n);
  if (!meta) return false;
  PyObject* g = PyObject_CallOneArg(grid, meta);
  Py_DECREF(meta);
  if (!g) return false;
  bool ok = read_grid(g, out, kernel, grid);
  Py_DECREF(g);
  return ok;
}

}  // namespace lt::pyargs
