// Compiled (never run) by tests/test_hip_abi.py: lazytriton's own declarations of
// the HIP runtime ABI (lazytriton/hip_abi.h) against the real hip_runtime_api.h
// in Triton's wheel (triton/backends/amd/include). Any difference is a
// static_assert failure.
//   c++ -std=c++17 -fsyntax-only -D__HIP_PLATFORM_AMD__ -I<csrc/include> -I<hip include> hip_abi_check.cc
#include <hip/hip_runtime_api.h>

#include <cstddef>
#include <type_traits>

#include "lazytriton/cuda_abi.h"
#include "hip_abi.h"

namespace h = lt::hip;

#define SAME_VALUE(ours, theirs) static_assert(int(h::ours) == int(theirs), #ours " != " #theirs)

SAME_VALUE(hipSuccess, hipSuccess);
SAME_VALUE(hipErrorInvalidValue, hipErrorInvalidValue);
SAME_VALUE(hipErrorNoDevice, hipErrorNoDevice);
SAME_VALUE(hipErrorNotSupported, hipErrorNotSupported);

SAME_VALUE(hipDeviceAttributeClockRate, hipDeviceAttributeClockRate);
SAME_VALUE(hipDeviceAttributeCooperativeLaunch, hipDeviceAttributeCooperativeLaunch);
SAME_VALUE(hipDeviceAttributeL2CacheSize, hipDeviceAttributeL2CacheSize);
SAME_VALUE(hipDeviceAttributeComputeCapabilityMajor, hipDeviceAttributeComputeCapabilityMajor);
SAME_VALUE(hipDeviceAttributeMaxThreadsPerBlock, hipDeviceAttributeMaxThreadsPerBlock);
SAME_VALUE(hipDeviceAttributeMemoryBusWidth, hipDeviceAttributeMemoryBusWidth);
SAME_VALUE(hipDeviceAttributeMemoryClockRate, hipDeviceAttributeMemoryClockRate);
SAME_VALUE(hipDeviceAttributeComputeCapabilityMinor, hipDeviceAttributeComputeCapabilityMinor);
SAME_VALUE(hipDeviceAttributeMultiprocessorCount, hipDeviceAttributeMultiprocessorCount);
SAME_VALUE(hipDeviceAttributeMaxRegistersPerBlock, hipDeviceAttributeMaxRegistersPerBlock);
SAME_VALUE(hipDeviceAttributeMaxRegistersPerMultiprocessor, hipDeviceAttributeMaxRegistersPerMultiprocessor);
SAME_VALUE(hipDeviceAttributeMaxSharedMemoryPerBlock, hipDeviceAttributeMaxSharedMemoryPerBlock);
SAME_VALUE(hipDeviceAttributeSharedMemPerBlockOptin, hipDeviceAttributeSharedMemPerBlockOptin);
SAME_VALUE(hipDeviceAttributeWarpSize, hipDeviceAttributeWarpSize);
SAME_VALUE(hipDeviceAttributeMaxSharedMemoryPerMultiprocessor, hipDeviceAttributeMaxSharedMemoryPerMultiprocessor);

