// Host cost per launch from C++, side by side in one run, on one cubin (the
// bundle's winner for example_kernels:add_kernel, n = 1024, one block):
//
//   raw        cuLaunchKernel in a loop, parameters packed once (the floor)
//   core       lt::Kernel::launch (cuLaunchKernelEx), parameters packed once
//   bundle     lt::BundleKernel::launch(stream, Dim3, {x, y, out, n})
//   grid fn    lt::BundleKernel::launch(stream, [](const lt::Meta&) {...}, {...})
//   stub       launch_add_kernel(kernel, stream, grid, x, y, out, n) (export-cpp)
//   stub, default bundle   launch_add_kernel(stream, grid, x, y, out, n)
//
// Each figure is the median over rounds of the host time of BATCH launches
// (fewer than the launch queue holds, and the stream is drained between
// batches, so the GPU never throttles the host), divided by BATCH. Rounds
// interleave the paths so that clock drift hits each alike.
//
//   cpp_launch_overhead BUNDLE_DIR
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <lazytriton/bundle.h>

#include "launch_add_kernel.h"

namespace {

constexpr int kBatch = 200, kRounds = 60, kN = 1024;

struct Path {
  std::string name;
  std::function<void()> launch;
  std::vector<double> us;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const char* dir) {
  lt::Bundle bundle = lt::Bundle::open(dir);
  lt::Bundle::set_default(bundle);
  lt::BundleKernel k = bundle.kernel("example_kernels:add_kernel", "*fp32,*fp32,*fp32,i32", {{"BLOCK", 1024}});
  const lt::Driver& d = lt::driver();
  lt::cu::CUcontext ctx = lt::current_context();
  lt::cu::CUdeviceptr x, y, out;
  for (auto* p : {&x, &y, &out}) lt::check(d.cuMemAlloc(p, kN * sizeof(float)), "cuMemAlloc");
  std::vector<float> hx(kN), hy(kN), hout(kN);
  for (int i = 0; i < kN; ++i) hx[i] = float(i), hy[i] = float(3 * i + 1);
  lt::check(d.cuMemcpyHtoDAsync(x, hx.data(), sizeof(float) * kN, nullptr), "cuMemcpyHtoDAsync");
  lt::check(d.cuMemcpyHtoDAsync(y, hy.data(), sizeof(float) * kN, nullptr), "cuMemcpyHtoDAsync");
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
      {"raw cuLaunchKernel", [&] {
         lt::check(d.cuLaunchKernel(fn, 1, 1, 1, 32 * m.num_warps, 1, 1, m.shared, stream, raw_params, nullptr),
                   "cuLaunchKernel");
       }},
      {"lt::Kernel::launch (core)", [&] { w.kernel->launch(ctx, stream, grid, core_params, 4); }},
      {"BundleKernel::launch(Dim3)", [&] { k.launch(stream, grid, {lt::DevicePtr(x), lt::DevicePtr(y), lt::DevicePtr(out), n}); }},
      {"BundleKernel::launch(grid fn)", [&] { k.launch(stream, grid_fn, {lt::DevicePtr(x), lt::DevicePtr(y), lt::DevicePtr(out), n}); }},
      {"stub launch_add_kernel(k, ...)", [&] { launch_add_kernel(k, stream, grid, x, y, out, n); }},
      {"stub, default bundle", [&] { launch_add_kernel(stream, grid, x, y, out, n); }},
  };
  for (auto& p : paths) p.launch();  // warm: module loaded, winners resolved
  lt::check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  for (int r = 0; r < kRounds; ++r)
    for (auto& p : paths) {
      lt::check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kBatch; ++i) p.launch();
      auto t1 = std::chrono::steady_clock::now();
      p.us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kBatch);
    }
  lt::check(d.cuMemcpyDtoHAsync(hout.data(), out, sizeof(float) * kN, stream), "cuMemcpyDtoHAsync");
  lt::check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  for (int i = 0; i < kN; ++i)
    if (hout[i] != hx[i] + hy[i]) return std::fprintf(stderr, "wrong result at %d\n", i), 1;

  const lt::DeviceInfo& dev = lt::device_info(lt::context_device(ctx));
  std::printf("device: %s, winner %s, %d launches x %d rounds per path\n", dev.name.c_str(),
              w.specialization.c_str(), kBatch, kRounds);
  double raw = median(paths[0].us);
  std::printf("%-34s %10s %8s\n", "path", "us/launch", "vs raw");
  for (auto& p : paths) std::printf("%-34s %10.2f %7.2fx\n", p.name.c_str(), median(p.us), median(p.us) / raw);
  double worst = 0;
  for (size_t i = 2; i < paths.size(); ++i) worst = std::max(worst, median(paths[i].us) / raw);
  std::printf("goal: every embedding path within 1.10x of raw: %s (worst %.2fx)\n", worst <= 1.10 ? "met" : "NOT met",
              worst);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: %s BUNDLE_DIR\n", argv[0]), 3;
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
