// Reading kernel arguments from Python objects on the launch hot path, shared
// by the _core module and the generated stubs. Plain CPython API: every helper
// answers "does this object match the stub's signature?" in a few pointer
// compares once its type and dtype have been seen.
#pragma once
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "lazytriton/lazy_kernel.h"

namespace lt::pyargs {

// How to read the device pointer of an array-like type; decided once per
// Python type by lazytriton.arrays.pointer_strategy.
enum Strategy : int { kNotArray = 0, kDataPtrMethod = 1, kDataDotPtr = 2, kCudaArrayInterface = 3, kDLPack = 4 };

// Attribute names, interned once: PyObject_GetAttrString would build a new
// string object on every launch.
inline PyObject* name(const char* s) { return PyUnicode_InternFromString(s); }
struct Names {
  PyObject* dtype = name("dtype");
  PyObject* data_ptr = name("data_ptr");
  PyObject* data = name("data");
  PyObject* ptr = name("ptr");
  PyObject* cai = name("__cuda_array_interface__");
  PyObject* dlpack = name("__dlpack__");
};
inline const Names& names() {
  static Names n;
  return n;
}

inline PyObject* arrays_module() {
  static PyObject* mod = PyImport_ImportModule("lazytriton.arrays");
  return mod;
}

// Small caches keyed by object identity; the objects are kept alive so that
// identity stays meaningful.
template <int N>
struct IdentityCache {
  PyObject* keys[N] = {};
  int values[N] = {};
  int n = 0;
  bool get(PyObject* k, int* v) const {
    for (int i = 0; i < n; ++i)
      if (keys[i] == k) return *v = values[i], true;
    return false;
  }
  void put(PyObject* k, int v) {
    if (n == N) return;  // full: later lookups go to Python, still correct
    Py_INCREF(k);
    keys[n] = k;
    values[n++] = v;
  }
};

inline int ask_python(const char* fn, PyObject* arg) {
  PyObject* mod = arrays_module();
  if (!mod) return -1;
  PyObject* r = PyObject_CallMethod(mod, fn, "O", arg);
  if (!r) return -1;
  long v = PyLong_AsLong(r);
  Py_DECREF(r);
  return int(v);
}

inline int strategy_of(PyObject* obj) {
  static IdentityCache<32> cache;
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
  int s;
  if (cache.get(type, &s)) return s;
  s = ask_python("pointer_strategy", obj);
  if (s < 0) {
    PyErr_Clear();
    return kNotArray;
  }
  cache.put(type, s);
  return s;
}

// Triton dtype id (lazytriton.arrays.DTYPE_IDS) of a dtype object.
inline int dtype_id(PyObject* dtype) {
  static IdentityCache<64> cache;
  int id;
  if (cache.get(dtype, &id)) return id;
  id = ask_python("dtype_id", dtype);
  if (id < 0) {
    PyErr_Clear();
    return -1;
  }
  cache.put(dtype, id);
  return id;
}

inline bool read_u64(PyObject* v, uint64_t* out) {
  if (!v || !PyLong_Check(v)) return false;
  *out = PyLong_AsUnsignedLongLong(v);
  if (*out == uint64_t(-1) && PyErr_Occurred()) return PyErr_Clear(), false;
  return true;
}

struct DLDataType_ { uint8_t code, bits; uint16_t lanes; };
struct DLTensor_ {
  void* data;
  int32_t device_type, device_id;
  int32_t ndim;
  DLDataType_ dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
};

inline bool pointer_of(PyObject* obj, int strategy, uint64_t* ptr) {
  PyObject* v = nullptr;
  bool ok = false;
  switch (strategy) {
    case kDataPtrMethod:
      v = PyObject_CallMethodNoArgs(obj, names().data_ptr);
      ok = read_u64(v, ptr);
      break;
    case kDataDotPtr: {
      PyObject* mem = PyObject_GetAttr(obj, names().data);
      if (mem) v = PyObject_GetAttr(mem, names().ptr);
      Py_XDECREF(mem);
      ok = read_u64(v, ptr);
      break;
    }
    case kCudaArrayInterface: {
      PyObject* cai = PyObject_GetAttr(obj, names().cai);
      PyObject* data = cai && PyDict_Check(cai) ? PyDict_GetItemString(cai, "data") : nullptr;
      ok = data && PyTuple_Check(data) && PyTuple_GET_SIZE(data) > 0 && read_u64(PyTuple_GET_ITEM(data, 0), ptr);
      Py_XDECREF(cai);
      break;
    }
    case kDLPack: {
      v = PyObject_CallMethodNoArgs(obj, names().dlpack);
      auto* t = v && PyCapsule_IsValid(v, "dltensor")
                    ? static_cast<DLTensor_*>(PyCapsule_GetPointer(v, "dltensor"))
                    : nullptr;
      if (t) *ptr = reinterpret_cast<uint64_t>(t->data) + t->byte_offset;
      ok = t != nullptr;
      break;
    }
    default:
      break;
  }
  Py_XDECREF(v);
  if (!ok) PyErr_Clear();
  return ok;
}

// A pointer argument: the object must be an array-like whose dtype is
// `want_dtype`. False means "not this stub's signature".
inline bool get_pointer(PyObject* obj, int want_dtype, uint64_t* ptr) {
  int s = strategy_of(obj);
  if (s == kNotArray) return false;
  PyObject* dt = PyObject_GetAttr(obj, names().dtype);
  if (!dt) return PyErr_Clear(), false;
  int id = dtype_id(dt);
  Py_DECREF(dt);
  return id == want_dtype && pointer_of(obj, s, ptr);
}

// Integer arguments, in Triton's classes: i32, then i64, then u64.
enum IntClass { kI32 = 0, kI64 = 1, kU64 = 2 };
inline bool get_int(PyObject* obj, IntClass cls, int64_t* value) {
  if (!PyLong_Check(obj) || PyBool_Check(obj)) return false;
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow < 0) return false;
  if (overflow > 0) {
    if (cls != kU64) return false;
    unsigned long long u = PyLong_AsUnsignedLongLong(obj);
    if (PyErr_Occurred()) return PyErr_Clear(), false;
    std::memcpy(value, &u, 8);
    return true;
  }
  bool i32 = v >= INT32_MIN && v <= INT32_MAX;
  bool ok = cls == kI32 ? i32 : cls == kI64 ? !i32 : false;
  *value = v;
  return ok;
}

