#include "lazytriton/isolation.h"

#include <cstring>
#include <map>

namespace lt {

IpcExport ipc_export(cu::CUdeviceptr ptr) {
  const Driver& d = driver();
  IpcExport out;
  if (!d.cuIpcGetMemHandle) {
    out.why = "the driver has no CUDA IPC";
    return out;
  }
  cu::CUdeviceptr base = 0;
  size_t size = 0;
  if (cu::CUresult r = d.cuMemGetAddressRange(&base, &size, ptr); r != cu::CUDA_SUCCESS) {
    out.why = "cuMemGetAddressRange: " + error_name(r);
    return out;
  }
  // Asked first, so that memory of a stream-ordered pool or a VMM mapping (XLA's allocators) is
  // staged without a refused export, an API error under compute-sanitizer. A driver that cannot
  // answer is simply tried.
  int capable = 1;
  if (d.cuPointerGetAttribute(&capable, cu::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, base) ==
          cu::CUDA_SUCCESS &&
      !capable) {
    out.why = "not exportable by CUDA IPC (pool or VMM memory)";
    return out;
  }
  if (cu::CUresult r = d.cuIpcGetMemHandle(&out.handle, base); r != cu::CUDA_SUCCESS) {
    out.why = "cuIpcGetMemHandle: " + error_name(r);
    return out;
  }
  out.ok = true;
  out.offset = ptr - base;
  return out;
}

DeviceCopies::DeviceCopies(cu::CUstream stream, const std::vector<std::pair<uint64_t, uint64_t>>& buffers) {
  const Driver& d = driver();
  uint64_t need = 0;
  for (const auto& [address, bytes] : buffers) {
    addresses_.push_back(need);  // offsets for now
    need += (bytes + 255) / 256 * 256;
  }
  size_t free_b = 0, total_b = 0;
  check(d.cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
  if (need > free_b / 2)  // the helper allocates as much again for its own copies
    throw Error("isolation: no room for " + std::to_string(need) + " bytes of exportable copies (" +
                std::to_string(free_b) + " bytes free)");
  check(d.cuMemAlloc(&block_, need ? need : 1), "isolation: cuMemAlloc of " + std::to_string(need) + " bytes");
  try {
    for (size_t i = 0; i < buffers.size(); ++i) {
      addresses_[i] += block_;
      check(d.cuMemcpyDtoDAsync(addresses_[i], buffers[i].first, buffers[i].second, stream),
            "isolation: cuMemcpyDtoDAsync");
    }
    check(d.cuStreamSynchronize(stream), "isolation: cuStreamSynchronize");
  } catch (...) {
    d.cuMemFree(block_);
    throw;
  }
}

DeviceCopies::~DeviceCopies() { driver().cuMemFree(block_); }

namespace {

struct HandleLess {
  bool operator()(const cu::CUipcMemHandle& a, const cu::CUipcMemHandle& b) const {
    return std::memcmp(a.reserved, b.reserved, sizeof(a.reserved)) < 0;
  }
};

// The allocations the sources name, each opened once (a process may open a handle only once),
// closed when this goes out of scope.
class OpenHandles {
 public:
  cu::CUdeviceptr base(const cu::CUipcMemHandle& h) {
    auto it = open_.find(h);
    if (it != open_.end()) return it->second;
    const Driver& d = driver();
    if (!d.cuIpcOpenMemHandle) throw Error("the driver has no CUDA IPC");
    cu::CUdeviceptr p = 0;
    check(d.cuIpcOpenMemHandle(&p, h, cu::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle");
    open_.emplace(h, p);
    return p;
  }
  ~OpenHandles() {
    for (auto& [h, p] : open_) driver().cuIpcCloseMemHandle(p);
  }

 private:
  std::map<cu::CUipcMemHandle, cu::CUdeviceptr, HandleLess> open_;
};

}  // namespace

TrialBuffers::TrialBuffers(cu::CUstream stream, const std::vector<Source>& sources) {
  const Driver& d = driver();
  try {
    OpenHandles handles;
    for (const Source& s : sources) {
      if (s.bytes == 0) {  // an empty buffer: its address, never read (XLA's zero-size buffers)
        addresses_.push_back(s.address);
        continue;
      }
      const uint64_t shift = s.address % 256;  // cuMemAlloc's blocks are 256-byte aligned
      cu::CUdeviceptr block = 0;
      check(d.cuMemAlloc(&block, s.bytes + shift), "isolation: cuMemAlloc of " + std::to_string(s.bytes) + " bytes");
      blocks_.push_back(block);
      device_bytes_ += s.bytes + shift;
      const cu::CUdeviceptr at = block + shift;
      if (s.ipc)
        check(d.cuMemcpyDtoDAsync(at, handles.base(s.handle) + s.offset, s.bytes, stream),
              "isolation: cuMemcpyDtoDAsync");
      else
        check(d.cuMemcpyHtoDAsync(at, s.host, s.bytes, stream), "isolation: cuMemcpyHtoDAsync");
      addresses_.push_back(at);
    }
    // Every copy done before the handles close and before anything is launched on the copies.
    check(d.cuStreamSynchronize(stream), "isolation: cuStreamSynchronize");
  } catch (...) {
    release();
    throw;
  }
}

TrialBuffers::~TrialBuffers() { release(); }

void TrialBuffers::release() noexcept {
  for (cu::CUdeviceptr b : blocks_) driver().cuMemFree(b);
  blocks_.clear();
}

std::string launch_and_wait(const Entry& e, cu::CUcontext ctx, cu::CUstream stream, const uint64_t* buffers,
                            size_t n) {
  try {
    launch_fixed(e, ctx, stream, buffers, n);
  } catch (const CudaError& ex) {
    // The launch itself refused (out of resources, an invalid configuration): the candidate's
    // run failed. Anything before it (scratch, a descriptor's encoding) is thrown, as in the caller.
    if (std::strstr(ex.what(), ": cuLaunchKernelEx") == nullptr) throw;
    return error_name(ex.code());
  }
  cu::CUresult r = driver().cuStreamSynchronize(stream);
  return r == cu::CUDA_SUCCESS ? "" : error_name(r);
}

}  // namespace lt
