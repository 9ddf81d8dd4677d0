#include "lazytriton/kernel.h"

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>

#include "json.h"
#include "lazytriton/tuning.h"

namespace lt {

Counters& counters() {
  static Counters c;
  return c;
}

namespace {
constexpr unsigned kDefaultSharedLimit = 48 * 1024;

std::string kname(const LaunchMeta& m) { return "kernel " + m.name; }

uint64_t round_up(uint64_t v, uint64_t align) { return align > 1 ? (v + align - 1) / align * align : v; }

// Both scratch regions of one launch, carved from one allocation.
struct ScratchLayout {
  uint64_t global = 0, global_align = 1, profile = 0, profile_align = 1;

  ScratchLayout(const LaunchMeta& m, Dim3 grid) {
    uint64_t ctas = uint64_t(grid.x) * grid.y * grid.z * uint64_t(m.num_ctas);
    global = ctas * m.global_scratch_size;
    profile = ctas * m.profile_scratch_size;
    global_align = std::max<uint64_t>(m.global_scratch_align, 1);
    profile_align = std::max<uint64_t>(m.profile_scratch_align, 1);
  }
  bool empty() const { return global == 0 && profile == 0; }
  // Enough for both regions wherever a (256-byte aligned) block starts.
  uint64_t bytes() const {
    return (global ? global + global_align : 0) + (profile ? profile + profile_align : 0);
  }
  ScratchPtrs carve(cu::CUdeviceptr base) const {
    ScratchPtrs s;
    cu::CUdeviceptr at = base;
    if (global) {
      s.global = at = round_up(at, global_align);
      at += global;
    }
    if (profile) s.profile = round_up(at, profile_align);
    return s;
  }
};

// This thread's capture mode relaxed for the guard's life: allocating and loading a
// module are no stream operations, but a capture in global or thread-local mode
// (torch.cuda.graph's default, XLA's) refuses them, and is invalidated, unless relaxed.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const std::string& what) {
    check(driver().cuThreadExchangeStreamCaptureMode(&mode_), what + ": cuThreadExchangeStreamCaptureMode");
  }
  ~RelaxedCapture() { driver().cuThreadExchangeStreamCaptureMode(&mode_); }  // restores the caller's mode
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int mode_ = cu::CU_STREAM_CAPTURE_MODE_RELAXED;
};

// cuMemAlloc in `ctx`, allowed while this thread's stream is being captured.
cu::CUdeviceptr alloc_outside_stream_order(cu::CUcontext ctx, uint64_t bytes, const std::string& what) {
  const Driver& d = driver();
  ContextGuard guard(ctx);
  cu::CUdeviceptr p = 0;
  cu::CUresult r;
  {
    RelaxedCapture relaxed(what);
    r = d.cuMemAlloc(&p, bytes);
  }
  check(r, what + ": cuMemAlloc of " + std::to_string(bytes) + " bytes of scratch");
  counters().scratch_allocs++;
  return p;
}

// Per-stream scratch for launches outside capture: kernels on one stream run
// in order, so one block per stream serves them all; it grows by doubling.
// cuMemFree of a replaced block waits for work still using it.
class StreamScratchPool {
 public:
  cu::CUdeviceptr get(cu::CUcontext ctx, cu::CUstream stream, uint64_t bytes, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++clock_;
    for (Slot& s : slots_) {
      if (s.ctx != ctx || s.stream != stream) continue;
      s.used = clock_;
      if (s.bytes >= bytes) return s.ptr;
      free_block(s);
      s.bytes = std::max(bytes, 2 * s.bytes);
      s.ptr = alloc_outside_stream_order(ctx, s.bytes, what);
      return s.ptr;
    }
    if (slots_.size() >= kMaxStreams) {  // streams come and go: drop the least recently used
      auto lru = std::min_element(slots_.begin(), slots_.end(), [](const Slot& a, const Slot& b) { return a.used < b.used; });
      free_block(*lru);
      slots_.erase(lru);
    }
    slots_.push_back({ctx, stream, alloc_outside_stream_order(ctx, bytes, what), bytes, clock_});
    return slots_.back().ptr;
  }

 private:
  struct Slot {
    cu::CUcontext ctx;
    cu::CUstream stream;
    cu::CUdeviceptr ptr;
    uint64_t bytes, used;
  };
  static void free_block(const Slot& s) {
    ContextGuard guard(s.ctx);
    driver().cuMemFree(s.ptr);
  }
  static constexpr size_t kMaxStreams = 64;
  std::mutex mu_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
};