// An integer for a parameter whose type is fixed by its annotation ("i32", ...).
inline bool get_int_in(PyObject* obj, const char* type, int64_t* value) {
  if (!PyLong_Check(obj) || PyBool_Check(obj)) return false;
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow) {
    if (overflow < 0 || std::strcmp(type, "u64") != 0) return false;
    unsigned long long u = PyLong_AsUnsignedLongLong(obj);
    if (PyErr_Occurred()) return PyErr_Clear(), false;
    std::memcpy(value, &u, 8);
    return true;
  }
  *value = v;
  std::string t(type);
  if (t == "i32") return v >= INT32_MIN && v <= INT32_MAX;
  if (t == "u32") return v >= 0 && v <= UINT32_MAX;
  if (t == "i16") return v >= INT16_MIN && v <= INT16_MAX;
  if (t == "u16") return v >= 0 && v <= UINT16_MAX;
  if (t == "i8") return v >= INT8_MIN && v <= INT8_MAX;
  if (t == "u8") return v >= 0 && v <= UINT8_MAX;
  if (t == "u64") return v >= 0;
  return t == "i64";
}

inline bool get_float(PyObject* obj, double* value) {
  if (!PyFloat_Check(obj)) return false;
  *value = PyFloat_AS_DOUBLE(obj);
  return true;
}

inline bool get_bool(PyObject* obj, bool* value) {
  if (!PyBool_Check(obj)) return false;
  *value = obj == Py_True;
  return true;
}

// Two key words for a constexpr argument: exact for None/bool/int/float,
// identity for anything else (an equal object elsewhere just resolves again).
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
    w[0] = 5, w[1] = reinterpret_cast<uint64_t>(obj);
  }
}

inline unsigned grid_dim(PyObject* v, bool* ok) {
  long long d = PyLong_AsLongLong(v);
  if (d == -1 && PyErr_Occurred()) return *ok = false, 0;
  if (d < 0 || d > 0x7fffffffLL) return *ok = false, 0;
  return unsigned(d);
}

// Grid from an int, a sequence of up to 3 ints, or a callable of the meta dict.
// Returns false with a Python exception set on bad input.
inline bool read_grid(PyObject* grid, Dim3* out) {
  bool ok = true;
  if (PyLong_Check(grid)) {
    out->x = grid_dim(grid, &ok);
  } else if (PyTuple_Check(grid) || PyList_Check(grid)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(grid);
    if (n < 1 || n > 3) ok = false;
    PyObject** items = PySequence_Fast_ITEMS(grid);
    unsigned* dims[3] = {&out->x, &out->y, &out->z};
    for (Py_ssize_t i = 0; ok && i < n; ++i) *dims[i] = grid_dim(items[i], &ok);
  } else {
    ok = false;
  }
  if (!ok && !PyErr_Occurred())
    PyErr_SetString(PyExc_ValueError, "grid must be an int or a tuple of 1 to 3 non-negative ints");
  return ok;
}

// The meta dict a grid callable sees: the call's arguments by name plus the
// winning config's meta-parameters (stored as Entry::user).
inline PyObject* grid_meta(const Entry& e, PyObject* const* names, PyObject* args, Py_ssize_t n) {
  PyObject* base = static_cast<PyObject*>(e.user.get());
  PyObject* d = base ? PyDict_Copy(base) : PyDict_New();
  if (!d) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i)
    if (PyDict_SetItem(d, names[i], PyTuple_GET_ITEM(args, i)) < 0) return Py_DECREF(d), nullptr;
  return d;
}

inline bool eval_grid(PyObject* grid, const Entry& e, PyObject* const* names, PyObject* args, Py_ssize_t n,
                      Dim3* out) {
  if (!PyCallable_Check(grid)) return read_grid(grid, out);
  PyObject* meta = grid_meta(e, names, args, n);
  if (!meta) return false;
  PyObject* g = PyObject_CallOneArg(grid, meta);
  Py_DECREF(meta);
  if (!g) return false;
  bool ok = read_grid(g, out);
  Py_DECREF(g);
  return ok;
}

// Raises the C++ error as a Python RuntimeError (message names kernel + CUDA error).
inline PyObject* raise(const std::exception& e) {
  PyErr_SetString(PyExc_RuntimeError, e.what());
  return nullptr;
}

}  // namespace lt::pyargs
