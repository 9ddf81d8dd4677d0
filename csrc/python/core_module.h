// What lazytriton._core's binding files share: core_module.cc (the module:
// kernels, entries, the resolve-once table, devices, descriptors),
// timing_bindings.cc (the timing the tuner and the benchmarks do: snapshots,
// benchmark loops, the L2 flush, the raw launch loops) and isolation_bindings.cc
// (a candidate's first launch in a helper process: IPC exports, the helper's copies).
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

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

void bind_timing(py::module_& m);     // timing_bindings.cc
void bind_isolation(py::module_& m);  // isolation_bindings.cc

}  // namespace lt::bindings
