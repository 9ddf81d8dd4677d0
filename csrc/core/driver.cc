#include "lazytriton/driver.h"

#include <atomic>

#include "hip_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace lt {
namespace {

// Entry points are requested with the ABI of this CUDA version, so the
// signatures in driver_fns.inc stay valid on newer drivers.
constexpr int kRequestedAbi = 12000;

struct LoadState {
  Driver drv;
  std::string error;  // non-empty if loading failed
};

using GetProcV2 = cu::CUresult (*)(const char*, void**, int, unsigned long long, int*);
using GetProcV1 = cu::CUresult (*)(const char*, void**, int, unsigned long long);

std::string load_into(Driver& d) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    return std::string("no CUDA driver: libcuda.so.1 could not be loaded (") +
           (e ? e : "unknown reason") + "); launching Triton kernels needs an NVIDIA GPU and driver";
  }
  auto v2 = reinterpret_cast<GetProcV2>(dlsym(lib, "cuGetProcAddress_v2"));
  auto v1 = reinterpret_cast<GetProcV1>(dlsym(lib, "cuGetProcAddress"));
  if (!v2 && !v1) return "the CUDA driver is too old (no cuGetProcAddress); lazytriton needs a CUDA 12+ driver";
  auto resolve = [&](const char* name, void** slot) -> bool {
    cu::CUresult r = v2 ? v2(name, slot, kRequestedAbi, 0, nullptr) : v1(name, slot, kRequestedAbi, 0);
    return r == cu::CUDA_SUCCESS && *slot != nullptr;
  };
