// Compiled (never run) by tests/test_abi.py: lazytriton's own declarations of the
// CUDA driver ABI (lazytriton/cuda_abi.h, lazytriton/driver_fns.inc) against a
// real cuda.h + cudaTypedefs.h. Any difference is a static_assert failure.
//   c++ -std=c++17 -fsyntax-only -I<csrc/include> -I<cuda include> abi_check.cc
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstddef>
#include <type_traits>

#include "lazytriton/cuda_abi.h"

namespace cu = lt::cu;

#define SAME_VALUE(ours, theirs) static_assert(int(cu::ours) == int(theirs), #ours " != " #theirs)

// Result codes and enum values.
SAME_VALUE(CUDA_SUCCESS, CUDA_SUCCESS);
SAME_VALUE(CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
SAME_VALUE(CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME_VALUE(CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);

SAME_VALUE(MAX_THREADS_PER_BLOCK, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
SAME_VALUE(MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
SAME_VALUE(L2_CACHE_SIZE, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
SAME_VALUE(COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
SAME_VALUE(COMPUTE_CAPABILITY_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
SAME_VALUE(MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
SAME_VALUE(COOPERATIVE_LAUNCH, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
SAME_VALUE(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
SAME_VALUE(CLUSTER_LAUNCH, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH);

SAME_VALUE(FUNC_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
SAME_VALUE(FUNC_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
SAME_VALUE(FUNC_LOCAL_SIZE_BYTES, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
SAME_VALUE(FUNC_NUM_REGS, CU_FUNC_ATTRIBUTE_NUM_REGS);
SAME_VALUE(FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
SAME_VALUE(FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED);

SAME_VALUE(CU_FUNC_CACHE_PREFER_SHARED, CU_FUNC_CACHE_PREFER_SHARED);
SAME_VALUE(CU_CLUSTER_SCHEDULING_POLICY_SPREAD, CU_CLUSTER_SCHEDULING_POLICY_SPREAD);
SAME_VALUE(CU_EVENT_DEFAULT, CU_EVENT_DEFAULT);
SAME_VALUE(CU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_NONE);
SAME_VALUE(CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_RELAXED);

SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_TFLOAT32, CU_TENSOR_MAP_DATA_TYPE_TFLOAT32);
SAME_VALUE(CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_INTERLEAVE_NONE);
SAME_VALUE(CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_SWIZZLE_128B);
SAME_VALUE(CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
SAME_VALUE(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
SAME_VALUE(CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA, CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA);

SAME_VALUE(LAUNCH_ATTR_COOPERATIVE, CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
SAME_VALUE(LAUNCH_ATTR_CLUSTER_DIMENSION, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
SAME_VALUE(LAUNCH_ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE);
SAME_VALUE(LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);

// Scalar and handle types: same size (and, for handles, both pointers).
#define SAME_SIZE(ours, theirs) static_assert(sizeof(cu::ours) == sizeof(theirs), "sizeof " #ours)
SAME_SIZE(CUresult, CUresult);
SAME_SIZE(CUdevice, CUdevice);
SAME_SIZE(CUdeviceptr, CUdeviceptr);
static_assert(std::is_unsigned_v<cu::CUdeviceptr>, "CUdeviceptr is unsigned");
static_assert(std::is_pointer_v<cu::CUcontext> && std::is_pointer_v<CUcontext>, "CUcontext");
static_assert(std::is_pointer_v<cu::CUmodule> && std::is_pointer_v<CUmodule>, "CUmodule");
static_assert(std::is_pointer_v<cu::CUfunction> && std::is_pointer_v<CUfunction>, "CUfunction");
static_assert(std::is_pointer_v<cu::CUstream> && std::is_pointer_v<CUstream>, "CUstream");
static_assert(std::is_pointer_v<cu::CUevent> && std::is_pointer_v<CUevent>, "CUevent");

// Struct layouts: sizes and every field's offset.
#define SAME_FIELD(type, field)                                                   \
  static_assert(offsetof(cu::type, field) == offsetof(type, field), #type "." #field " offset"); \
  static_assert(sizeof(cu::type::field) == sizeof(type::field), #type "." #field " size")
SAME_SIZE(CUtensorMap, CUtensorMap);
SAME_SIZE(CUipcMemHandle, CUipcMemHandle);
static_assert(cu::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS == CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, "CUipcMem_flags");
static_assert(alignof(cu::CUtensorMap) >= alignof(CUtensorMap), "CUtensorMap alignment");
// 128 whatever the header says (CUDA 12.x headers: 64, 13.x: 128): Triton's launcher keeps its maps
// 128-byte aligned and refuses others, and the parameters lazytriton packs live in DescParams.
static_assert(alignof(cu::CUtensorMap) >= 128, "CUtensorMap alignment below 128 bytes");
SAME_SIZE(CUlaunchAttributeValue, CUlaunchAttributeValue);
SAME_FIELD(CUlaunchAttributeValue, cooperative);
SAME_FIELD(CUlaunchAttributeValue, clusterDim);
SAME_FIELD(CUlaunchAttributeValue, clusterSchedulingPolicyPreference);
SAME_FIELD(CUlaunchAttributeValue, programmaticStreamSerializationAllowed);
static_assert(offsetof(cu::CUlaunchAttributeValue, clusterDim.y) == offsetof(CUlaunchAttributeValue, clusterDim.y));
static_assert(offsetof(cu::CUlaunchAttributeValue, clusterDim.z) == offsetof(CUlaunchAttributeValue, clusterDim.z));
SAME_SIZE(CUlaunchAttribute, CUlaunchAttribute);
SAME_FIELD(CUlaunchAttribute, id);
SAME_FIELD(CUlaunchAttribute, value);
SAME_SIZE(CUlaunchConfig, CUlaunchConfig);
SAME_FIELD(CUlaunchConfig, gridDimX);
SAME_FIELD(CUlaunchConfig, gridDimY);
SAME_FIELD(CUlaunchConfig, gridDimZ);
SAME_FIELD(CUlaunchConfig, blockDimX);
SAME_FIELD(CUlaunchConfig, blockDimY);
SAME_FIELD(CUlaunchConfig, blockDimZ);
SAME_FIELD(CUlaunchConfig, sharedMemBytes);
SAME_FIELD(CUlaunchConfig, hStream);
SAME_FIELD(CUlaunchConfig, attrs);
SAME_FIELD(CUlaunchConfig, numAttrs);

// Driver entry points. lazytriton gets them from cuGetProcAddress with the ABI of
// CUDA 12.0 (driver.cc kRequestedAbi), i.e. the newest version of each that is
// not newer than 12000: cudaTypedefs.h names each version PFN_<name>_v<version>.
// test_abi.py checks these choices against cudaTypedefs.h. (The pfn_ prefix keeps
// cuda.h's macros, e.g. cuMemAlloc -> cuMemAlloc_v2, off these names.)
namespace want {
using pfn_cuInit = PFN_cuInit_v2000;
using pfn_cuDriverGetVersion = PFN_cuDriverGetVersion_v2020;
using pfn_cuGetErrorName = PFN_cuGetErrorName_v6000;
using pfn_cuGetErrorString = PFN_cuGetErrorString_v6000;
using pfn_cuDeviceGet = PFN_cuDeviceGet_v2000;
using pfn_cuDeviceGetCount = PFN_cuDeviceGetCount_v2000;
using pfn_cuDeviceGetName = PFN_cuDeviceGetName_v2000;
using pfn_cuDeviceGetAttribute = PFN_cuDeviceGetAttribute_v2000;
using pfn_cuDevicePrimaryCtxRetain = PFN_cuDevicePrimaryCtxRetain_v7000;
using pfn_cuCtxGetCurrent = PFN_cuCtxGetCurrent_v4000;
using pfn_cuCtxSetCurrent = PFN_cuCtxSetCurrent_v4000;
using pfn_cuCtxGetDevice = PFN_cuCtxGetDevice_v2000;
using pfn_cuCtxSynchronize = PFN_cuCtxSynchronize_v2000;
using pfn_cuModuleLoadData = PFN_cuModuleLoadData_v2000;
using pfn_cuModuleUnload = PFN_cuModuleUnload_v2000;
using pfn_cuModuleGetFunction = PFN_cuModuleGetFunction_v2000;
using pfn_cuFuncGetAttribute = PFN_cuFuncGetAttribute_v2020;
using pfn_cuFuncSetAttribute = PFN_cuFuncSetAttribute_v9000;
using pfn_cuFuncSetCacheConfig = PFN_cuFuncSetCacheConfig_v3000;
using pfn_cuLaunchKernelEx = PFN_cuLaunchKernelEx_v11060;
using pfn_cuLaunchKernel = PFN_cuLaunchKernel_v4000;
using pfn_cuMemAlloc = PFN_cuMemAlloc_v3020;
using pfn_cuMemFree = PFN_cuMemFree_v3020;
using pfn_cuMemAllocAsync = PFN_cuMemAllocAsync_v11020;
using pfn_cuMemFreeAsync = PFN_cuMemFreeAsync_v11020;
using pfn_cuMemAllocHost = PFN_cuMemAllocHost_v3020;
using pfn_cuMemFreeHost = PFN_cuMemFreeHost_v2000;
using pfn_cuMemGetInfo = PFN_cuMemGetInfo_v3020;
using pfn_cuMemGetAddressRange = PFN_cuMemGetAddressRange_v3020;
using pfn_cuPointerGetAttribute = PFN_cuPointerGetAttribute_v4000;
using pfn_cuMemcpyDtoDAsync = PFN_cuMemcpyDtoDAsync_v3020;
using pfn_cuMemcpyDtoHAsync = PFN_cuMemcpyDtoHAsync_v3020;
using pfn_cuMemcpyHtoDAsync = PFN_cuMemcpyHtoDAsync_v3020;
using pfn_cuMemsetD8Async = PFN_cuMemsetD8Async_v3020;
using pfn_cuMemsetD32Async = PFN_cuMemsetD32Async_v3020;
using pfn_cuEventCreate = PFN_cuEventCreate_v2000;
using pfn_cuEventDestroy = PFN_cuEventDestroy_v4000;
using pfn_cuEventRecord = PFN_cuEventRecord_v2000;
using pfn_cuEventSynchronize = PFN_cuEventSynchronize_v2000;
using pfn_cuEventQuery = PFN_cuEventQuery_v2000;
using pfn_cuEventElapsedTime = PFN_cuEventElapsedTime_v2000;
using pfn_cuStreamSynchronize = PFN_cuStreamSynchronize_v2000;
using pfn_cuStreamIsCapturing = PFN_cuStreamIsCapturing_v10000;
using pfn_cuStreamGetCtx = PFN_cuStreamGetCtx_v9020;
using pfn_cuThreadExchangeStreamCaptureMode = PFN_cuThreadExchangeStreamCaptureMode_v10010;
using pfn_cuTensorMapEncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;
using pfn_cuIpcGetMemHandle = PFN_cuIpcGetMemHandle_v4010;
using pfn_cuIpcOpenMemHandle = PFN_cuIpcOpenMemHandle_v11000;
using pfn_cuIpcCloseMemHandle = PFN_cuIpcCloseMemHandle_v4010;
}  // namespace want

namespace abi {
// Our types as the driver sees them: handles map to cuda.h's handles, structs to
// cuda.h's structs (their layouts are checked above).
template <class T> struct Real { using type = T; };
template <> struct Real<cu::CUcontext> { using type = CUcontext; };
template <> struct Real<cu::CUmodule> { using type = CUmodule; };
template <> struct Real<cu::CUfunction> { using type = CUfunction; };
template <> struct Real<cu::CUstream> { using type = CUstream; };
template <> struct Real<cu::CUevent> { using type = CUevent; };
template <> struct Real<cu::CUlaunchConfig> { using type = CUlaunchConfig; };
template <> struct Real<cu::CUtensorMap> { using type = CUtensorMap; };
template <> struct Real<cu::CUipcMemHandle> { using type = CUipcMemHandle; };

// One parameter: identical after mapping, or an int where cuda.h has an enum of
// the same size (CUresult, CUdevice_attribute, ...), through matching pointers.
template <class Ours, class Theirs>
constexpr bool compatible() {
  using R = typename Real<std::remove_cv_t<Ours>>::type;
  if constexpr (std::is_const_v<Ours> != std::is_const_v<Theirs>) {
    return false;
  } else if constexpr (std::is_same_v<R, std::remove_cv_t<Theirs>>) {
    return true;
  } else if constexpr (std::is_enum_v<Theirs>) {
    return std::is_integral_v<R> && sizeof(R) == sizeof(Theirs);
  } else if constexpr (std::is_pointer_v<R> && std::is_pointer_v<Theirs>) {
    return compatible<std::remove_pointer_t<R>, std::remove_pointer_t<Theirs>>();
  } else {
    return false;
  }
}

template <class Ours, class Theirs> struct Match;
template <class... O, class TR, class... T>
struct Match<void(O...), TR (*)(T...)> {
  static constexpr bool value() {
    if constexpr (sizeof...(O) != sizeof...(T)) {
      return false;
    } else {
      return compatible<cu::CUresult, TR>() && (compatible<O, T>() && ... && true);
    }
  }
};
}  // namespace abi

#define LT_DRIVER_FN(name, ...) \
  static_assert(abi::Match<void(__VA_ARGS__), want::pfn_##name>::value(), #name ": signature differs from cuda.h");
#define LT_DRIVER_OPTIONAL_FN LT_DRIVER_FN
#include "lazytriton/driver_fns.inc"
#undef LT_DRIVER_OPTIONAL_FN
#undef LT_DRIVER_FN
