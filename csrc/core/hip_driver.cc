// The HIP driver layer: AMD's libamdhip64.so behind the one driver table that
// the launch core, the stubs, the XLA handler and the bundles call through.
// Each table entry is an adapter with the CUDA entry point's signature that
// makes the HIP call Triton's HIP launcher (third_party/amd/backend/driver.c)
// makes: modules from hipModuleLoadData, launches with hipModuleLaunchKernel
// (block = warp size x num_warps), hipModuleLaunchCooperativeKernel for a
// cooperative grid and hipDrvLaunchKernelEx with Triton's two attributes
// (cluster dimensions, cooperative) when num_ctas > 1. The parameter buffer is
// the core's, packed once for both vendors. The adapters are bound once, when
// the driver loads: a launch pays one indirect call either way.
//
// HIP has no CUDA-style current context in its runtime API: a "context" here
// is the device ordinal + 1 (hipSetDevice / hipGetDevice), which is what the
// core uses contexts for (per-device modules, scratch, device queries).
#include "hip_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "hip_abi.h"

namespace lt {
namespace {

namespace h = lt::hip;
using cu::CUresult;

struct HipFns {
#include "hip_fns.inc"
#define LT_DECLARE(name, ...) h::hipError_t (*name)(__VA_ARGS__) = nullptr;
  LT_HIP_FNS(LT_DECLARE)
  LT_HIP_OPTIONAL_FNS(LT_DECLARE)
#undef LT_DECLARE
  const char* (*hipGetErrorName)(h::hipError_t) = nullptr;
  const char* (*hipGetErrorString)(h::hipError_t) = nullptr;
};

HipFns g;  // filled once by load_hip, before any adapter can run

template <class T>
T* as(cu::CUdeviceptr p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}
h::hipStream_t stream_of(cu::CUstream s) { return reinterpret_cast<h::hipStream_t>(s); }
h::hipFunction_t fn_of(void* f) { return reinterpret_cast<h::hipFunction_t>(f); }
cu::CUcontext ctx_of_device(int dev) { return reinterpret_cast<cu::CUcontext>(static_cast<uintptr_t>(dev) + 1); }
int device_of_ctx(cu::CUcontext c) { return int(reinterpret_cast<uintptr_t>(c)) - 1; }

// ---- adapters: CUDA entry point signatures, HIP calls ---------------------------

CUresult a_init(unsigned flags) { return g.hipInit(flags); }
CUresult a_driver_version(int* v) { return g.hipDriverGetVersion(v); }
CUresult a_error_name(CUresult e, const char** s) {
  *s = g.hipGetErrorName(e);
  return h::hipSuccess;
}
CUresult a_error_string(CUresult e, const char** s) {
  *s = g.hipGetErrorString(e);
  return h::hipSuccess;
}
CUresult a_device_get(cu::CUdevice* d, int ordinal) { return g.hipDeviceGet(d, ordinal); }
CUresult a_device_count(int* n) { return g.hipGetDeviceCount(n); }
CUresult a_device_name(char* name, int len, cu::CUdevice d) { return g.hipDeviceGetName(name, len, d); }

CUresult a_device_attribute(int* v, int attr, cu::CUdevice d) {
  int hip_attr;
  switch (attr) {
    case cu::MAX_THREADS_PER_BLOCK: hip_attr = h::hipDeviceAttributeMaxThreadsPerBlock; break;
    case cu::MULTIPROCESSOR_COUNT: hip_attr = h::hipDeviceAttributeMultiprocessorCount; break;
    case cu::L2_CACHE_SIZE: hip_attr = h::hipDeviceAttributeL2CacheSize; break;
    case cu::COMPUTE_CAPABILITY_MAJOR: hip_attr = h::hipDeviceAttributeComputeCapabilityMajor; break;
    case cu::COMPUTE_CAPABILITY_MINOR: hip_attr = h::hipDeviceAttributeComputeCapabilityMinor; break;
    case cu::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: hip_attr = h::hipDeviceAttributeMaxSharedMemoryPerMultiprocessor; break;
    case cu::COOPERATIVE_LAUNCH: hip_attr = h::hipDeviceAttributeCooperativeLaunch; break;
    case cu::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: hip_attr = h::hipDeviceAttributeSharedMemPerBlockOptin; break;
    case cu::CLUSTER_LAUNCH:  // HIP launches clusters through hipDrvLaunchKernelEx, where the runtime has it
      *v = g.hipDrvLaunchKernelEx != nullptr;
      return h::hipSuccess;
    default: return h::hipErrorInvalidValue;
  }
  return g.hipDeviceGetAttribute(v, hip_attr, d);
}

CUresult a_primary_ctx_retain(cu::CUcontext* c, cu::CUdevice d) {
  int n = 0;
  h::hipError_t r = g.hipGetDeviceCount(&n);
  if (r != h::hipSuccess) return r;
  if (d < 0 || d >= n) return h::hipErrorInvalidValue;
  *c = ctx_of_device(d);  // the runtime makes each device's primary context itself
  return h::hipSuccess;
}
CUresult a_ctx_get_current(cu::CUcontext* c) {
  int dev = 0;
  h::hipError_t r = g.hipGetDevice(&dev);
  *c = r == h::hipSuccess ? ctx_of_device(dev) : nullptr;
  return r;
}
CUresult a_ctx_set_current(cu::CUcontext c) { return c ? g.hipSetDevice(device_of_ctx(c)) : h::hipSuccess; }
CUresult a_ctx_get_device(cu::CUdevice* d) { return g.hipGetDevice(d); }
CUresult a_ctx_synchronize() { return g.hipDeviceSynchronize(); }

CUresult a_module_load(cu::CUmodule* m, const void* image) {
  return g.hipModuleLoadData(reinterpret_cast<h::hipModule_t*>(m), image);
}
CUresult a_module_unload(cu::CUmodule m) { return g.hipModuleUnload(reinterpret_cast<h::hipModule_t>(m)); }
CUresult a_module_function(cu::CUfunction* f, cu::CUmodule m, const char* name) {
  return g.hipModuleGetFunction(reinterpret_cast<h::hipFunction_t*>(f), reinterpret_cast<h::hipModule_t>(m), name);
}
// hipFunction_attribute numbers the attributes the core reads as CUDA does.
CUresult a_func_attribute(int* v, int attr, cu::CUfunction f) { return g.hipFuncGetAttribute(v, attr, fn_of(f)); }
// Dynamic LDS needs no opt-in on AMD (Triton's HIP loader sets nothing), nor do
// cluster sizes: the core's CUDA opt-ins are no-ops here.
CUresult a_func_set_attribute(cu::CUfunction, int, int) { return h::hipSuccess; }
CUresult a_func_cache_config(cu::CUfunction, int) { return h::hipSuccess; }

CUresult a_launch_kernel(cu::CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned shared, cu::CUstream s, void** params, void** extra) {
  return g.hipModuleLaunchKernel(fn_of(f), gx, gy, gz, bx, by, bz, shared, stream_of(s), params, extra);
}

// The core's launch: its attributes select the HIP call, as Triton's _launch does.
CUresult a_launch_kernel_ex(const cu::CUlaunchConfig* c, cu::CUfunction f, void** params, void** extra) {
  bool cooperative = false;
  unsigned cluster[3] = {1, 1, 1};
  for (unsigned i = 0; i < c->numAttrs; ++i) {
    const cu::CUlaunchAttribute& a = c->attrs[i];
    if (a.id == cu::LAUNCH_ATTR_COOPERATIVE) cooperative = a.value.cooperative != 0;
    if (a.id == cu::LAUNCH_ATTR_CLUSTER_DIMENSION)
      cluster[0] = a.value.clusterDim.x, cluster[1] = a.value.clusterDim.y, cluster[2] = a.value.clusterDim.z;
    // Programmatic dependent launch and cluster scheduling have no HIP counterpart (Triton's AMD
    // backend sets neither); without them a launch is serialised as usual.
  }
  h::hipStream_t s = stream_of(c->hStream);
  if (cluster[0] * cluster[1] * cluster[2] > 1) {
    if (!g.hipDrvLaunchKernelEx) return h::hipErrorNotSupported;
    h::hipLaunchAttribute attrs[2] = {};
    attrs[0].id = h::kLaunchAttributeClusterDimension;
    int dims[3] = {int(cluster[0]), int(cluster[1]), int(cluster[2])};
    std::memcpy(attrs[0].val.pad, dims, sizeof(dims));
    attrs[1].id = h::hipLaunchAttributeCooperative;
    attrs[1].val.cooperative = cooperative;
    h::HIP_LAUNCH_CONFIG cfg{c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                             c->sharedMemBytes, s, attrs, 2};
    return g.hipDrvLaunchKernelEx(&cfg, fn_of(f), params, extra);
  }
  if (cooperative) {
    if (extra) return h::hipErrorInvalidValue;  // it takes kernelParams only (the core never passes `extra`)
    return g.hipModuleLaunchCooperativeKernel(fn_of(f), c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX,
                                              c->blockDimY, c->blockDimZ, c->sharedMemBytes, s, params);
  }
  return g.hipModuleLaunchKernel(fn_of(f), c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                                 c->blockDimZ, c->sharedMemBytes, s, params, extra);
}

CUresult a_mem_alloc(cu::CUdeviceptr* p, size_t n) { return g.hipMalloc(reinterpret_cast<void**>(p), n); }
CUresult a_mem_free(cu::CUdeviceptr p) { return g.hipFree(as<void>(p)); }
CUresult a_mem_alloc_async(cu::CUdeviceptr* p, size_t n, cu::CUstream s) {
  return g.hipMallocAsync(reinterpret_cast<void**>(p), n, stream_of(s));
}
CUresult a_mem_free_async(cu::CUdeviceptr p, cu::CUstream s) { return g.hipFreeAsync(as<void>(p), stream_of(s)); }
CUresult a_mem_alloc_host(void** p, size_t n) { return g.hipHostMalloc(p, n, 0); }
CUresult a_mem_free_host(void* p) { return g.hipHostFree(p); }
CUresult a_mem_info(size_t* f, size_t* t) { return g.hipMemGetInfo(f, t); }
CUresult a_mem_range(cu::CUdeviceptr* base, size_t* size, cu::CUdeviceptr p) {
  return g.hipMemGetAddressRange(reinterpret_cast<h::hipDeviceptr_t*>(base), size, as<void>(p));
}
CUresult a_copy_dd(cu::CUdeviceptr dst, cu::CUdeviceptr src, size_t n, cu::CUstream s) {
  return g.hipMemcpyDtoDAsync(as<void>(dst), as<void>(src), n, stream_of(s));
}
CUresult a_copy_dh(void* dst, cu::CUdeviceptr src, size_t n, cu::CUstream s) {
  return g.hipMemcpyDtoHAsync(dst, as<void>(src), n, stream_of(s));
}
CUresult a_copy_hd(cu::CUdeviceptr dst, const void* src, size_t n, cu::CUstream s) {
  return g.hipMemcpyHtoDAsync(as<void>(dst), src, n, stream_of(s));
}
CUresult a_set8(cu::CUdeviceptr p, unsigned char v, size_t n, cu::CUstream s) {
  return g.hipMemsetD8Async(as<void>(p), v, n, stream_of(s));
}
CUresult a_set32(cu::CUdeviceptr p, unsigned v, size_t n, cu::CUstream s) {
  return g.hipMemsetD32Async(as<void>(p), int(v), n, stream_of(s));
}
CUresult a_event_create(cu::CUevent* e, unsigned flags) {
  return g.hipEventCreateWithFlags(reinterpret_cast<h::hipEvent_t*>(e), flags);
}
CUresult a_event_destroy(cu::CUevent e) { return g.hipEventDestroy(reinterpret_cast<h::hipEvent_t>(e)); }
CUresult a_event_record(cu::CUevent e, cu::CUstream s) {
  return g.hipEventRecord(reinterpret_cast<h::hipEvent_t>(e), stream_of(s));
}
CUresult a_event_sync(cu::CUevent e) { return g.hipEventSynchronize(reinterpret_cast<h::hipEvent_t>(e)); }
CUresult a_event_query(cu::CUevent e) { return g.hipEventQuery(reinterpret_cast<h::hipEvent_t>(e)); }
CUresult a_event_elapsed(float* ms, cu::CUevent a, cu::CUevent b) {
  return g.hipEventElapsedTime(ms, reinterpret_cast<h::hipEvent_t>(a), reinterpret_cast<h::hipEvent_t>(b));
}
CUresult a_stream_sync(cu::CUstream s) { return g.hipStreamSynchronize(stream_of(s)); }
CUresult a_stream_capturing(cu::CUstream s, int* status) { return g.hipStreamIsCapturing(stream_of(s), status); }
CUresult a_stream_ctx(cu::CUstream s, cu::CUcontext* c) {
  int dev = 0;
  // A stream's device where the runtime says (ROCm 6.2+); else the current device.
  h::hipError_t r = (s && g.hipStreamGetDevice) ? g.hipStreamGetDevice(stream_of(s), &dev) : g.hipGetDevice(&dev);
  if (r == h::hipSuccess) *c = ctx_of_device(dev);
  return r;
}
// HIP numbers the pointer attributes as CUDA does (tests/hip_abi_check.cc). Without the entry
// point: not supported, which lt::pointer_device reads as "not told" and lt::pointer_accessible as accessible.
CUresult a_pointer_attribute(void* data, int attr, cu::CUdeviceptr p) {
  if (!g.hipPointerGetAttribute) return h::hipErrorNotSupported;
  return g.hipPointerGetAttribute(data, attr, as<void>(p));
}
CUresult a_exchange_capture_mode(int* mode) { return g.hipThreadExchangeStreamCaptureMode(mode); }
// CUDA tensor maps do not exist on AMD: Triton decomposes host descriptors for
// HIP targets (or builds TDM descriptors on gfx1250, not supported here).
CUresult a_tensor_map(cu::CUtensorMap*, int, uint32_t, void*, const uint64_t*, const uint64_t*, const uint32_t*,
                      const uint32_t*, int, int, int, int) {
  return h::hipErrorNotSupported;
}

void* library(std::string* tried) {
  std::vector<std::string> names;
  if (const char* p = std::getenv("LAZYTRITON_LIBHIP"); p && *p) names.push_back(p);
  for (const char* n : {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"}) names.push_back(n);
  for (const std::string& n : names) {
    if (void* lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
    const char* e = dlerror();
    if (tried->empty() && e) *tried = e;
  }
  return nullptr;
}

}  // namespace

std::string load_hip(Driver& d, bool* present) {
  std::string why;
  void* lib = library(&why);
  *present = lib != nullptr;
  if (!lib) return "no HIP runtime: libamdhip64.so could not be loaded (" + why + ")";
#define LT_RESOLVE(name, ...)                                                                                  \
  g.name = reinterpret_cast<decltype(g.name)>(dlsym(lib, #name));                                           \
  if (!g.name) return "the HIP runtime lacks " #name " (lazytriton needs ROCm 6 or newer)";
  LT_HIP_FNS(LT_RESOLVE)
  LT_RESOLVE(hipGetErrorName)
  LT_RESOLVE(hipGetErrorString)
#undef LT_RESOLVE
#define LT_RESOLVE_OPTIONAL(name, ...) g.name = reinterpret_cast<decltype(g.name)>(dlsym(lib, #name));
  LT_HIP_OPTIONAL_FNS(LT_RESOLVE_OPTIONAL)
#undef LT_RESOLVE_OPTIONAL
  h::hipError_t r = g.hipInit(0);
  if (r != h::hipSuccess) return std::string("no usable AMD GPU: hipInit failed with ") + g.hipGetErrorName(r);
  int n = 0;
  if (g.hipGetDeviceCount(&n) != h::hipSuccess || n == 0) return "no AMD GPU found (hipGetDeviceCount)";
  g.hipDriverGetVersion(&d.version);
  if (d.version / 10000000 < 6) return "the HIP runtime is older than ROCm 6 (hipDriverGetVersion " +
                                       std::to_string(d.version) + "); lazytriton needs ROCm 6 or newer";
  d.backend = Backend::kHip;
  d.cuInit = a_init;
  d.cuDriverGetVersion = a_driver_version;
  d.cuGetErrorName = a_error_name;
  d.cuGetErrorString = a_error_string;
  d.cuDeviceGet = a_device_get;
  d.cuDeviceGetCount = a_device_count;
  d.cuDeviceGetName = a_device_name;
  d.cuDeviceGetAttribute = a_device_attribute;
  d.cuDevicePrimaryCtxRetain = a_primary_ctx_retain;
  d.cuCtxGetCurrent = a_ctx_get_current;
  d.cuCtxSetCurrent = a_ctx_set_current;
  d.cuCtxGetDevice = a_ctx_get_device;
  d.cuCtxSynchronize = a_ctx_synchronize;
  d.cuModuleLoadData = a_module_load;
  d.cuModuleUnload = a_module_unload;
  d.cuModuleGetFunction = a_module_function;
  d.cuFuncGetAttribute = a_func_attribute;
  d.cuFuncSetAttribute = a_func_set_attribute;
  d.cuFuncSetCacheConfig = a_func_cache_config;
  d.cuLaunchKernelEx = a_launch_kernel_ex;
  d.cuLaunchKernel = a_launch_kernel;
  d.cuMemAlloc = a_mem_alloc;
  d.cuMemFree = a_mem_free;
  d.cuMemAllocAsync = a_mem_alloc_async;
  d.cuMemFreeAsync = a_mem_free_async;
  d.cuMemAllocHost = a_mem_alloc_host;
  d.cuMemFreeHost = a_mem_free_host;
  d.cuMemGetInfo = a_mem_info;
  d.cuMemGetAddressRange = a_mem_range;
  d.cuPointerGetAttribute = a_pointer_attribute;
  d.cuMemcpyDtoDAsync = a_copy_dd;
  d.cuMemcpyDtoHAsync = a_copy_dh;
  d.cuMemcpyHtoDAsync = a_copy_hd;
  d.cuMemsetD8Async = a_set8;
  d.cuMemsetD32Async = a_set32;
  d.cuEventCreate = a_event_create;
  d.cuEventDestroy = a_event_destroy;
  d.cuEventRecord = a_event_record;
  d.cuEventSynchronize = a_event_sync;
  d.cuEventQuery = a_event_query;
  d.cuEventElapsedTime = a_event_elapsed;
  d.cuStreamSynchronize = a_stream_sync;
  d.cuStreamIsCapturing = a_stream_capturing;
  d.cuStreamGetCtx = a_stream_ctx;
  d.cuThreadExchangeStreamCaptureMode = a_exchange_capture_mode;
  d.cuTensorMapEncodeTiled = a_tensor_map;
  // Every entry of the table has its adapter: a new entry in driver_fns.inc must get one here.
#define LT_DRIVER_FN(name, ...) \
  if (!d.name) return "internal error: the HIP driver layer has no adapter for " #name;
#include "lazytriton/driver_fns.inc"
#undef LT_DRIVER_FN
  return "";
}

std::string hip_arch_name(int device) {
  std::vector<char> props(h::kDevicePropBytes, 0);
  check(g.hipGetDevicePropertiesR0600(props.data(), device), "hipGetDeviceProperties(" + std::to_string(device) + ")");
  std::string name(props.data() + h::kDevicePropArchNameOffset,
                   strnlen(props.data() + h::kDevicePropArchNameOffset, h::kDevicePropArchNameSize));
  return name.substr(0, name.find(':'));  // "gfx942:sramecc+:xnack-" -> "gfx942", as Triton's target
}

int hip_warp_size(int device) {
  int v = 0;
  check(g.hipDeviceGetAttribute(&v, h::hipDeviceAttributeWarpSize, device), "hipDeviceGetAttribute(warpSize)");
  return v;
}

}  // namespace lt