#define LT_DRIVER_FN(name, ...)                                                          \
  if (!resolve(#name, reinterpret_cast<void**>(&d.name)))                                \
    return std::string("the CUDA driver lacks ") + #name + " (a CUDA 12+ driver is needed)";
#include "lazytriton/driver_fns.inc"
#undef LT_DRIVER_FN
#define LT_DRIVER_OPTIONAL_FN(name, ...) \
  if (!resolve(#name, reinterpret_cast<void**>(&d.name))) d.name = nullptr;
#define LT_DRIVER_FN(name, ...)
#include "lazytriton/driver_fns.inc"
#undef LT_DRIVER_FN
#undef LT_DRIVER_OPTIONAL_FN
  cu::CUresult r = d.cuInit(0);
  if (r != cu::CUDA_SUCCESS) {
    const char* name = nullptr;
    d.cuGetErrorName(r, &name);
    return std::string("no usable CUDA device: cuInit failed with ") + (name ? name : "an unknown error");
  }
  d.cuDriverGetVersion(&d.version);
  return "";
}

// CUDA first (its message alone where no ROCm is installed), then HIP;
// LAZYTRITON_DRIVER=cuda|hip takes only that one.
std::string load_any(Driver& d) {
  const char* env = std::getenv("LAZYTRITON_DRIVER");
  std::string want = env ? env : "";
  if (!want.empty() && want != "cuda" && want != "hip")
    return "LAZYTRITON_DRIVER=" + want + " is not a driver lazytriton knows (cuda or hip)";
  bool hip_present = false;
  if (want == "hip") return load_hip(d, &hip_present);
  std::string cuda_error = load_into(d);
  if (cuda_error.empty() || want == "cuda") return cuda_error;
  Driver hip;
  std::string hip_error = load_hip(hip, &hip_present);
  if (hip_error.empty()) {
    d = hip;
    return "";
  }
  return hip_present ? cuda_error + "; " + hip_error : cuda_error;
}

const LoadState& state() {
  static LoadState* s = [] {
    auto* st = new LoadState();  // never freed: launches may run during exit
    st->error = load_any(st->drv);
    return st;
  }();
  return *s;
}

}  // namespace

CudaError::CudaError(cu::CUresult code, const std::string& what)
    : Error(what + " failed: " + error_name(code)), code_(code) {}

void check(cu::CUresult code, const std::string& what) {
  if (code != cu::CUDA_SUCCESS) throw CudaError(code, what);
}

const Driver& driver() {
  const LoadState& s = state();
  if (!s.error.empty()) throw Error("lazytriton: " + s.error);
  return s.drv;
}

bool driver_available(std::string* why) {
  const LoadState& s = state();
  if (why) *why = s.error;
  if (!s.error.empty()) return false;
  int n = 0;
  if (s.drv.cuDeviceGetCount(&n) != cu::CUDA_SUCCESS || n == 0) {
    if (why) *why = s.drv.backend == Backend::kHip ? "no AMD GPU found" : "no CUDA device found";
    return false;
  }
  return true;
}

std::string error_name(cu::CUresult code) {
  const LoadState& s = state();
  const char* name = nullptr;
  if (s.error.empty() && s.drv.cuGetErrorName(code, &name) == cu::CUDA_SUCCESS && name)
    return name;
  return "CUDA error " + std::to_string(code);
}

cu::CUcontext primary_context(int device) {
  // Lock-free after the first call per device: the JAX handler asks on every launch.
  constexpr int kCached = 64;
  static std::atomic<cu::CUcontext> cached[kCached];
  if (device >= 0 && device < kCached)
    if (cu::CUcontext c = cached[device].load(std::memory_order_acquire)) return c;
  static std::mutex mu;
  static std::map<int, cu::CUcontext> ctxs;
  std::lock_guard<std::mutex> lock(mu);
  auto it = ctxs.find(device);
  if (it != ctxs.end()) return it->second;
  const Driver& d = driver();
  cu::CUdevice dev;
  check(d.cuDeviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")");
  cu::CUcontext ctx;
  check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  ctxs[device] = ctx;
  if (device >= 0 && device < kCached) cached[device].store(ctx, std::memory_order_release);
  return ctx;
}

cu::CUcontext current_context() {
  const Driver& d = driver();
  cu::CUcontext ctx = nullptr;
  check(d.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (ctx) return ctx;
  // LAZYTRITON_DEVICE: the device a thread with no current context uses (a C++ program's).
  const char* env = std::getenv("LAZYTRITON_DEVICE");
  int device = 0;
  if (env && *env) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (*end || v < 0 || v > 1 << 20)
      throw Error(std::string("LAZYTRITON_DEVICE='") + env +
                  "' is not a valid setting: it takes a device ordinal >= 0 (or unset for device 0)");
    device = int(v);
    try {
      ctx = primary_context(device);
    } catch (const Error& ex) {  // a device this machine does not have: say which setting chose it
      throw Error(std::string("LAZYTRITON_DEVICE='") + env + "' names a device the driver cannot open: " +
                  ex.what());
    }
  } else {
    ctx = primary_context(device);
  }
  check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

int context_device(cu::CUcontext ctx) {
  ContextGuard guard(ctx);
  cu::CUdevice dev;
  check(driver().cuCtxGetDevice(&dev), "cuCtxGetDevice");
  return dev;
}

int launch_device(cu::CUcontext ctx) {
  thread_local cu::CUcontext last_ctx = nullptr;
  thread_local int last_device = -1;
  if (ctx != last_ctx || last_device < 0) {
    last_device = context_device(ctx);
    last_ctx = ctx;
  }
  return last_device;
}

int pointer_device(cu::CUdeviceptr ptr) noexcept {
  const LoadState& s = state();
  int device = -1;
  if (!s.error.empty() ||
      s.drv.cuPointerGetAttribute(&device, cu::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != cu::CUDA_SUCCESS)
    return -1;
  return device;
}

bool pointer_accessible(cu::CUdeviceptr ptr) noexcept {
  const LoadState& s = state();
  cu::CUdeviceptr p = 0;
  return !s.error.empty() ||
         s.drv.cuPointerGetAttribute(&p, cu::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, ptr) != cu::CUDA_ERROR_INVALID_VALUE;
}

ContextGuard::ContextGuard(cu::CUcontext ctx) {
  const Driver& d = driver();
  check(d.cuCtxGetCurrent(&prev_), "cuCtxGetCurrent");
  if (prev_ != ctx) {
    check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    switched_ = true;
  }
}

ContextGuard::~ContextGuard() {
  if (switched_) driver().cuCtxSetCurrent(prev_);
}

int device_count() {
  int n = 0;
  check(driver().cuDeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

const DeviceInfo& device_info(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<DeviceInfo>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[device];
  if (slot) return *slot;
  const Driver& d = driver();
  cu::CUdevice dev;
  check(d.cuDeviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")");
  auto info = std::make_unique<DeviceInfo>();
  info->ordinal = device;
  char name[256] = {0};
  check(d.cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
  info->name = name;
  auto attr = [&](int a) {
    int v = 0;
    check(d.cuDeviceGetAttribute(&v, a, dev), "cuDeviceGetAttribute");
    return v;
  };
  info->cc_major = attr(cu::COMPUTE_CAPABILITY_MAJOR);
  info->cc_minor = attr(cu::COMPUTE_CAPABILITY_MINOR);
  info->sm_count = attr(cu::MULTIPROCESSOR_COUNT);
  info->max_threads_per_block = attr(cu::MAX_THREADS_PER_BLOCK);
  info->max_shared_optin = attr(cu::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  info->max_shared_per_sm = attr(cu::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  info->l2_bytes = attr(cu::L2_CACHE_SIZE);
  info->cooperative = attr(cu::COOPERATIVE_LAUNCH) != 0;
  info->cluster_launch = attr(cu::CLUSTER_LAUNCH) != 0;
  info->driver_version = d.version;
  info->hip = d.backend == Backend::kHip;
  if (info->hip) {
    info->arch = hip_arch_name(device);
    info->warp_size = hip_warp_size(device);
  } else {
    info->arch = "sm_" + std::to_string(info->cc_major * 10 + info->cc_minor);
  }
  slot = std::move(info);
  return *slot;
}

bool stream_is_capturing(cu::CUstream stream) {
  int status = cu::CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
  return status != cu::CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace lt
