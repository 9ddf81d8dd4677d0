// Reading array arguments from Python objects on the launch hot path, shared
// by lazytriton._core, the launch stubs and the torch reader: per Python type,
// how to find an array's device pointer (lazytriton.core.arrays decides once)
// and how each attribute is read (its descriptor, called directly); per dtype
// object, its Triton dtype. CPython's C API only.
#pragma once
#include <Python.h>
#include <structmember.h>  // PyMember_GetOne before Python 3.12

#include <cstdint>
#include <utility>

namespace lt::pyargs {

// How to read the device pointer of an array-like type; decided once per
// Python type by lazytriton.core.arrays.pointer_strategy.
enum Strategy : int {
  kNotArray = 0,
  kDataPtrMethod = 1,
  kDataDotPtr = 2,
  kCudaArrayInterface = 3,
  kDLPack = 4,
  kTorch = 5,  // data_ptr() once is_cuda is True: a host tensor has a data_ptr() too
};

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
  PyObject* is_cuda = name("is_cuda");
  // Tensor descriptors (Triton's TensorDescriptor and lazytriton's)
  PyObject* base = name("base");
  PyObject* shape = name("shape");
  PyObject* strides = name("strides");
  PyObject* block_shape = name("block_shape");
  PyObject* padding = name("padding");
  PyObject* tf32 = name("round_f32_to_tf32");
};
inline const Names& names() {
  static Names n;
  return n;
}

inline PyObject* arrays_module() {
  static PyObject* mod = PyImport_ImportModule("lazytriton.core.arrays");
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
  PyObject* r = PyObject_CallMethod(mod, fn, "(O)", arg);  // "(O)": a tuple `arg` is one argument too
  if (!r) return -1;
  long v = PyLong_AsLong(r);
  Py_DECREF(r);
  return int(v);
}

// lazytriton.core.arrays.<fn>(obj), asked once per type of `obj` and kept in
// `cache`; -1 (no Python error left set) if Python could not answer.
template <int N>
inline int answer_per_type(IdentityCache<N>& cache, const char* fn, PyObject* obj) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
  int v;
  if (cache.get(type, &v)) return v;
  v = ask_python(fn, obj);
  if (v < 0) return PyErr_Clear(), -1;
  cache.put(type, v);
  return v;
}

inline int strategy_of(PyObject* obj) {
  static IdentityCache<32> cache;
  int s = answer_per_type(cache, "pointer_strategy", obj);
  return s < 0 ? kNotArray : s;
}

// Triton dtype id (lazytriton.core.arrays.DTYPE_IDS) of a dtype object.
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

// -- attribute reads -----------------------------------------------------------------
// The attributes a launch reads of each array (dtype, .data.ptr, data_ptr(), is_cuda)
// are looked up once per type and then read by calling their descriptor directly, as
// CPython's own specialized attribute loads do: a C getter (getset), a C slot
// (member) or a C method taking no arguments (when instances have no __dict__ to
// shadow it). That skips the generic lookup, most of an attribute read's cost for
// CuPy's and torch's C getters (measured: 85 -> 28 ns for CuPy's three reads, H200
// host). A plan holds while the type's version tag is unchanged: any change to the
// type or its bases changes the tag. Anything else (a Python property or method, an
// instance attribute, a type with its own __getattribute__) is read through
// PyObject_GetAttr, as before.
struct AttrPlan {
  PyTypeObject* type = nullptr;  // a reference: identity stays meaningful
  unsigned int version = 0;
  PyObject* descr = nullptr;  // a reference; nullptr: read generically
  enum Kind : uint8_t { kGeneric, kGetSet, kMember, kMethod } kind = kGeneric;
};

template <int N>
struct AttrPlans {
  AttrPlan rows[N];
  int n = 0;
};

