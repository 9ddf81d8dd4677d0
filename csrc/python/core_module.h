// What lazytriton._core's two binding files share: core_module.cc (the module:
// kernels, entries, the resolve-once table, devices, descriptors) and
// timing_bindings.cc (the timing the tuner and the benchmarks do: snapshots,
// benchmark loops, the L2 flush, the raw launch loops).
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <deque>
#include <string>
#include <vector>

#include "lazytriton/runtime.h"
#include "python_args.h"

namespace lt::bindings {

namespace py = pybind11;

inline cu::CUstream as_stream(uint64_t s) { return reinterpret_cast<cu::CUstream>(s); }

// d[k] if present and not None, else dflt.
inline int dict_int(const py::dict& d, const char* k, int dflt) {
  return d.contains(k) && !d[k].is_none() ? d[k].cast<int>() : dflt;
}

// A descriptor argument as Python hands it over (core_module.cc).
HostTensorDesc host_desc_from(py::handle h, std::string* name = nullptr);

// Runtime arguments packed as the kernel's parameters, in the C types Triton's
// launcher uses for each signature type: scalars and pointers in 8-byte slots,
// a host tensor descriptor ("tensordesc<...>") expanded into its parameters
// for the kernel `meta` (tensor_desc.h).
struct ArgPack {
  std::vector<uint64_t> slots;
  std::deque<DescParams> descs;  // stable addresses
  std::vector<void*> ptrs;

  ArgPack(const std::vector<std::string>& types, const py::sequence& values, const LaunchMeta* meta = nullptr) {
    if (types.size() != size_t(py::len(values)))
      throw py::value_error("argument count does not match the signature");
    slots.assign(types.size(), 0);
    size_t n_desc = 0;
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i].rfind("tensordesc", 0) == 0) {
        if (!meta) throw py::type_error("a tensor descriptor argument needs the kernel's metadata");
        void* p[kMaxDescParams];
        std::string name = "#" + std::to_string(i);
        HostTensorDesc d = host_desc_from(values[i], &name);
        size_t n = pack_tensor_desc(meta->tensordesc, meta->tensordesc_abi, n_desc++, d, descs.emplace_back(), p,
                                    meta->name, name.c_str());
        ptrs.insert(ptrs.end(), p, p + n);
        continue;
      }
      pack(types[i], values[i], &slots[i], "argument #" + std::to_string(i) + ": ");
      ptrs.push_back(&slots[i]);
    }
  }

  // One scalar or pointer in its parameter type, by encode.h's rules (as every
  // stub packs it): an annotated type's range, fp16 refused past its range.
  // `what` prefixes the error ("kernel k, argument n").
  static void pack(const std::string& t, py::handle v, uint64_t* slot, const std::string& what = "") {
    if (t[0] == '*') return void(*slot = v.cast<uint64_t>());
    Ty ty;
    if (!scalar_type(t, &ty)) throw py::type_error(what + "unsupported kernel argument type " + t);
    Fit fit;
    if (is_float(ty)) {
      fit = encode_float(ty, v.cast<double>(), slot);
    } else {
      py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));  // an int, or has __index__
      IntVal iv;
      if (!index || !pyargs::read_int(index.ptr(), &iv)) {
        PyErr_Clear();
        throw py::type_error(what + py::repr(v).cast<std::string>() + " is not an integer in 64 bits (" + t + ")");
      }
      iv.is_bool = PyBool_Check(v.ptr());
      uint64_t bits;
      fit = ty == Ty::kU1 ? encode_flag(true, iv, slot) : encode_int({ty, true, false, false}, iv, slot, &bits);
    }
    if (fit == Fit::kFp16Range) {  // Triton's launcher: OverflowError too
      PyErr_SetString(PyExc_OverflowError, (what + "float too large to pack as fp16").c_str());
      throw py::error_already_set();
    }
    if (fit != Fit::kOk) throw py::value_error(what + py::repr(v).cast<std::string>() + " does not fit " + t);
  }
};

inline Dim3 dim3_from(const py::handle& g) {
  Dim3 d;
  if (!pyargs::read_grid(g.ptr(), &d)) throw py::error_already_set();
  return d;
}

template <class F>
auto without_gil(F&& f) {
  py::gil_scoped_release nogil;
  return f();
}

void bind_timing(py::module_& m);  // timing_bindings.cc

}  // namespace lt::bindings
