// Compiled (never run) by tests/test_hip_abi.py: lazytriton's own declarations of
// the HIP runtime ABI (lazytriton/hip_abi.h) against the real hip_runtime_api.h
// in Triton's wheel (triton/backends/amd/include). Any difference is a
// static_assert failure.
//   c++ -std=c++17 -fsyntax-only -D__HIP_PLATFORM_AMD__ -I<csrc/include> -I<hip include> hip_abi_check.cc
#include <hip/hip_runtime_api.h>

#include <cstddef>
#include <type_traits>

#include "lazytriton/cuda_abi.h"
#include "lazytriton/hip_abi.h"

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