inline bool version_is(PyTypeObject* t, unsigned int v) {
  return (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && t->tp_version_tag == v;
}

inline PyObject* type_dict(PyTypeObject* t) {  // a new reference, or nullptr
#if PY_VERSION_HEX >= 0x030C0000
  return PyType_GetDict(t);  // static builtin types keep theirs per interpreter
#else
  return Py_XNewRef(t->tp_dict);
#endif
}

// The plan for obj.<name> on objects of type t: the descriptor the generic lookup
// finds first on t's MRO, kept if it is one that may be called directly.
inline AttrPlan plan_attr(PyTypeObject* t, PyObject* name, bool method) {
  AttrPlan p;
  p.type = t;
  p.version = t->tp_version_tag;
  if (t->tp_getattro != PyObject_GenericGetAttr || !(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return p;
  PyObject* mro = t->tp_mro;
  PyObject* found = nullptr;
  for (Py_ssize_t i = 0; mro && PyTuple_Check(mro) && !found && i < PyTuple_GET_SIZE(mro); ++i) {
    PyObject* dict = type_dict(reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i)));
    if (!dict) return PyErr_Clear(), p;  // cannot see this base: read generically
    found = Py_XNewRef(PyDict_GetItemWithError(dict, name));
    Py_DECREF(dict);
    if (!found && PyErr_Occurred()) return PyErr_Clear(), p;
  }
  if (!found) return p;
  if (Py_IS_TYPE(found, &PyGetSetDescr_Type) && reinterpret_cast<PyGetSetDescrObject*>(found)->d_getset->get) {
    p.kind = AttrPlan::kGetSet;
  } else if (Py_IS_TYPE(found, &PyMemberDescr_Type)) {
    p.kind = AttrPlan::kMember;
  } else if (method && Py_IS_TYPE(found, &PyMethodDescr_Type) && t->tp_dictoffset == 0 &&
             (reinterpret_cast<PyMethodDescrObject*>(found)->d_method->ml_flags & METH_NOARGS)) {
    p.kind = AttrPlan::kMethod;
  }
  if (p.kind == AttrPlan::kGeneric) return Py_DECREF(found), p;
  p.descr = found;
  return p;
}

inline PyObject* read_generic(PyObject* obj, PyObject* name, bool method) {
  return method ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
}

// A read whose type has no plan yet, or whose plan went stale: the generic
// read, then a plan made after it (the read gave the type a version tag). A
// full table leaves new types to the generic read: still correct. Out of line:
// the hot path stays small.
[[gnu::noinline]] inline PyObject* read_and_plan(PyObject* obj, PyObject* name, bool method, AttrPlan* rows, int* n,
                                                 int capacity) {
  PyObject* v = read_generic(obj, name, method);
  if (!v) return nullptr;
  PyTypeObject* t = Py_TYPE(obj);
  int row = 0;
  while (row < *n && rows[row].type != t) ++row;
  if (row == capacity) return v;
  AttrPlan p = plan_attr(t, name, method);
  if (row < *n) {
    std::swap(rows[row], p);  // the row keeps its reference to t; the old descriptor is dropped below
  } else {
    Py_INCREF(t);
    rows[(*n)++] = p;
    p = AttrPlan();
  }
  Py_XDECREF(p.descr);
  return v;
}

// obj.<name> (method: obj.<name>()), a new reference or nullptr with an error set.
template <int N>
inline PyObject* read_attr(PyObject* obj, PyObject* name, AttrPlans<N>& plans, bool method = false) {
  PyTypeObject* t = Py_TYPE(obj);
  for (int i = 0; i < plans.n; ++i) {
    const AttrPlan& p = plans.rows[i];
    if (p.type != t) continue;
    if (!version_is(t, p.version)) break;
    switch (p.kind) {
      case AttrPlan::kGetSet: {
        PyGetSetDef* g = reinterpret_cast<PyGetSetDescrObject*>(p.descr)->d_getset;
        return g->get(obj, g->closure);
      }
      case AttrPlan::kMember:
        return PyMember_GetOne(reinterpret_cast<const char*>(obj),
                               reinterpret_cast<PyMemberDescrObject*>(p.descr)->d_member);
      case AttrPlan::kMethod: {
        // Held for the call: the method may run Python, which may replace this plan.
        PyObject* d = Py_NewRef(p.descr);
        PyObject* v = PyObject_Vectorcall(d, &obj, 1, nullptr);
        Py_DECREF(d);
        return v;
      }
      default:
        return read_generic(obj, name, method);
    }
  }
  return read_and_plan(obj, name, method, plans.rows, &plans.n, N);
}

// PyLong_AsUnsignedLong, not ...LongLong: for an int of more than one digit
// (any device address) CPython 3.11's LongLong reader goes through a byte-array
// conversion that costs tens of ns per pointer; both are 64 bits here.
static_assert(sizeof(unsigned long) == sizeof(uint64_t), "an LP64 platform");
inline bool read_u64(PyObject* v, uint64_t* out) {
  if (!v || !PyLong_Check(v)) return false;
  *out = PyLong_AsUnsignedLong(v);
  if (*out == uint64_t(-1) && PyErr_Occurred()) return PyErr_Clear(), false;
  return true;
}

struct DLDataType_ { uint8_t code, bits; uint16_t lanes; };
// DLPack device types a kernel can read: kDLCUDA, kDLCUDAManaged (not kDLCPU,
// nor kDLCUDAHost); lazytriton.core.arrays.DLPACK_DEVICE_TYPES says the same.
inline bool dlpack_device_ok(int32_t device_type) { return device_type == 2 || device_type == 13; }
struct DLTensor_ {
  void* data;
  int32_t device_type, device_id;
  int32_t ndim;
  DLDataType_ dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
};

inline bool pointer_of(PyObject* obj, int strategy, uint64_t* ptr) {
  static AttrPlans<8> is_cuda, data_ptr, data, dptr, cai, dlpack;
  const Names& n = names();
  PyObject* v = nullptr;
  bool ok = false;
  switch (strategy) {
    case kTorch: {
      // A host tensor is "not this signature": Python's array_info then names the problem.
      PyObject* on_gpu = read_attr(obj, n.is_cuda, is_cuda);
      bool cuda = on_gpu == Py_True;
      Py_XDECREF(on_gpu);
      if (!cuda) break;
      [[fallthrough]];
    }
    case kDataPtrMethod:
      v = read_attr(obj, n.data_ptr, data_ptr, /*method=*/true);
      ok = read_u64(v, ptr);
      break;
    case kDataDotPtr: {
      PyObject* mem = read_attr(obj, n.data, data);
      if (mem) v = read_attr(mem, n.ptr, dptr);
      Py_XDECREF(mem);
      ok = read_u64(v, ptr);
      break;
    }
    case kCudaArrayInterface: {
      PyObject* iface = read_attr(obj, n.cai, cai);
      PyObject* d = iface && PyDict_Check(iface) ? PyDict_GetItemString(iface, "data") : nullptr;
      ok = d && PyTuple_Check(d) && PyTuple_GET_SIZE(d) > 0 && read_u64(PyTuple_GET_ITEM(d, 0), ptr);
      Py_XDECREF(iface);
      break;
    }
    case kDLPack: {
      v = read_attr(obj, n.dlpack, dlpack, /*method=*/true);
      auto* t = v && PyCapsule_IsValid(v, "dltensor")
                    ? static_cast<DLTensor_*>(PyCapsule_GetPointer(v, "dltensor"))
                    : nullptr;
      // A host array is "not this signature": Python's array_info then names the problem.
      ok = t != nullptr && dlpack_device_ok(t->device_type);
      if (ok) *ptr = reinterpret_cast<uint64_t>(t->data) + t->byte_offset;
      break;
    }
    default:
      break;
  }
  Py_XDECREF(v);
  if (!ok) PyErr_Clear();
  return ok;
}

// Readers built at run time against one array library's own headers, shared by
// every module that includes this header: lazytriton._core owns the one
// `Readers` of the process (written under the GIL by _core.set_torch_reader)
// and hands its address out as a capsule. Until one is installed, and for what
// it declines, the attribute reads above serve: the answers are the same.
enum TensorRead : int {
  kDeclined = 0,      // read it through its attributes instead
  kHostTensor = 1,    // dtype set; not on a GPU
  kDeviceTensor = 2,  // dtype and data pointer set
};
// The torch reader (torch_reader.cc): a tensor's dtype (borrowed) and data pointer.
using TorchRead = int (*)(PyObject* obj, PyObject** dtype, uint64_t* ptr);
constexpr const char* kTorchReaderCapsule = "lazytriton.torch_reader";
constexpr const char* kReadersCapsule = "lazytriton._core._readers";
struct Readers {
  TorchRead torch = nullptr;
};

inline const Readers& readers() {
  static const Readers* shared = nullptr;  // set under the GIL
  static const Readers none;
  if (!shared) {
    shared = static_cast<const Readers*>(PyCapsule_Import(kReadersCapsule, 0));
    if (!shared) return PyErr_Clear(), none;  // asked again next time
  }
  return *shared;
}

// A pointer argument: the object must be an array-like whose dtype is
// `want_dtype`. False means "not this stub's signature".
inline bool get_pointer(PyObject* obj, int want_dtype, uint64_t* ptr) {
  static AttrPlans<8> dtype;
  int s = strategy_of(obj);
  if (s == kNotArray) return false;
  if (s == kTorch) {
    if (TorchRead torch = readers().torch) {
      PyObject* dt = nullptr;
      int r = torch(obj, &dt, ptr);
      if (r != kDeclined) return r == kDeviceTensor && dtype_id(dt) == want_dtype;
    }
  }
  PyObject* dt = read_attr(obj, names().dtype, dtype);
  if (!dt) return PyErr_Clear(), false;
  int id = dtype_id(dt);
  Py_DECREF(dt);
  return id == want_dtype && pointer_of(obj, s, ptr);
}

}  // namespace lt::pyargs
