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
  // Online tuning: one launch of a candidate on a call of the program, timed by events on its stream.
  py::class_<LaunchTimer, std::shared_ptr<LaunchTimer>>(m, "LaunchTimer",
                                                       "Two CUDA events around one launch (tuning.h LaunchTimer).")
      .def(py::init<>())
      .def("arm", &LaunchTimer::arm, "The next launch of this thread is timed by it (Kernel::launch takes it).")
      .def("disarm", &LaunchTimer::disarm, "The call that armed it is over (launched or not).")
      .def_property_readonly("launched", &LaunchTimer::launched)
      .def_property_readonly("done", &LaunchTimer::done)
      .def(
          "elapsed_ms",
          [](const LaunchTimer& t) -> py::object {
            float ms = t.elapsed_ms();
            return ms < 0 ? py::none() : py::cast(ms);
          },
          "Milliseconds between the events; None while the GPU has not passed the second (never waits), or if "
          "the launch between them failed or never happened.")
      .def_property_readonly("failure", [](const LaunchTimer& t) -> py::object {
        return t.failure().empty() ? py::none() : py::cast(t.failure());
      });

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

  // The floor the benchmarks compare against: plain cuLaunchKernel from a C++ loop (no Python,
  // no lazytriton bookkeeping) of an entry's parameters, packed once. Seconds for n launches.
  m.def(
      "raw_launch_loop",
      [](const Entry& e, uint64_t stream, const std::vector<uint64_t>& buffers, int n) {
        FixedParams p(e, buffers.data(), buffers.size());
        void* scratch[2] = {nullptr, nullptr};  // the two hidden scratch pointers
        for (void*& s : scratch) p.params.push_back(&s);
        const LaunchMeta& m = e.kernel->meta();
        cu::CUfunction fn = e.kernel->function(current_context());
        const Driver& d = driver();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i)
          check(d.cuLaunchKernel(fn, e.grid.x, e.grid.y, e.grid.z, m.warp_size * m.num_warps, 1, 1, m.shared,
                                 as_stream(stream), p.params.data(), nullptr),
                "cuLaunchKernel");
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      py::arg("entry"), py::arg("stream"), py::arg("buffers"), py::arg("n"));
  // Same loop through lazytriton's own C++ launch path (Kernel::launch).
  m.def(
      "core_launch_loop",
      [](const Entry& e, uint64_t stream, const std::vector<uint64_t>& buffers, int n) {
        FixedParams p(e, buffers.data(), buffers.size());
        cu::CUcontext ctx = current_context();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) e.kernel->launch(ctx, as_stream(stream), e.grid, p.params.data(), p.params.size());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      py::arg("entry"), py::arg("stream"), py::arg("buffers"), py::arg("n"));

  m.def("zero", [](uint64_t stream, uint64_t ptr, size_t nbytes) { zero_buffer(as_stream(stream), {ptr, nbytes}); });
  m.def("allocation_extent", [](uint64_t ptr) { return allocation_extent(ptr); });
  m.def("flush_l2", [](uint64_t stream) { flush_l2(as_stream(stream)); });
  m.def("reserve_l2_flush", [] { return reserve_l2_flush(); });

  // A candidate's trials launch its entry (the sources the JAX call site launches from, read
  // from the call's slot table rows) on the call's buffers, packed once.
  m.def(
      "bench",
      [](const Entry& e, uint64_t stream, const std::vector<uint64_t>& buffers, const Snapshot* snapshot,
         const std::vector<std::pair<uint64_t, size_t>>& zero, const py::dict& opt) {
        FixedParams p(e, buffers.data(), buffers.size());
        BenchOptions o = bench_options(opt);
        cu::CUstream s = as_stream(stream);
        cu::CUcontext ctx = current_context();
        BenchResult r = without_gil([&] {
          return lt::bench(
              s, [&] { e.kernel->launch(ctx, s, e.grid, p.params.data(), p.params.size()); },
              [&] {
                if (snapshot) snapshot->restore(s);
                for (auto& [ptr, n] : zero) zero_buffer(s, {ptr, n});
              },
              o);
        });
        return bench_dict(r);
      },
      py::arg("entry"), py::arg("stream"), py::arg("buffers"), py::arg("snapshot"), py::arg("zero"),
      py::arg("options"));

  // Several candidates timed against each other on the same buffers, their launches interleaved one by one.
  m.def(
      "bench_interleaved",
      [](const std::vector<std::shared_ptr<Entry>>& entries, uint64_t stream, const std::vector<uint64_t>& buffers,
         const Snapshot* snapshot, const std::vector<std::pair<uint64_t, size_t>>& zero, const py::dict& opt) {
        std::vector<std::unique_ptr<FixedParams>> packs;
        for (const auto& e : entries) packs.push_back(std::make_unique<FixedParams>(*e, buffers.data(), buffers.size()));
        BenchOptions o = bench_options(opt);
        cu::CUstream s = as_stream(stream);
        cu::CUcontext ctx = current_context();
        std::vector<std::function<void()>> launches;
        for (size_t i = 0; i < entries.size(); ++i)
          launches.push_back([&, i] {
            entries[i]->kernel->launch(ctx, s, entries[i]->grid, packs[i]->params.data(), packs[i]->params.size());
          });
        std::vector<BenchResult> rs = without_gil([&] {
          return lt::bench_interleaved(
              s, launches,
              [&] {
                if (snapshot) snapshot->restore(s);
                for (auto& [ptr, nb] : zero) zero_buffer(s, {ptr, nb});
              },
              o);
        });
        py::list out;
        for (const auto& r : rs) out.append(bench_dict(r));
        return out;
      },
      py::arg("entries"), py::arg("stream"), py::arg("buffers"), py::arg("snapshot"), py::arg("zero"),
      py::arg("options"));
}

}  // namespace lt::bindings