StreamScratchPool& stream_pool() {
  static auto* pool = new StreamScratchPool;  // never destroyed: the driver may be gone at exit
  return *pool;
}

// A stream-ordered block, freed in stream order after the launch: what a
// (top-level) graph capture records as allocation and free nodes, and what
// keeps a kernel using programmatic dependent launch from overlapping a
// predecessor that still reads the same memory.
struct StreamOrderedBlock {
  cu::CUdeviceptr ptr = 0;
  cu::CUstream stream;
  StreamOrderedBlock(uint64_t bytes, cu::CUstream s, const std::string& what) : stream(s) {
    check(driver().cuMemAllocAsync(&ptr, bytes, stream), what + ": scratch cuMemAllocAsync");
    counters().scratch_allocs++;
  }
  ~StreamOrderedBlock() { driver().cuMemFreeAsync(ptr, stream); }
};
}  // namespace

// ---- Triton's launch metadata -------------------------------------------------

namespace {

const std::string* opt_string(const json::Value& obj, const char* key) {
  const json::Value* v = obj.find(key);
  return v && v->kind == json::Value::kString ? &v->s : nullptr;
}

}  // namespace

// The one reader of launch metadata, by field name so that any Triton 3.x layout works:
// Triton's own (a compiled kernel's metadata, handed over by Python as JSON) and the one
// lazytriton writes back (a bundle variant's "launch", Kernel.metadata in Python).
LaunchMeta launch_meta_from(const json::Value& m, const std::string& what) {
  m.as_object(what);
  LaunchMeta l;
  l.name = m.at("name", what).as_string(what + ".name");
  LaunchMeta::each_field(l, [&](const char* name, auto& v) {  // absent or null: LaunchMeta's default
    using T = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<T, bool>) v = opt_bool(m, name, v, what);
    else v = T(opt_int(m, name, int64_t(v), what));
  });
  // The binary's target. Triton's: target = {backend, arch, warp_size}, its arch the number (90) on
  // CUDA and the name ("gfx942") on HIP (its top-level "arch" is "sm90" then). lazytriton's: arch
  // (a number) or gfx, and warp_size.
  const json::Value* t = m.find("target");
  if (t && t->kind == json::Value::kObject && t->find("arch")) {
    const std::string* backend = opt_string(*t, "backend");
    if (backend && *backend == "hip") l.gfx = t->at("arch", what).as_string(what + ".target.arch");
    else l.arch = int(opt_int(*t, "arch", 0, what + ".target"));
    l.warp_size = int(opt_int(*t, "warp_size", l.warp_size, what + ".target"));
  } else if (const json::Value* a = m.find("arch"); a && a->kind == json::Value::kInt) {
    l.arch = int(a->i);
  }
  if (const std::string* g = opt_string(m, "gfx")) l.gfx = *g;
  l.warp_size = int(opt_int(m, "warp_size", l.warp_size, what));
  // CTAs per cluster: (num_ctas, 1, 1), or 3.5's cluster_dims.
  l.cluster[0] = unsigned(l.num_ctas);
  if (const json::Value* c = m.find("cluster_dims"); c && c->kind == json::Value::kArray)
    for (size_t i = 0; i < c->items.size() && i < 3; ++i)
      l.cluster[i] = unsigned(std::max<int64_t>(1, c->items[i].as_int(what + ".cluster_dims")));
  // Host tensor descriptors: how each was lowered, and the Triton version's parameter layout.
  if (const json::Value* td = m.find("tensordesc_meta"); td && td->kind == json::Value::kArray)
    for (const json::Value& e : td->items) {
      std::string w = what + ".tensordesc_meta";
      TmaMeta tm;
      tm.swizzle = int(opt_int(e, "swizzle", 0, w));
      tm.elem_size = int(opt_int(e, "elem_size", 0, w));
      tm.elem_type = int(opt_int(e, "elem_type", 0, w));
      const auto& block = e.at("block_size", w).as_array(w + ".block_size");
      if (block.empty() || block.size() > size_t(kMaxDescRank)) throw Error(w + ": block_size must have 1 to 5 entries");
      tm.rank = int(block.size());
      for (size_t i = 0; i < block.size(); ++i) tm.block[i] = uint32_t(block[i].as_int(w + ".block_size"));
      tm.fp4_padded = opt_bool(e, "fp4_padded", false, w);
      tm.im2col = opt_bool(e, "is_im2col", false, w);
      l.tensordesc.push_back(tm);
    }
  if (const json::Value* a = m.find("lt_tensordesc_abi"); a && a->kind != json::Value::kNull)
    l.tensordesc_abi = int(a->as_int(what + ".lt_tensordesc_abi"));
  else if (const std::string* v = opt_string(m, "triton_version"))
    l.tensordesc_abi = tensor_desc_abi_of(*v);
  return l;
}

