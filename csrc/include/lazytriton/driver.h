// The GPU driver, loaded on first use (no toolkit at build time, and a process
// without a GPU can load this library and fail cleanly): CUDA's libcuda.so.1,
// or, where that has no device (or LAZYTRITON_DRIVER=hip), AMD's libamdhip64.so
// under the same table (csrc/core/hip_driver.cc: each entry an adapter that
// calls the HIP runtime as Triton's HIP launcher does). The choice is made once,
// so a launch calls through the same function pointers on either vendor.
#pragma once
#include <stdexcept>
#include <string>

#include "lazytriton/cuda_abi.h"

namespace lt {

// Every failure the runtime reports: a message naming the kernel (when there is
// one) and, for driver failures, the CUDA error name (e.g. CUDA_ERROR_OUT_OF_MEMORY).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CudaError : public Error {
 public:
  CudaError(cu::CUresult code, const std::string& what);
  cu::CUresult code() const { return code_; }

 private:
  cu::CUresult code_;
};

enum class Backend { kCuda, kHip };

struct Driver {
#define LT_DRIVER_FN(name, ...) cu::CUresult (*name)(__VA_ARGS__) = nullptr;
#define LT_DRIVER_OPTIONAL_FN LT_DRIVER_FN
#include "lazytriton/driver_fns.inc"
#undef LT_DRIVER_OPTIONAL_FN
#undef LT_DRIVER_FN
  int version = 0;
  Backend backend = Backend::kCuda;
};

// The loaded driver. Throws lt::Error if no driver loads or none has a device
// (e.g. no GPU); the failure is remembered so every later call reports it too.
// LAZYTRITON_DRIVER=cuda|hip picks one (default: CUDA, else HIP).
const Driver& driver();

// Whether a usable driver and device exist, without throwing; `why` gets the reason.
bool driver_available(std::string* why = nullptr);

// "CUDA_ERROR_X" for a result code (falls back to the number without a driver).
std::string error_name(cu::CUresult code);

// Throws CudaError naming `what` (e.g. "kernel add: cuLaunchKernelEx") if code != 0.
inline void check(cu::CUresult code, const char* what) {
  if (code != cu::CUDA_SUCCESS) throw CudaError(code, what);
}
void check(cu::CUresult code, const std::string& what);

// The calling thread's current context; if it has none, device 0's primary
// context (or LAZYTRITON_DEVICE's) is made current, as the CUDA runtime would.
cu::CUcontext current_context();
int context_device(cu::CUcontext ctx);
// context_device for a launch: remembered per thread for the context it last asked about
// (a context handle is not reused for another device while the process holds modules in it).
int launch_device(cu::CUcontext ctx);

// The device ordinal of the memory at `ptr` (cuPointerGetAttribute DEVICE_ORDINAL), or -1 when
// the driver does not tell (host memory, an address no allocation holds, a HIP runtime without it).
int pointer_device(cu::CUdeviceptr ptr) noexcept;
// Whether a kernel launched in the current context may read `ptr`: Triton's launcher check
// (cuPointerGetAttribute DEVICE_POINTER answers anything but CUDA_ERROR_INVALID_VALUE): memory of
// this device, of a peer with peer access enabled, managed or mapped host memory. True when
// there is no driver to ask (a launch then fails for that reason).
bool pointer_accessible(cu::CUdeviceptr ptr) noexcept;

// The primary context of `device`, retained once for the life of the process.
cu::CUcontext primary_context(int device);

// Makes `ctx` current for a scope and restores the previous one afterwards.
class ContextGuard {
 public:
  explicit ContextGuard(cu::CUcontext ctx);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  cu::CUcontext prev_ = nullptr;
  bool switched_ = false;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int max_threads_per_block = 0;
  int max_shared_optin = 0;
  int max_shared_per_sm = 0;
  int l2_bytes = 0;
  bool cooperative = false;
  bool cluster_launch = false;
  int driver_version = 0;
  // The compile target: "sm_90" (CUDA), "gfx942" (HIP: the arch name without
  // its feature suffix), and the warp (wavefront) size, 32 or 64.
  bool hip = false;
  std::string arch;
  int warp_size = 32;
};
// Cached per device after the first query.
const DeviceInfo& device_info(int device);
int device_count();

bool stream_is_capturing(cu::CUstream stream);

}  // namespace lt