SAME_VALUE(HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
SAME_VALUE(HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
SAME_VALUE(HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
SAME_VALUE(HIP_FUNC_ATTRIBUTE_NUM_REGS, HIP_FUNC_ATTRIBUTE_NUM_REGS);
SAME_VALUE(HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
// The core hands CUDA's numbers for the function attributes it reads straight through.
static_assert(int(lt::cu::FUNC_MAX_THREADS_PER_BLOCK) == int(HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK), "func attr");
static_assert(int(lt::cu::FUNC_SHARED_SIZE_BYTES) == int(HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES), "func attr");
static_assert(int(lt::cu::FUNC_NUM_REGS) == int(HIP_FUNC_ATTRIBUTE_NUM_REGS), "func attr");

SAME_VALUE(hipStreamCaptureStatusNone, hipStreamCaptureStatusNone);
SAME_VALUE(hipStreamCaptureModeRelaxed, hipStreamCaptureModeRelaxed);
SAME_VALUE(kEventDefault, hipEventDefault);
static_assert(int(lt::cu::CU_EVENT_DEFAULT) == int(hipEventDefault), "event flags");
SAME_VALUE(hipLaunchAttributeCooperative, hipLaunchAttributeCooperative);
// The pointer attributes the core asks for are CUDA's numbers (hip_driver.cc passes them through).
static_assert(int(lt::cu::CU_POINTER_ATTRIBUTE_DEVICE_POINTER) == int(HIP_POINTER_ATTRIBUTE_DEVICE_POINTER), "ptr attr");
static_assert(int(lt::cu::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) == int(HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL), "ptr attr");
static_assert(int(lt::cu::CUDA_ERROR_INVALID_VALUE) == int(hipErrorInvalidValue), "invalid value");
// The capture status and mode the core compares and sets are CUDA's numbers too.
static_assert(int(lt::cu::CU_STREAM_CAPTURE_STATUS_NONE) == int(hipStreamCaptureStatusNone), "capture status");
static_assert(int(lt::cu::CU_STREAM_CAPTURE_MODE_RELAXED) == int(hipStreamCaptureModeRelaxed), "capture mode");

#define SAME_LAYOUT(ours, theirs, field)                                                     \
  static_assert(offsetof(h::ours, field) == offsetof(theirs, field), #ours "." #field " offset"); \
  static_assert(sizeof(h::ours::field) == sizeof(theirs::field), #ours "." #field " size")

static_assert(sizeof(h::hipLaunchAttribute) == sizeof(hipLaunchAttribute), "hipLaunchAttribute size");
static_assert(offsetof(h::hipLaunchAttribute, val) == offsetof(hipLaunchAttribute, val), "hipLaunchAttribute.val offset");
SAME_LAYOUT(hipLaunchAttribute, hipLaunchAttribute, id);
static_assert(sizeof(h::hipLaunchAttributeValue) == sizeof(hipLaunchAttributeValue), "hipLaunchAttributeValue size");
SAME_LAYOUT(hipLaunchAttributeValue, hipLaunchAttributeValue, cooperative);
static_assert(sizeof(h::HIP_LAUNCH_CONFIG) == sizeof(HIP_LAUNCH_CONFIG), "HIP_LAUNCH_CONFIG size");
SAME_LAYOUT(HIP_LAUNCH_CONFIG, HIP_LAUNCH_CONFIG, gridDimX);
SAME_LAYOUT(HIP_LAUNCH_CONFIG, HIP_LAUNCH_CONFIG, blockDimX);
SAME_LAYOUT(HIP_LAUNCH_CONFIG, HIP_LAUNCH_CONFIG, sharedMemBytes);
SAME_LAYOUT(HIP_LAUNCH_CONFIG, HIP_LAUNCH_CONFIG, hStream);
SAME_LAYOUT(HIP_LAUNCH_CONFIG, HIP_LAUNCH_CONFIG, attrs);
SAME_LAYOUT(HIP_LAUNCH_CONFIG, HIP_LAUNCH_CONFIG, numAttrs);

// hipGetDevicePropertiesR0600's struct: where the arch name is, and that the buffer holds it all.
static_assert(h::kDevicePropArchNameOffset == offsetof(hipDeviceProp_tR0600, gcnArchName), "gcnArchName offset");
static_assert(h::kDevicePropArchNameSize == sizeof(hipDeviceProp_tR0600::gcnArchName), "gcnArchName size");
static_assert(h::kDevicePropBytes >= sizeof(hipDeviceProp_tR0600), "device properties buffer");
// The R0600 entry point's signature (what hip_driver.cc resolves by name).
static_assert(std::is_same_v<decltype(&hipGetDevicePropertiesR0600), hipError_t (*)(hipDeviceProp_tR0600*, int)>,
              "hipGetDevicePropertiesR0600 signature");

// Entry point signatures (lazytriton/hip_fns.inc) against hip_runtime_api.h.
namespace abi {
// Our handle types as HIP's header declares them.
template <class T> struct Real { using type = T; };
template <> struct Real<h::hipModule_t> { using type = hipModule_t; };
template <> struct Real<h::hipFunction_t> { using type = hipFunction_t; };
template <> struct Real<h::hipStream_t> { using type = hipStream_t; };
template <> struct Real<h::hipEvent_t> { using type = hipEvent_t; };
template <> struct Real<h::HIP_LAUNCH_CONFIG> { using type = HIP_LAUNCH_CONFIG; };

// One parameter: identical after mapping; an int where the header has an enum of
// that size; our void* where the header has a pointer to a struct we only address
// as bytes (hipDeviceProp_tR0600); through matching pointers.
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
    using RP = std::remove_pointer_t<R>;
    using TP = std::remove_pointer_t<Theirs>;
    if constexpr (std::is_void_v<RP> && std::is_class_v<TP>) return std::is_const_v<RP> == std::is_const_v<TP>;
    else return compatible<RP, TP>();
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
      return std::is_same_v<TR, hipError_t> && (compatible<O, T>() && ... && true);
    }
  }
};
}  // namespace abi

// hipMalloc and hipHostMalloc are also templates in C++: the plain declaration is the one
// dlsym finds, picked by its own signature.
#define LT_PLAIN(name) decltype(&::name)
#define LT_CHECK_FN(name, ...)                                                            \
  static_assert(abi::Match<void(__VA_ARGS__), LT_PICK_##name>::value(), #name ": signature differs from hip_runtime_api.h");
#define LT_PICK_hipMalloc hipError_t (*)(void**, size_t)
#define LT_PICK_hipHostMalloc hipError_t (*)(void**, size_t, unsigned)
#define LT_PICK_hipMallocAsync hipError_t (*)(void**, size_t, hipStream_t)
static_assert(std::is_same_v<decltype(static_cast<hipError_t (*)(void**, size_t)>(&::hipMalloc)), LT_PICK_hipMalloc>);
static_assert(std::is_same_v<decltype(static_cast<hipError_t (*)(void**, size_t, unsigned)>(&::hipHostMalloc)),
                             LT_PICK_hipHostMalloc>);
static_assert(std::is_same_v<decltype(static_cast<hipError_t (*)(void**, size_t, hipStream_t)>(&::hipMallocAsync)),
                             LT_PICK_hipMallocAsync>);
#define LT_PICK_hipInit LT_PLAIN(hipInit)
#define LT_PICK_hipDriverGetVersion LT_PLAIN(hipDriverGetVersion)
#define LT_PICK_hipDeviceGet LT_PLAIN(hipDeviceGet)
#define LT_PICK_hipGetDeviceCount LT_PLAIN(hipGetDeviceCount)
#define LT_PICK_hipDeviceGetName LT_PLAIN(hipDeviceGetName)
#define LT_PICK_hipDeviceGetAttribute LT_PLAIN(hipDeviceGetAttribute)
#define LT_PICK_hipGetDevicePropertiesR0600 LT_PLAIN(hipGetDevicePropertiesR0600)
#define LT_PICK_hipGetDevice LT_PLAIN(hipGetDevice)
#define LT_PICK_hipSetDevice LT_PLAIN(hipSetDevice)
#define LT_PICK_hipDeviceSynchronize LT_PLAIN(hipDeviceSynchronize)
#define LT_PICK_hipModuleLoadData LT_PLAIN(hipModuleLoadData)
#define LT_PICK_hipModuleUnload LT_PLAIN(hipModuleUnload)
#define LT_PICK_hipModuleGetFunction LT_PLAIN(hipModuleGetFunction)
#define LT_PICK_hipFuncGetAttribute LT_PLAIN(hipFuncGetAttribute)
#define LT_PICK_hipModuleLaunchKernel LT_PLAIN(hipModuleLaunchKernel)
#define LT_PICK_hipModuleLaunchCooperativeKernel LT_PLAIN(hipModuleLaunchCooperativeKernel)
#define LT_PICK_hipFree LT_PLAIN(hipFree)
#define LT_PICK_hipFreeAsync LT_PLAIN(hipFreeAsync)
#define LT_PICK_hipHostFree LT_PLAIN(hipHostFree)
#define LT_PICK_hipMemGetInfo LT_PLAIN(hipMemGetInfo)
#define LT_PICK_hipMemGetAddressRange LT_PLAIN(hipMemGetAddressRange)
#define LT_PICK_hipMemcpyDtoDAsync LT_PLAIN(hipMemcpyDtoDAsync)
#define LT_PICK_hipMemcpyDtoHAsync LT_PLAIN(hipMemcpyDtoHAsync)
#define LT_PICK_hipMemcpyHtoDAsync LT_PLAIN(hipMemcpyHtoDAsync)
#define LT_PICK_hipMemsetD8Async LT_PLAIN(hipMemsetD8Async)
#define LT_PICK_hipMemsetD32Async LT_PLAIN(hipMemsetD32Async)
#define LT_PICK_hipEventCreateWithFlags LT_PLAIN(hipEventCreateWithFlags)
#define LT_PICK_hipEventDestroy LT_PLAIN(hipEventDestroy)
#define LT_PICK_hipEventRecord LT_PLAIN(hipEventRecord)
#define LT_PICK_hipEventSynchronize LT_PLAIN(hipEventSynchronize)
#define LT_PICK_hipEventQuery LT_PLAIN(hipEventQuery)
#define LT_PICK_hipEventElapsedTime LT_PLAIN(hipEventElapsedTime)
#define LT_PICK_hipStreamSynchronize LT_PLAIN(hipStreamSynchronize)
#define LT_PICK_hipStreamIsCapturing LT_PLAIN(hipStreamIsCapturing)
#define LT_PICK_hipThreadExchangeStreamCaptureMode LT_PLAIN(hipThreadExchangeStreamCaptureMode)
#define LT_PICK_hipDrvLaunchKernelEx LT_PLAIN(hipDrvLaunchKernelEx)
#define LT_PICK_hipStreamGetDevice LT_PLAIN(hipStreamGetDevice)
#define LT_PICK_hipPointerGetAttribute LT_PLAIN(hipPointerGetAttribute)

namespace h = lt::hip;
#include "hip_fns.inc"
LT_HIP_FNS(LT_CHECK_FN)
LT_HIP_OPTIONAL_FNS(LT_CHECK_FN)
static_assert(std::is_same_v<decltype(&::hipGetErrorName), const char* (*)(hipError_t)>, "hipGetErrorName");
static_assert(std::is_same_v<decltype(&::hipGetErrorString), const char* (*)(hipError_t)>, "hipGetErrorString");