LaunchMeta launch_meta_from_json(const std::string& text) {
  return launch_meta_from(json::parse(text, "launch metadata"), "launch metadata");
}

namespace {

// Every launch attribute Triton can ask for, and when (Triton's launcher: programmatic
// dependent launch, a cooperative grid, clusters with their scheduling policy). Set once per
// kernel (Kernel::Kernel), with room for all of them at once. A new one: its row here, the
// LaunchMeta field it reads (kernel.h, read in launch_meta_from above), its id and value in
// cuda_abi.h.
struct LaunchAttr {
  cu::LaunchAttrId id;
  bool (*set)(const LaunchMeta& m, cu::CUlaunchAttributeValue& v);  // false: not asked for
};
constexpr LaunchAttr kLaunchAttrs[] = {
    {cu::LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION,
     [](const LaunchMeta& m, cu::CUlaunchAttributeValue& v) { return m.pdl && (v.programmaticStreamSerializationAllowed = 1); }},
    {cu::LAUNCH_ATTR_COOPERATIVE,
     [](const LaunchMeta& m, cu::CUlaunchAttributeValue& v) { return m.cooperative && (v.cooperative = 1); }},
    {cu::LAUNCH_ATTR_CLUSTER_DIMENSION,
     [](const LaunchMeta& m, cu::CUlaunchAttributeValue& v) {
       v.clusterDim = {m.cluster[0], m.cluster[1], m.cluster[2]};
       return m.num_ctas != 1;
     }},
    {cu::LAUNCH_ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
     [](const LaunchMeta& m, cu::CUlaunchAttributeValue& v) {
       v.clusterSchedulingPolicyPreference = cu::CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
       return m.num_ctas != 1;
     }},
};

std::vector<cu::CUlaunchAttribute> launch_attrs(const LaunchMeta& m) {
  std::vector<cu::CUlaunchAttribute> out;
  out.reserve(std::size(kLaunchAttrs));
  for (const LaunchAttr& a : kLaunchAttrs) {
    cu::CUlaunchAttribute attr{};
    attr.id = a.id;
    if (a.set(m, attr.value)) out.push_back(attr);
  }
  return out;
}

}  // namespace

std::string check_fits(const LaunchMeta& m, const DeviceInfo& dev) {
  // The binary's vendor and architecture first: nothing else is comparable across them.
  if (!m.gfx.empty() && !dev.hip)
    return "was compiled for AMD " + m.gfx + " but " + dev.name + " is an NVIDIA GPU (" + dev.arch + ")";
  if (m.gfx.empty() && dev.hip)
    return "was compiled for NVIDIA sm_" + std::to_string(m.arch) + " but " + dev.name + " is an AMD GPU (" +
           dev.arch + ")";
  if (!m.gfx.empty() && m.gfx != dev.arch)
    return "was compiled for " + m.gfx + " but " + dev.name + " is " + dev.arch;
  if (m.warp_size != dev.warp_size)
    return "was compiled for a warp size of " + std::to_string(m.warp_size) + " but " + dev.name + " has " +
           std::to_string(dev.warp_size);
  int threads = m.warp_size * m.num_warps;
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
  // Triton's loader refuses these too (CompiledKernel._init_handles): columns of tensor memory.
  if (const unsigned tmem = m.arch == 107 ? 576 : 512; m.tmem_size > tmem)
    return "needs " + std::to_string(m.tmem_size) + " columns of tensor memory but " + dev.name + " has " +
           std::to_string(tmem);
  int cc = dev.cc_major * 10 + dev.cc_minor;
  if (!dev.hip && m.arch && (m.arch / 10 != dev.cc_major || m.arch > cc))
    return "was compiled for sm_" + std::to_string(m.arch) + " but " + dev.name + " is sm_" +
           std::to_string(cc);
  return "";
}

