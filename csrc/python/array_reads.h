// Reading array arguments from Python objects on the launch hot path, shared
// by lazytriton._core, the launch stubs and the torch reader: per Python type,
// how to find an array's device pointer and device (lazytriton.model.arrays
// decides once) and how each attribute is read (its type's getter, called
// directly); per dtype object, its Triton dtype. CPython's C API only.
#pragma once
#include <Python.h>
#include <structmember.h>  // PyMember_GetOne before Python 3.12

#include <cstdint>
#include <cstring>
#include <utility>

#include "seam.h"

namespace lt::pyargs {

// How to read the device pointer of an array-like type; decided once per
// Python type by lazytriton.model.arrays.pointer_strategy.
enum Strategy : int {
  kNotArray = 0,
  kDataPtrMethod = 1,
  kDataDotPtr = 2,
  kCudaArrayInterface = 3,
  kDLPack = 4,
  kTorch = 5,  // data_ptr() once is_cuda is True: a host tensor has a data_ptr() too
  kRecorded = 6,  // lazytriton's DeviceArray: data_ptr(), a buffer its maker vouches for (no device check)
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
  PyObject* get_device = name("get_device");  // torch's, until the torch reader is loaded
  PyObject* device_id = name("device_id");    // CuPy's, of `data` (its MemoryPointer)
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
  static PyObject* mod = PyImport_ImportModule(lt::seam::kArraysModule);
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

// lazytriton.model.arrays.<fn>(obj), asked once per type of `obj` and kept in
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

// Triton dtype id (lazytriton.model.arrays.DTYPE_IDS) of a dtype object.
inline int dtype_id(PyObject* dtype) {
  static IdentityCache<64> cache;
  int id;
  if (cache.get(dtype, &id)) return id;
  id = ask_python(lt::seam::kDtypeId, dtype);
  if (id < 0) {
    PyErr_Clear();
    return -1;
  }
  cache.put(dtype, id);
  return id;
}

// -- attribute reads -----------------------------------------------------------------
// The attributes a launch reads of each array (dtype, .data.ptr, data_ptr(), is_cuda)
// are looked up once per type and then read by calling their type's getter directly, as
// CPython's own specialized attribute loads do: a C getter (getset), a C slot
// (member) or a C method taking no arguments (when instances have no __dict__ to
// shadow it). That skips the generic lookup, most of an attribute read's cost for
// CuPy's C getters (measured from C on an H200 host: 85 -> 28 ns for the three reads
// of an array). A plan holds while the type's version tag is unchanged (any change
// to the type or its bases changes it) and only for types that look attributes up
// as Python's generic lookup does (generic_lookup). Anything else (a Python property
// or method, an instance attribute, a type with its own __getattribute__) is read
// through getattr, as before.
struct AttrPlan {
  PyTypeObject* type = nullptr;  // a reference: identity stays meaningful
  unsigned int version = 0;
  PyObject* descr = nullptr;  // a reference; nullptr: read generically
  enum Kind : uint8_t { kGeneric, kGetSet, kMember, kMethod } kind = kGeneric;
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

// What `name` is on t's MRO: the first entry the generic lookup finds (a new
// reference), or nullptr (absent; *unknown: a base's dict could not be read).
inline PyObject* lookup_on_mro(PyTypeObject* t, PyObject* name, bool* unknown) {
  *unknown = false;
  PyObject* mro = t->tp_mro;
  if (!mro || !PyTuple_Check(mro)) return *unknown = true, nullptr;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
    PyObject* dict = type_dict(reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i)));
    if (!dict) return PyErr_Clear(), *unknown = true, nullptr;
    PyObject* found = Py_XNewRef(PyDict_GetItemWithError(dict, name));
    Py_DECREF(dict);
    if (found) return found;
    if (PyErr_Occurred()) return PyErr_Clear(), *unknown = true, nullptr;
  }
  return nullptr;
}

// Whether objects of type t look their attributes up as Python's generic lookup
// does: t's tp_getattro is PyObject_GenericGetAttr, or t's __getattribute__ is
// still object's and it has no __getattr__. The second form covers Cython's
// classes (CuPy's), whose tp_getattro is an equivalent of the generic lookup
// installed after the type is made; a type whose own C tp_getattro differs has
// its own __getattribute__ (PyType_Ready puts it in the type's dict).
inline bool generic_lookup(PyTypeObject* t) {
  if (t->tp_getattro == PyObject_GenericGetAttr) return true;
  static PyObject* const s_getattribute = name("__getattribute__");
  static PyObject* const s_getattr = name("__getattr__");
  bool unknown;
  PyObject* object_dict = type_dict(&PyBaseObject_Type);
  PyObject* generic = object_dict ? PyDict_GetItemWithError(object_dict, s_getattribute) : nullptr;  // borrowed
  Py_XDECREF(object_dict);  // object's dict lives as long as the interpreter
  PyObject* own = generic ? lookup_on_mro(t, s_getattribute, &unknown) : nullptr;
  bool ok = own && own == generic;
  Py_XDECREF(own);
  PyObject* getattr = ok ? lookup_on_mro(t, s_getattr, &unknown) : nullptr;
  ok = ok && !getattr && !unknown;
  Py_XDECREF(getattr);
  PyErr_Clear();
  return ok;
}

