// lazytriton._core's timing: what the tuner times its candidates with (one
// launch or several interleaved, each trial after a snapshot is restored and
// reset_to_zero buffers are zeroed, L2 flushed between trials) and the
// benchmarks' floors (a raw cuLaunchKernel loop, the same loop through
// Kernel::launch).
#include <chrono>
#include <functional>
#include <memory>

#include "core_module.h"

namespace lt::bindings {
namespace {

BenchOptions bench_options(const py::dict& opt) {
  BenchOptions o;
  o.warmup = dict_int(opt, "warmup", o.warmup);
  o.min_reps = dict_int(opt, "min_reps", o.min_reps);
  o.max_reps = dict_int(opt, "max_reps", o.max_reps);
  if (opt.contains("target_ms")) o.target_ms = opt["target_ms"].cast<double>();
  if (opt.contains("flush_l2")) o.flush_l2 = opt["flush_l2"].cast<bool>();
  return o;
}

py::dict bench_dict(const BenchResult& r) {
  py::dict d;
  d["median_ms"] = r.median_ms;
  d["min_ms"] = r.min_ms;
  d["reps"] = r.reps;
  return d;
}

}  // namespace

void bind_timing(py::module_& m) {
  py::class_<Snapshot>(m, "Snapshot")
      .def(py::init([](uint64_t stream, const std::vector<std::pair<uint64_t, size_t>>& bufs) {
             std::vector<DeviceBuffer> b;
             for (auto& [p, n] : bufs) b.push_back({p, n});
             return std::make_unique<Snapshot>(as_stream(stream), std::move(b));
           }),
           py::arg("stream"), py::arg("buffers"))
      .def("restore", [](const Snapshot& s, uint64_t stream) { s.restore(as_stream(stream)); })
      .def_property_readonly("device_bytes", &Snapshot::device_bytes)
      .def_property_readonly("host_bytes", &Snapshot::host_bytes);

  // The floor the benchmarks compare against: plain cuLaunchKernel from a C++
  // loop (no Python, no lazytriton bookkeeping). Returns seconds for n launches.
  m.def("raw_launch_loop", [](Kernel& k, py::handle grid, uint64_t stream, const std::vector<std::string>& types,
                              py::sequence args, int n) {
    ArgPack pack(types, args);
    pack.slots.push_back(0);  // the two hidden scratch pointers
    pack.slots.push_back(0);
    std::vector<void*> ptrs;
    for (auto& s : pack.slots) ptrs.push_back(&s);
    Dim3 g = dim3_from(grid);
    const LaunchMeta& m = k.meta();
    cu::CUfunction fn = k.function(current_context());
    const Driver& d = driver();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i)
      check(d.cuLaunchKernel(fn, g.x, g.y, g.z, m.warp_size * m.num_warps, 1, 1, m.shared, as_stream(stream), ptrs.data(), nullptr),
            "cuLaunchKernel");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  // Same loop through lazytriton's own C++ launch path (Kernel::launch).
  m.def("core_launch_loop", [](Kernel& k, py::handle grid, uint64_t stream, const std::vector<std::string>& types,
                               py::sequence args, int n) {
    ArgPack pack(types, args, &k.meta());
    Dim3 g = dim3_from(grid);
    cu::CUcontext ctx = current_context();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) k.launch(ctx, as_stream(stream), g, pack.ptrs.data(), pack.ptrs.size());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });

  m.def("zero", [](uint64_t stream, uint64_t ptr, size_t nbytes) { zero_buffer(as_stream(stream), {ptr, nbytes}); });
  m.def("allocation_extent", [](uint64_t ptr) { return allocation_extent(ptr); });
  m.def("flush_l2", [](uint64_t stream) { flush_l2(as_stream(stream)); });
  m.def("reserve_l2_flush", [] { return reserve_l2_flush(); });

  m.def(
      "bench",
      [](Kernel& k, py::handle grid, uint64_t stream, const std::vector<std::string>& types, py::sequence args,
         const Snapshot* snapshot, const std::vector<std::pair<uint64_t, size_t>>& zero, const py::dict& opt) {
        ArgPack pack(types, args, &k.meta());
        Dim3 g = dim3_from(grid);
        BenchOptions o = bench_options(opt);
        cu::CUstream s = as_stream(stream);
        cu::CUcontext ctx = current_context();
        BenchResult r = without_gil([&] {
          return lt::bench(
              s, [&] { k.launch(ctx, s, g, pack.ptrs.data(), pack.ptrs.size()); },
              [&] {
                if (snapshot) snapshot->restore(s);
                for (auto& [p, n] : zero) zero_buffer(s, {p, n});
              },
              o);
        });
        return bench_dict(r);
      },
      py::arg("kernel"), py::arg("grid"), py::arg("stream"), py::arg("types"), py::arg("args"),
      py::arg("snapshot"), py::arg("zero"), py::arg("options"));

  // Several candidates timed against each other, their launches interleaved one by one.
  m.def(
      "bench_interleaved",
      [](const std::vector<Kernel*>& kernels, py::sequence grids, uint64_t stream,
         const std::vector<std::vector<std::string>>& types, py::sequence args, const Snapshot* snapshot,
         const std::vector<std::pair<uint64_t, size_t>>& zero, const py::dict& opt) {
        size_t n = kernels.size();
        if (py::len(grids) != n || types.size() != n || py::len(args) != n)
          throw std::invalid_argument("bench_interleaved: one grid, type list and argument list per kernel");
        std::vector<std::unique_ptr<ArgPack>> packs;
        std::vector<Dim3> dims;
        for (size_t i = 0; i < n; ++i) {
          packs.push_back(std::make_unique<ArgPack>(types[i], py::sequence(args[i]), &kernels[i]->meta()));
          dims.push_back(dim3_from(grids[i]));
        }
        BenchOptions o = bench_options(opt);
        cu::CUstream s = as_stream(stream);
        cu::CUcontext ctx = current_context();
        std::vector<std::function<void()>> launches;
        for (size_t i = 0; i < n; ++i)
          launches.push_back([&, i] { kernels[i]->launch(ctx, s, dims[i], packs[i]->ptrs.data(), packs[i]->ptrs.size()); });
        std::vector<BenchResult> rs = without_gil([&] {
          return lt::bench_interleaved(
              s, launches,
              [&] {
                if (snapshot) snapshot->restore(s);
                for (auto& [p, nb] : zero) zero_buffer(s, {p, nb});
              },
              o);
        });
        py::list out;
        for (const auto& r : rs) out.append(bench_dict(r));
        return out;
      },
      py::arg("kernels"), py::arg("grids"), py::arg("stream"), py::arg("types"), py::arg("args"),
      py::arg("snapshot"), py::arg("zero"), py::arg("options"));
}

}  // namespace lt::bindings
