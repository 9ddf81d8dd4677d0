// A compiled Triton kernel (cubin, or HSACO for AMD, + launch metadata), loaded
// per context and launched through the driver table's cuLaunchKernelEx (the
// HIP layer maps it onto Triton's HIP launch) honouring every Triton 3.x launch field.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lazytriton/driver.h"
#include "lazytriton/tensor_desc.h"

namespace lt {

// The launch-relevant fields of Triton's compiled-kernel metadata.
struct LaunchMeta {
  std::string name;  // the kernel symbol in the cubin
  int num_warps = 4;
  int num_ctas = 1;
  // CTAs per cluster in x, y, z: (num_ctas, 1, 1) from Triton 3.6 on; 3.5's
  // metadata spells it out as cluster_dims.
  unsigned cluster[3] = {1, 1, 1};
  unsigned shared = 0;  // dynamic shared memory bytes
  unsigned tmem_size = 0;  // columns of tensor memory (sm_100+)
  uint64_t global_scratch_size = 0, global_scratch_align = 1;
  uint64_t profile_scratch_size = 0, profile_scratch_align = 1;
  bool cooperative = false;  // launch_cooperative_grid
  bool pdl = false;          // launch_pdl (programmatic dependent launch)
  int arch = 0;              // compute capability the cubin was built for, e.g. 90 (CUDA)
  std::string gfx;           // the AMD target an HSACO was built for, e.g. "gfx942" (HIP; empty: CUDA)
  int warp_size = 32;        // threads per warp (wavefront) of the target: a block is warp_size * num_warps
  // Host-side tensor descriptor parameters (tensor_desc.h): how each was
  // lowered (tensordesc_meta; empty: decomposed), and the parameter layout of
  // the Triton version that compiled it.
  std::vector<TmaMeta> tensordesc;
  int tensordesc_abi = kTensorDescAbiLatest;

  // The plain fields (numbers and flags), each with its name in Triton's metadata: read by the
  // decoder (kernel.cc launch_meta_from) and reported back (Python's Kernel.metadata) through
  // this one list. f(name, field) for each; M: LaunchMeta or const LaunchMeta.
  template <class M, class F>
  static void each_field(M& m, F&& f) {
    f("num_warps", m.num_warps);
    f("num_ctas", m.num_ctas);
    f("shared", m.shared);
    f("tmem_size", m.tmem_size);
    f("global_scratch_size", m.global_scratch_size);
    f("global_scratch_align", m.global_scratch_align);
    f("profile_scratch_size", m.profile_scratch_size);
    f("profile_scratch_align", m.profile_scratch_align);
    f("launch_cooperative_grid", m.cooperative);
    f("launch_pdl", m.pdl);
  }
};

// Decodes launch metadata given as JSON: Triton's (a compiled kernel's) or lazytriton's (a
// bundle variant's); the one reader of both (kernel.cc). Throws lt::Error naming a bad field.
LaunchMeta launch_meta_from_json(const std::string& text);

struct KernelImage {
  std::string cubin;
  LaunchMeta meta;
  std::string metadata_json;  // the metadata `meta` was decoded from, where kept (Python's kernels)
};

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  bool empty() const { return x == 0 || y == 0 || z == 0; }
};

// Checks a kernel's needs against a device's limits; empty string if it fits,
// otherwise the reason (used to skip tuning candidates and to refuse launches).
std::string check_fits(const LaunchMeta& meta, const DeviceInfo& dev);

// Scratch memory of one launch: Triton's global and profile scratch pointers.
struct ScratchPtrs {
  cu::CUdeviceptr global = 0, profile = 0;
};

// Scratch memory owned by one launch site whose launches may be recorded into
// a CUDA graph and replayed later (the JAX handler keeps one per custom-call
// instruction). A recorded graph holds the addresses, so blocks live as long
// as the arena: a larger need adds a block and keeps the old ones. A block is
// allocated outside any stream order (cuMemAlloc), also while the stream is
// being captured (the thread's capture mode is relaxed for it): a
// stream-ordered allocation inside a captured child graph is refused by CUDA.
class ScratchArena {
 public:
  ScratchArena() = default;
  ~ScratchArena();
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;

  // At least `bytes` bytes in `ctx`, aligned to 256 bytes.
  cu::CUdeviceptr get(cu::CUcontext ctx, uint64_t bytes);
  uint64_t bytes_held() const;

 private:
  struct Block {
    cu::CUcontext ctx;
    cu::CUdeviceptr ptr;
    uint64_t bytes;
  };
  mutable std::mutex mu_;
  std::vector<Block> blocks_;  // per context, the last one is the largest
};

class Kernel {
 public:
  explicit Kernel(std::shared_ptr<const KernelImage> image);
  ~Kernel();
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  const LaunchMeta& meta() const { return image_->meta; }
  const KernelImage& image() const { return *image_; }

  // The function in `ctx`, loading the module there on first use.
  cu::CUfunction function(cu::CUcontext ctx);

  // Launches on `stream` in the current context. `params` holds the kernel's
  // runtime arguments (n of them); the two hidden scratch pointers Triton
  // appends are added here. A grid with a zero dimension launches nothing.
  // Scratch, for kernels that need it, comes from `arena` when given, else
  // from a per-stream pool (stream-ordered allocations when the stream is
  // being captured or the kernel uses programmatic dependent launch).
  void launch(cu::CUstream stream, Dim3 grid, void** params, size_t n);
  void launch(cu::CUcontext ctx, cu::CUstream stream, Dim3 grid, void** params, size_t n,
              ScratchArena* arena = nullptr);

 private:
  struct Loaded {
    cu::CUcontext ctx;
    cu::CUmodule module;
    cu::CUfunction function;
  };
  cu::CUfunction load(cu::CUcontext ctx);

  std::shared_ptr<const KernelImage> image_;
  std::vector<cu::CUlaunchAttribute> attrs_;  // what the metadata asks of every launch (kernel.cc kLaunchAttrs)
  static constexpr size_t kMaxContexts = 16;
  std::array<Loaded, kMaxContexts> loaded_{};
  std::atomic<size_t> n_loaded_{0};
  std::mutex load_mu_;
};

// Process-wide counters (for tests and users: "no trial launch happened").
struct Counters {
  std::atomic<uint64_t> launches{0};
  std::atomic<uint64_t> module_loads{0};
  std::atomic<uint64_t> bench_launches{0};
  std::atomic<uint64_t> resolves{0};
  std::atomic<uint64_t> scratch_allocs{0};  // device allocations made for scratch (pool growth, arenas, async)
};
Counters& counters();

}  // namespace lt