// The plan for obj.<name> on objects of type t: the getter the generic lookup
// finds first on t's MRO, kept if it is one that may be called directly.
inline AttrPlan plan_attr(PyTypeObject* t, PyObject* name, bool method) {
  AttrPlan p;
  p.type = t;
  p.version = t->tp_version_tag;
  if (!(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) || !generic_lookup(t)) return p;
  bool unknown;
  PyObject* found = lookup_on_mro(t, name, &unknown);
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

// A read whose plan is for another type, or went stale: the generic read, then
// the plan made again after it (the read gave the type a version tag). Out of
// line: the hot path stays small.
[[gnu::noinline]] inline PyObject* read_and_plan(PyObject* obj, PyObject* name, bool method, AttrPlan* plan) {
  PyObject* v = read_generic(obj, name, method);
  if (!v) return nullptr;
  AttrPlan p = plan_attr(Py_TYPE(obj), name, method);
  Py_INCREF(p.type);
  std::swap(*plan, p);
  Py_XDECREF(p.type);  // the old plan's references
  Py_XDECREF(p.descr);
  return v;
}

// obj.<name> (method: obj.<name>()) through `plan`, a new reference or nullptr
// with an error set.
inline PyObject* read_attr(PyObject* obj, PyObject* name, AttrPlan& plan, bool method = false) {
  PyTypeObject* t = Py_TYPE(obj);
  if (plan.type != t || !version_is(t, plan.version)) return read_and_plan(obj, name, method, &plan);
  switch (plan.kind) {
    case AttrPlan::kGetSet: {
      PyGetSetDef* g = reinterpret_cast<PyGetSetDescrObject*>(plan.descr)->d_getset;
      return g->get(obj, g->closure);
    }
    case AttrPlan::kMember:
      return PyMember_GetOne(reinterpret_cast<const char*>(obj),
                             reinterpret_cast<PyMemberDescrObject*>(plan.descr)->d_member);
    case AttrPlan::kMethod: {
      // Held for the call: the method may run Python, which may replace this plan.
      PyObject* d = Py_NewRef(plan.descr);
      PyObject* v = PyObject_Vectorcall(d, &obj, 1, nullptr);
      Py_DECREF(d);
      return v;
    }
    default:
      return read_generic(obj, name, method);
  }
}

// How arrays of one Python type are read: where their pointer is (`strategy`,
// decided by lazytriton.model.arrays.pointer_strategy) and a plan for each
// attribute read: dtype, then `first` (is_cuda, data_ptr(), data,
// __cuda_array_interface__ or __dlpack__(), by strategy), `second` (data.ptr,
// planned for the type of `data`; torch's data_ptr()) and `third` (the device:
// torch's get_device(), CuPy's data.device_id).
struct ArrayReader {
  PyTypeObject* type = nullptr;  // a reference
  int strategy = kNotArray;
  AttrPlan dtype, first, second, third;
  // Objects of this type have no .dtype: the typestr of their __cuda_array_interface__ says it.
  bool dtype_from_interface = false;
  bool no_device_id = false;  // its `data` has no device_id (not CuPy's): not asked again
};

// The reader of obj's type, made on first sight (kept for the process), or
// nullptr if Python could not classify the type (no error left set).
inline ArrayReader* reader_of(PyObject* obj) {
  static ArrayReader rows[32];
  static int n = 0;
  PyTypeObject* t = Py_TYPE(obj);
  for (int i = 0; i < n; ++i)
    if (rows[i].type == t) return &rows[i];
  int strategy = ask_python(lt::seam::kPointerStrategy, obj);
  if (strategy < 0) return PyErr_Clear(), nullptr;
  for (int i = 0; i < n; ++i)  // Python may have run another launch meanwhile
    if (rows[i].type == t) return &rows[i];
  static ArrayReader spare;  // the 33rd type and later share it: still correct, replanned as types alternate
  ArrayReader* r = n < 32 ? &rows[n++] : &spare;
  Py_INCREF(t);
  Py_XDECREF(r->type);
  r->type = t;
  r->strategy = strategy;
  r->dtype_from_interface = false;
  r->no_device_id = false;
  return r;
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
// nor kDLCUDAHost); lazytriton.model.arrays.DLPACK_DEVICE_TYPES says the same.
inline bool dlpack_device_ok(int32_t device_type) { return device_type == 2 || device_type == 13; }
struct DLTensor_ {
  void* data;
  int32_t device_type, device_id;
  int32_t ndim;
  DLDataType_ dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
};

// -- the devices of a call's arrays ------------------------------------------------------
// A launch goes to the current context's device (kernel.cc). Each array read folds
// the device its memory is on into the call's `seen` (fold_device): what the array
// says (torch, CuPy, DLPack), or kUnknownDevice (an object that does not say). The
// stub then compares `seen` with the current device once (arrays_here in
// python_args.h); only when they differ, or a device is unknown, is each pointer
// put to Triton's own check (lt::pointer_accessible: a driver call per pointer).
constexpr int kNoArrays = -1;       // `seen` before any array: nothing to check
constexpr int kCheckEach = -2;      // `seen` of arrays on several devices, or on one not known
constexpr int kUnknownDevice = -3;  // an array whose object does not say where it is
constexpr int kAnyDevice = -4;      // a null pointer, managed memory: nothing to check

inline void fold_device(int* seen, int device) {
  if (device == kAnyDevice) return;
  if (device < 0) *seen = kCheckEach;
  else if (*seen == kNoArrays) *seen = device;
  else if (*seen != device) *seen = kCheckEach;
}

// An int read as a device ordinal (>= 0), else kUnknownDevice; a new reference consumed.
inline int device_from(PyObject* v) {
  long d = v && PyLong_Check(v) ? PyLong_AsLong(v) : -1;
  Py_XDECREF(v);
  if (d == -1 && PyErr_Occurred()) PyErr_Clear();
  return d >= 0 && d <= 0x7fffffff ? int(d) : kUnknownDevice;
}

// The pointer of `obj` and the device its memory is on (kUnknownDevice when the object does not
// say; kAnyDevice for managed memory or a null pointer, which any device may be handed).
inline bool pointer_of(PyObject* obj, ArrayReader& r, uint64_t* ptr, int* device) {
  const Names& n = names();
  PyObject* v = nullptr;
  bool ok = false;
  *device = kUnknownDevice;
  switch (r.strategy) {
    case kTorch: {
      // A host tensor is "not this signature": Python's array_info then names the problem.
      PyObject* on_gpu = read_attr(obj, n.is_cuda, r.first);
      bool cuda = on_gpu == Py_True;
      Py_XDECREF(on_gpu);
      if (!cuda) break;
      v = read_attr(obj, n.data_ptr, r.second, /*method=*/true);
      ok = read_u64(v, ptr);
      if (ok) *device = device_from(read_attr(obj, n.get_device, r.third, /*method=*/true));
      break;
    }
    case kDataPtrMethod:
      v = read_attr(obj, n.data_ptr, r.first, /*method=*/true);
      ok = read_u64(v, ptr);
      break;
    case kRecorded:
      v = read_attr(obj, n.data_ptr, r.first, /*method=*/true);
      ok = read_u64(v, ptr);
      *device = kAnyDevice;
      break;
    case kDataDotPtr: {
      PyObject* mem = read_attr(obj, n.data, r.first);
      if (mem) v = read_attr(mem, n.ptr, r.second);
      ok = read_u64(v, ptr);
      if (ok && !r.no_device_id) {  // CuPy's MemoryPointer says; a failed lookup is not paid on each launch
        PyObject* d = read_attr(mem, n.device_id, r.third);
        if (!d) r.no_device_id = PyErr_ExceptionMatches(PyExc_AttributeError);
        *device = device_from(d);
      }
      Py_XDECREF(mem);
      break;
    }
    case kCudaArrayInterface: {
      PyObject* iface = read_attr(obj, n.cai, r.first);
      PyObject* d = iface && PyDict_Check(iface) ? PyDict_GetItemString(iface, "data") : nullptr;
      ok = d && PyTuple_Check(d) && PyTuple_GET_SIZE(d) > 0 && read_u64(PyTuple_GET_ITEM(d, 0), ptr);
      Py_XDECREF(iface);
      break;
    }
    case kDLPack: {
      v = read_attr(obj, n.dlpack, r.first, /*method=*/true);
      auto* t = v && PyCapsule_IsValid(v, "dltensor")
                    ? static_cast<DLTensor_*>(PyCapsule_GetPointer(v, "dltensor"))
                    : nullptr;
      // A host array is "not this signature": Python's array_info then names the problem.
      ok = t != nullptr && dlpack_device_ok(t->device_type);
      if (ok) *ptr = reinterpret_cast<uint64_t>(t->data) + t->byte_offset;
      if (ok) *device = t->device_type == 2 ? t->device_id : kAnyDevice;  // kDLCUDA; managed: anywhere
      break;
    }
    default:
      break;
  }
  Py_XDECREF(v);
  if (!ok) PyErr_Clear();
  if (ok && *ptr == 0) *device = kAnyDevice;  // a null pointer: Triton's launcher passes it unchecked
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
// The torch reader (torch_reader.cc): a tensor's dtype (borrowed), data pointer and device index.
using TorchRead = int (*)(PyObject* obj, PyObject** dtype, uint64_t* ptr, int* device);
constexpr const char* kTorchReaderCapsule = "lazytriton.torch_reader.v2";
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

// Triton dtype id of a __cuda_array_interface__ typestr ("<f4"), remembered by its
// text: an interface dict, its strings too, may be made anew on every read.
inline int typestr_dtype_id(PyObject* typestr) {
  struct Seen { char text[8]; int id; };
  static Seen seen[16];
  static int n = 0;
  Py_ssize_t len = 0;
  const char* text = PyUnicode_Check(typestr) ? PyUnicode_AsUTF8AndSize(typestr, &len) : nullptr;
  if (!text) return PyErr_Clear(), -1;
  if (len >= Py_ssize_t(sizeof(Seen::text))) return -1;  // longer than any typestr Triton takes
  for (int i = 0; i < n; ++i)
    if (std::strcmp(seen[i].text, text) == 0) return seen[i].id;
  int id = ask_python(lt::seam::kDtypeId, typestr);
  if (id < 0) return PyErr_Clear(), -1;
  if (n < 16) {
    std::memcpy(seen[n].text, text, size_t(len) + 1);
    seen[n++].id = id;
  }
  return id;
}

// An array known by its __cuda_array_interface__ alone (no .dtype attribute): its
// dtype is the interface's typestr, its pointer the interface's data, one read.
// *typed: the interface had a typestr Triton knows.
inline bool interface_pointer(PyObject* obj, ArrayReader& r, int want_dtype, uint64_t* ptr, bool* typed = nullptr) {
  PyObject* iface = r.strategy == kCudaArrayInterface ? read_attr(obj, names().cai, r.first)
                                                      : PyObject_GetAttr(obj, names().cai);
  bool ok = false;
  if (iface && PyDict_Check(iface)) {
    PyObject* typestr = PyDict_GetItemString(iface, "typestr");  // borrowed
    PyObject* d = PyDict_GetItemString(iface, "data");
    int id = typestr ? typestr_dtype_id(typestr) : -1;
    if (typed) *typed = id >= 0;
    ok = id == want_dtype && d && PyTuple_Check(d) && PyTuple_GET_SIZE(d) > 0 && read_u64(PyTuple_GET_ITEM(d, 0), ptr);
  }
  Py_XDECREF(iface);
  if (!ok) PyErr_Clear();
  return ok;
}

// A pointer argument: the object must be an array-like whose dtype is
// `want_dtype`. False means "not this stub's signature". The device its memory
// is on is folded into `devices` (fold_device).
inline bool get_pointer(PyObject* obj, int want_dtype, uint64_t* ptr, int* devices) {
  ArrayReader* r = reader_of(obj);
  if (!r || r->strategy == kNotArray) return false;
  int device = kUnknownDevice;
  if (r->strategy == kTorch) {
    if (TorchRead torch = readers().torch) {
      PyObject* dt = nullptr;
      int answer = torch(obj, &dt, ptr, &device);
      if (answer != kDeclined) {
        if (answer != kDeviceTensor || dtype_id(dt) != want_dtype) return false;
        fold_device(devices, *ptr ? device : kAnyDevice);
        return true;
      }
    }
  }
  // An interface alone does not say where its memory is: the launch checks each such pointer.
  if (r->dtype_from_interface) {
    if (!interface_pointer(obj, *r, want_dtype, ptr)) return false;
    fold_device(devices, *ptr ? kUnknownDevice : kAnyDevice);
    return true;
  }
  PyObject* dt = read_attr(obj, names().dtype, r->dtype);
  if (!dt) {
    bool interface = r->strategy == kCudaArrayInterface || r->strategy == kDataDotPtr;
    if (!interface || !PyErr_ExceptionMatches(PyExc_AttributeError)) return PyErr_Clear(), false;
    PyErr_Clear();
    // As lazytriton.model.arrays.array_info reads it; the type's later objects too, once one had a typestr.
    bool typed = false;
    bool ok = interface_pointer(obj, *r, want_dtype, ptr, &typed);
    r->dtype_from_interface = typed;
    if (ok) fold_device(devices, *ptr ? kUnknownDevice : kAnyDevice);
    return ok;
  }
  int id = dtype_id(dt);
  Py_DECREF(dt);
  if (id != want_dtype || !pointer_of(obj, *r, ptr, &device)) return false;
  fold_device(devices, device);
  return true;
}

}  // namespace lt::pyargs
