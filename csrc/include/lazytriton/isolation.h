// A candidate's first launch in a process of its own (lazytriton/runtime/isolation.py): the
// caller exports the call's buffers (CUDA IPC where the allocation allows it, else their bytes
// staged through host memory); the helper process copies them into memory of its own context,
// launches the candidate once through the one launch path (launch_fixed -> Kernel::launch) and
// waits for it. A candidate that faults kills the helper's context, never the caller's.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lazytriton/call_site.h"

namespace lt {

// The caller's side: the allocation holding `ptr` exported by cuIpcGetMemHandle on its base
// (cuMemGetAddressRange), and `ptr`'s offset in it. ok = false, `why` saying why, where the
// allocation cannot be exported (stream-ordered pools, virtual memory management, a driver
// without IPC): the caller then stages the buffer through host memory.
struct IpcExport {
  bool ok = false;
  std::string why;
  cu::CUipcMemHandle handle{};
  uint64_t offset = 0;
};
IpcExport ipc_export(cu::CUdeviceptr ptr);

// The caller's side, for buffers whose allocation cannot be exported (XLA's allocators'): copies
// in one block of the caller's own device memory (cuMemAlloc: exportable), each at a 256-byte
// boundary, copied on `stream` and waited for, so that they too reach the helper by IPC rather
// than through host memory (an H200's JAX program of 16 kernels: 13 ms a candidate through
// /dev/shm, 3 ms by IPC). Throws where the device has no room for them and the helper's copies
// of the same bytes; the block is freed with this.
class DeviceCopies {
 public:
  DeviceCopies(cu::CUstream stream, const std::vector<std::pair<uint64_t, uint64_t>>& buffers);  // (address, bytes)
  ~DeviceCopies();
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;

  const std::vector<uint64_t>& addresses() const { return addresses_; }  // each buffer's copy

 private:
  cu::CUdeviceptr block_ = 0;
  std::vector<uint64_t> addresses_;
};

// The helper's side: its own copies of a call's buffers, in the current context, each placed at
// the original address's offset modulo 256 (alignment-specialized code sees the same alignment).
// An IPC source is opened, copied and closed before the constructor returns: the caller's memory
// is never mapped while a candidate runs, so not even a wild write can reach it.
class TrialBuffers {
 public:
  struct Source {
    bool ipc = false;
    cu::CUipcMemHandle handle{};  // ipc: the allocation, and the buffer's offset in it
    uint64_t offset = 0;
    const void* host = nullptr;  // staged: the buffer's bytes
    uint64_t bytes = 0;
    uint64_t address = 0;  // the caller's address (its alignment is kept)
  };
  TrialBuffers(cu::CUstream stream, const std::vector<Source>& sources);
  ~TrialBuffers();
  TrialBuffers(const TrialBuffers&) = delete;
  TrialBuffers& operator=(const TrialBuffers&) = delete;

  const std::vector<uint64_t>& addresses() const { return addresses_; }
  uint64_t device_bytes() const { return device_bytes_; }

 private:
  void release() noexcept;
  std::vector<cu::CUdeviceptr> blocks_;
  std::vector<uint64_t> addresses_;
  uint64_t device_bytes_ = 0;
};

// Launches `e` once on `buffers` (launch_fixed) and waits for it: "" when it ran clean, else the
// driver's error name (CUDA_ERROR_ILLEGAL_ADDRESS, ...). Module loading errors are thrown (they
// are the candidate's, not its run's: the caller meets them too, harmlessly).
std::string launch_and_wait(const Entry& e, cu::CUcontext ctx, cu::CUstream stream, const uint64_t* buffers,
                            size_t n);

}  // namespace lt
