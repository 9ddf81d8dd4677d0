#include "lazytriton/kernel.h"

#include <string>

namespace lt {

Counters& counters() {
  static Counters c;
  return c;
}

namespace {
constexpr unsigned kDefaultSharedLimit = 48 * 1024;

std::string kname(const LaunchMeta& m) { return "kernel " + m.name; }

// Stream-ordered scratch: concurrent launches on different streams stay
// apart, and the allocation is capturable into a CUDA graph.
struct Scratch {
  cu::CUdeviceptr raw = 0, aligned = 0;
  Scratch(uint64_t per_cta, uint64_t align, Dim3 grid, const LaunchMeta& m, cu::CUstream stream) {
    if (per_cta == 0) return;
    uint64_t bytes = uint64_t(grid.x) * grid.y * grid.z * m.num_ctas * per_cta;
    // cuMemAllocAsync aligns to at least 256 bytes; over-allocate beyond that.
    if (align > 256) bytes += align;
    check(driver().cuMemAllocAsync(&raw, bytes, stream), kname(m) + ": scratch cuMemAllocAsync");
    aligned = align > 256 && raw % align ? raw + align - raw % align : raw;
  }
  void free(cu::CUstream stream) {
    if (raw) driver().cuMemFreeAsync(raw, stream);
  }
};
}  // namespace

std::string check_fits(const LaunchMeta& m, const DeviceInfo& dev) {
  int threads = 32 * m.num_warps;
  if (threads > dev.max_threads_per_block)
    return "needs " + std::to_string(threads) + " threads per block (num_warps=" +
           std::to_string(m.num_warps) + ") but " + dev.name + " allows " +
           std::to_string(dev.max_threads_per_block);
  if (m.shared > unsigned(dev.max_shared_optin))
    return "needs " + std::to_string(m.shared) + " bytes of shared memory but " + dev.name +
           " allows " + std::to_string(dev.max_shared_optin) + " per block";
  if (m.num_ctas > 1 && !dev.cluster_launch)
    return "needs clusters (num_ctas=" + std::to_string(m.num_ctas) + ") which " + dev.name +
           " does not support";
  if (m.cooperative && !dev.cooperative)
    return "needs a cooperative launch which " + dev.name + " does not support";
  int cc = dev.cc_major * 10 + dev.cc_minor;
  if (m.arch && (m.arch / 10 != dev.cc_major || m.arch > cc))
    return "was compiled for sm_" + std::to_string(m.arch) + " but " + dev.name + " is sm_" +
           std::to_string(cc);
  return "";
}

Kernel::Kernel(std::shared_ptr<const KernelImage> image) : image_(std::move(image)) {}

Kernel::~Kernel() {
  // Modules are unloaded only if the driver is still usable; at process exit
  // the driver may already be torn down, and leaking is harmless then.
  std::string why;
  if (!driver_available(&why)) return;
  size_t n = n_loaded_.load();
  for (size_t i = 0; i < n; ++i) driver().cuModuleUnload(loaded_[i].module);
}

cu::CUfunction Kernel::function(cu::CUcontext ctx) {
  size_t n = n_loaded_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i)
    if (loaded_[i].ctx == ctx) return loaded_[i].function;
  return load(ctx);
}