Kernel::Kernel(std::shared_ptr<const KernelImage> image)
    : image_(std::move(image)), attrs_(launch_attrs(image_->meta)) {}

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
  RelaxedCapture relaxed(kname(m) + ": loading");  // a persisted winner's first launch may be under capture
  check(d.cuModuleLoadData(&mod, image_->cubin.data()), kname(m) + ": cuModuleLoadData");
  cu::CUfunction fn;
  cu::CUresult r = d.cuModuleGetFunction(&fn, mod, m.name.c_str());
  if (r != cu::CUDA_SUCCESS) {
    d.cuModuleUnload(mod);
    check(r, kname(m) + ": cuModuleGetFunction");
  }
  int fn_max_threads = 0;
  check(d.cuFuncGetAttribute(&fn_max_threads, cu::FUNC_MAX_THREADS_PER_BLOCK, fn), kname(m) + ": cuFuncGetAttribute");
  if (m.warp_size * m.num_warps > fn_max_threads) {
    d.cuModuleUnload(mod);
    throw Error(kname(m) + " needs " + std::to_string(m.warp_size * m.num_warps) +
                " threads per block but its register use allows only " + std::to_string(fn_max_threads) +
                " on " + dev.name);
  }
  if (m.shared > kDefaultSharedLimit) {
    // (The HIP layer's opt-ins are no-ops: AMD needs none.) Above 48 KiB the dynamic shared memory limit must be raised explicitly;
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

ScratchArena::~ScratchArena() {
  std::string why;
  if (!driver_available(&why)) return;
  for (const Block& b : blocks_) {
    ContextGuard guard(b.ctx);
    driver().cuMemFree(b.ptr);
  }
}

cu::CUdeviceptr ScratchArena::get(cu::CUcontext ctx, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
    if (it->ctx == ctx) {
      if (it->bytes >= bytes) return it->ptr;
      break;
    }
  blocks_.push_back({ctx, alloc_outside_stream_order(ctx, bytes, "scratch arena"), bytes});
  return blocks_.back().ptr;
}

uint64_t ScratchArena::bytes_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const Block& b : blocks_) total += b.bytes;
  return total;
}

void Kernel::launch(cu::CUcontext ctx, cu::CUstream stream, Dim3 grid, void** params, size_t n,
                    ScratchArena* arena) {
  if (grid.empty()) return;
  const LaunchMeta& m = meta();
  cu::CUfunction fn = function(ctx);
  const Driver& d = driver();

  ScratchPtrs scratch;
  std::optional<StreamOrderedBlock> ordered;
  if (m.global_scratch_size || m.profile_scratch_size) {
    ScratchLayout layout(m, grid);
    if (!layout.empty()) {
      cu::CUdeviceptr base;
      if (arena) {
        base = arena->get(ctx, layout.bytes());
      } else if (m.pdl || stream_is_capturing(stream)) {
        base = ordered.emplace(layout.bytes(), stream, kname(m)).ptr;
      } else {
        base = stream_pool().get(ctx, stream, layout.bytes(), kname(m));
      }
      scratch = layout.carve(base);
    }
  }

  constexpr size_t kInline = 64;
  void* inline_args[kInline + 2];
  std::vector<void*> heap_args;
  void** args = inline_args;
  if (n > kInline) {
    heap_args.resize(n + 2);
    args = heap_args.data();
  }
  for (size_t i = 0; i < n; ++i) args[i] = params[i];
  args[n] = &scratch.global;
  args[n + 1] = &scratch.profile;

  cu::CUlaunchConfig cfg{};
  // The user's grid counts clusters: each program is a cluster of num_ctas CTAs.
  cfg.gridDimX = grid.x * m.cluster[0];
  cfg.gridDimY = grid.y * m.cluster[1];
  cfg.gridDimZ = grid.z * m.cluster[2];
  cfg.blockDimX = unsigned(m.warp_size) * unsigned(m.num_warps);
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = m.shared;
  cfg.hStream = stream;
  cfg.attrs = const_cast<cu::CUlaunchAttribute*>(attrs_.data());  // the driver only reads them
  cfg.numAttrs = unsigned(attrs_.size());
  // Online tuning's timed launch (tuning.h LaunchTimer, armed on this thread): its events right around it.
  LaunchTimer* timer = LaunchTimer::take_armed();
  if (timer) timer->start(stream);
  cu::CUresult r = d.cuLaunchKernelEx(&cfg, fn, args, nullptr);
  if (r != cu::CUDA_SUCCESS) check(r, kname(m) + ": cuLaunchKernelEx");  // the message only on failure: no allocation
  if (timer) timer->stop(stream);
  counters().launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace lt
