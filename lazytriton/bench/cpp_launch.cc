// Host cost per launch from C++, side by side in one run, on one cubin (the
// bundle's winner for lazytriton.bench.kernels:add, n = 1024, one block). Built
// and run by the benchmark harness (lazytriton/bench/cpp.py):
//
//   raw        cuLaunchKernel in a loop, parameters packed once (the floor)
//   core       lt::Kernel::launch (cuLaunchKernelEx), parameters packed once
//   bundle     lt::BundleKernel::launch(stream, Dim3, {x, y, out, n})
//   grid fn    lt::BundleKernel::launch(stream, [](const lt::Meta&) {...}, {...})
//   stub       launch_bench_add(kernel, stream, grid, x, y, out, n) (export-cpp)
//   stub, default bundle   launch_bench_add(stream, grid, x, y, out, n)
//
// Each sample is the host time of BATCH launches divided by BATCH (fewer than
// the launch queue holds, and the stream is drained between batches, so the
// GPU never throttles the host). Rounds interleave the paths so that clock
// drift hits each alike: the same scheme as the harness's Python loop
// (lazytriton/bench/timing.py), here because these launches are C++.
// Prints one JSON object: {"device", "winner", "batch", "rounds", "paths": [{"name", "us": [...]}]}.
//
//   cpp_launch BUNDLE_DIR [ROUNDS [BATCH]]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <lazytriton/bundle.h>

#include "launch_bench_add.h"

namespace {

constexpr int kN = 1024;

struct Path {
  std::string name;
  std::function<void()> launch;
  std::vector<double> us;
};

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

int run(const char* dir, int rounds, int batch) {
  lt::Bundle bundle = lt::Bundle::open(dir);
  lt::Bundle::set_default(bundle);
  lt::BundleKernel k = bundle.kernel("lazytriton.bench.kernels:add", "*fp32,*fp32,*fp32,i32", {{"BLOCK", 1024}});
  const lt::Driver& d = lt::driver();
  lt::cu::CUcontext ctx = lt::current_context();
  lt::cu::CUdeviceptr x, y, out;
  for (auto* p : {&x, &y, &out}) lt::check(d.cuMemAlloc(p, kN * sizeof(float)), "cuMemAlloc");
  std::vector<float> hx(kN), hy(kN), hout(kN, -1.0f);
  for (int i = 0; i < kN; ++i) hx[i] = float(i) * 0.5f, hy[i] = float(3 * i + 1);
  lt::check(d.cuMemcpyHtoDAsync(x, hx.data(), sizeof(float) * kN, nullptr), "cuMemcpyHtoDAsync");
  lt::check(d.cuMemcpyHtoDAsync(y, hy.data(), sizeof(float) * kN, nullptr), "cuMemcpyHtoDAsync");
  lt::check(d.cuMemcpyHtoDAsync(out, hout.data(), sizeof(float) * kN, nullptr), "cuMemcpyHtoDAsync");
  lt::cu::CUstream stream = nullptr;
  int n = kN;
  lt::Dim3 grid{1};

  const lt::Winner& w = k.winner({lt::DevicePtr(x), lt::DevicePtr(y), lt::DevicePtr(out), n});
  lt::cu::CUfunction fn = w.kernel->function(ctx);
  const lt::LaunchMeta& m = w.kernel->meta();
  lt::cu::CUdeviceptr scratch = 0;
  void* raw_params[] = {&x, &y, &out, &n, &scratch, &scratch};  // + Triton's two hidden scratch pointers
  void* core_params[] = {&x, &y, &out, &n};
  lt::GridFn grid_fn = [](const lt::Meta& meta) { return lt::Dim3{unsigned((kN + meta["BLOCK"] - 1) / meta["BLOCK"])}; };

  std::vector<Path> paths = {
      {"raw cuLaunchKernel loop", [&] {
         lt::check(d.cuLaunchKernel(fn, 1, 1, 1, 32 * m.num_warps, 1, 1, m.shared, stream, raw_params, nullptr),
                   "cuLaunchKernel");
       }},
      {"lt::Kernel::launch (core)", [&] { w.kernel->launch(ctx, stream, grid, core_params, 4); }},
      {"BundleKernel::launch(Dim3)", [&] { k.launch(stream, grid, {lt::DevicePtr(x), lt::DevicePtr(y), lt::DevicePtr(out), n}); }},
      {"BundleKernel::launch(grid fn)", [&] { k.launch(stream, grid_fn, {lt::DevicePtr(x), lt::DevicePtr(y), lt::DevicePtr(out), n}); }},
      {"typed stub launch_bench_add(k, ...)", [&] { launch_bench_add(k, stream, grid, x, y, out, n); }},
      {"typed stub, default bundle", [&] { launch_bench_add(stream, grid, x, y, out, n); }},
  };
  for (auto& p : paths) p.launch();  // warm: module loaded, winners resolved
  lt::check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  for (int r = 0; r < rounds; ++r)
    for (auto& p : paths) {
      lt::check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < batch; ++i) p.launch();
      auto t1 = std::chrono::steady_clock::now();
      p.us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
    }
  lt::check(d.cuMemcpyDtoHAsync(hout.data(), out, sizeof(float) * kN, stream), "cuMemcpyDtoHAsync");
  lt::check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  for (int i = 0; i < kN; ++i)
    if (hout[i] != hx[i] + hy[i]) return std::fprintf(stderr, "wrong result at %d: %g\n", i, hout[i]), 1;

  const lt::DeviceInfo& dev = lt::device_info(lt::context_device(ctx));
  std::printf("{\"device\": %s, \"winner\": %s, \"batch\": %d, \"rounds\": %d, \"paths\": [", quoted(dev.name).c_str(),
              quoted(w.specialization).c_str(), batch, rounds);
  for (size_t i = 0; i < paths.size(); ++i) {
    std::printf("%s{\"name\": %s, \"us\": [", i ? ", " : "", quoted(paths[i].name).c_str());
    for (size_t j = 0; j < paths[i].us.size(); ++j) std::printf("%s%.6g", j ? ", " : "", paths[i].us[j]);
    std::printf("]}");
  }
  std::printf("]}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: %s BUNDLE_DIR [ROUNDS [BATCH]]\n", argv[0]), 3;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 60, batch = argc > 3 ? std::atoi(argv[3]) : 200;
  if (rounds < 1 || batch < 1) return std::fprintf(stderr, "ROUNDS and BATCH must be positive\n"), 3;
  try {
    return run(argv[1], rounds, batch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