cu::CUfunction Kernel::load(cu::CUcontext ctx) {
  std::lock_guard<std::mutex> lock(load_mu_);
  size_t n = n_loaded_.load();
  for (size_t i = 0; i < n; ++i)
    if (loaded_[i].ctx == ctx) return loaded_[i].function;
  if (n == kMaxContexts) throw Error(kname(meta()) + ": loaded in too many CUDA contexts");

  const Driver& d = driver();
  const LaunchMeta& m = meta();
  ContextGuard guard(ctx);
  const DeviceInfo& dev = device_info(context_device(ctx));
  std::string why = check_fits(m, dev);
  if (!why.empty()) throw Error(kname(m) + " " + why);

  cu::CUmodule mod;
  check(d.cuModuleLoadData(&mod, image_->cubin.data()), kname(m) + ": cuModuleLoadData");
  cu::CUfunction fn;
  cu::CUresult r = d.cuModuleGetFunction(&fn, mod, m.name.c_str());
  if (r != cu::CUDA_SUCCESS) {
    d.cuModuleUnload(mod);
    check(r, kname(m) + ": cuModuleGetFunction");
  }
  int fn_max_threads = 0;
  check(d.cuFuncGetAttribute(&fn_max_threads, cu::FUNC_MAX_THREADS_PER_BLOCK, fn), kname(m) + ": cuFuncGetAttribute");
  if (32 * m.num_warps > fn_max_threads) {
    d.cuModuleUnload(mod);
    throw Error(kname(m) + " needs " + std::to_string(32 * m.num_warps) +
                " threads per block but its register use allows only " + std::to_string(fn_max_threads) +
                " on " + dev.name);
  }
  if (m.shared > kDefaultSharedLimit) {
    // Above 48 KiB the dynamic shared memory limit must be raised explicitly;
    // as in Triton's loader, the opt-in maximum less the static part.
    int static_shared = 0;
    check(d.cuFuncGetAttribute(&static_shared, cu::FUNC_SHARED_SIZE_BYTES, fn), kname(m) + ": cuFuncGetAttribute");
    check(d.cuFuncSetCacheConfig(fn, cu::CU_FUNC_CACHE_PREFER_SHARED), kname(m) + ": cuFuncSetCacheConfig");
    check(d.cuFuncSetAttribute(fn, cu::FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, dev.max_shared_optin - static_shared),
          kname(m) + ": cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  }
  if (m.num_ctas > 8)  // cluster sizes above 8 are non-portable and must be allowed per function
    check(d.cuFuncSetAttribute(fn, cu::FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
          kname(m) + ": cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
  loaded_[n] = {ctx, mod, fn};
  n_loaded_.store(n + 1, std::memory_order_release);
  counters().module_loads++;
  return fn;
}

void Kernel::launch(cu::CUstream stream, Dim3 grid, void** params, size_t n) {
  launch(current_context(), stream, grid, params, n);
}

void Kernel::launch(cu::CUcontext ctx, cu::CUstream stream, Dim3 grid, void** params, size_t n) {
  if (grid.empty()) return;
  const LaunchMeta& m = meta();
  cu::CUfunction fn = function(ctx);
  const Driver& d = driver();

  Scratch gscratch(m.global_scratch_size, m.global_scratch_align, grid, m, stream);
  Scratch pscratch(m.profile_scratch_size, m.profile_scratch_align, grid, m, stream);

  constexpr size_t kInline = 64;
  void* inline_args[kInline + 2];
  std::vector<void*> heap_args;
  void** args = inline_args;
  if (n > kInline) {
    heap_args.resize(n + 2);
    args = heap_args.data();
  }
  for (size_t i = 0; i < n; ++i) args[i] = params[i];
  args[n] = &gscratch.aligned;
  args[n + 1] = &pscratch.aligned;

  cu::CUlaunchAttribute attrs[4] = {};
  unsigned nattrs = 0;
  if (m.pdl) {
    attrs[nattrs].id = cu::LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[nattrs++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (m.cooperative) {
    attrs[nattrs].id = cu::LAUNCH_ATTR_COOPERATIVE;
    attrs[nattrs++].value.cooperative = 1;
  }
  if (m.num_ctas != 1) {
    attrs[nattrs].id = cu::LAUNCH_ATTR_CLUSTER_DIMENSION;
    attrs[nattrs++].value.clusterDim = {m.cluster[0], m.cluster[1], m.cluster[2]};
    attrs[nattrs].id = cu::LAUNCH_ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[nattrs++].value.clusterSchedulingPolicyPreference = cu::CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  }
  cu::CUlaunchConfig cfg{};
  // The user's grid counts clusters: each program is a cluster of num_ctas CTAs.
  cfg.gridDimX = grid.x * m.cluster[0];
  cfg.gridDimY = grid.y * m.cluster[1];
  cfg.gridDimZ = grid.z * m.cluster[2];
  cfg.blockDimX = 32u * unsigned(m.num_warps);
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = m.shared;
  cfg.hStream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = nattrs;
  cu::CUresult r = d.cuLaunchKernelEx(&cfg, fn, args, nullptr);
  gscratch.free(stream);
  pscratch.free(stream);
  check(r, kname(m) + ": cuLaunchKernelEx");
  counters().launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace lt
