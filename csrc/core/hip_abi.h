// The slice of the HIP runtime ABI (libamdhip64.so) that lazytriton's HIP
// driver layer (csrc/core/hip_driver.cc) uses, declared here so that building
// needs no ROCm: the library is loaded at run time. Values and layouts match
// hip_runtime_api.h of ROCm 6/7; tests/test_abi.py checks them against the HIP
// headers in Triton's wheel (triton/backends/amd/include) with static_asserts.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lt::hip {

using hipError_t = int;
using hipDevice_t = int;
using hipDeviceptr_t = void*;
using hipModule_t = struct ihipModule_t*;
using hipFunction_t = struct ihipModuleSymbol_t*;
using hipStream_t = struct ihipStream_t*;
using hipEvent_t = struct ihipEvent_t*;

constexpr hipError_t hipSuccess = 0;
constexpr hipError_t hipErrorInvalidValue = 1;
constexpr hipError_t hipErrorNoDevice = 100;
constexpr hipError_t hipErrorNotSupported = 801;

// hipDeviceAttribute_t (ROCm 6+ numbering; not CUDA's)
enum DeviceAttr : int {
  hipDeviceAttributeClockRate = 5,
  hipDeviceAttributeCooperativeLaunch = 10,
  hipDeviceAttributeL2CacheSize = 19,
  hipDeviceAttributeComputeCapabilityMajor = 23,
  hipDeviceAttributeMaxThreadsPerBlock = 56,
  hipDeviceAttributeMemoryBusWidth = 59,
  hipDeviceAttributeMemoryClockRate = 60,
  hipDeviceAttributeComputeCapabilityMinor = 61,
  hipDeviceAttributeMultiprocessorCount = 63,
  hipDeviceAttributeMaxRegistersPerBlock = 71,
  hipDeviceAttributeMaxRegistersPerMultiprocessor = 72,
  hipDeviceAttributeMaxSharedMemoryPerBlock = 74,
  hipDeviceAttributeSharedMemPerBlockOptin = 75,
  hipDeviceAttributeWarpSize = 87,
  hipDeviceAttributeMaxSharedMemoryPerMultiprocessor = 10002,
};

// hipFunction_attribute: the same numbering as CUfunction_attribute's first ten.
enum FuncAttr : int {
  HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
  HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
  HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
  HIP_FUNC_ATTRIBUTE_NUM_REGS = 4,
  HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

constexpr int hipStreamCaptureStatusNone = 0;
constexpr int hipStreamCaptureModeRelaxed = 2;
constexpr unsigned kEventDefault = 0;  // hipEventDefault (a macro in HIP's header)

// hipLaunchAttributeID; Triton's HIP launcher writes the cluster dimensions
// under id 4 (CUDA's number; HIP's header has no name for it).
constexpr int hipLaunchAttributeCooperative = 2;
constexpr int kLaunchAttributeClusterDimension = 4;

union hipLaunchAttributeValue {
  char pad[64];
  int cooperative;
};

struct hipLaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  hipLaunchAttributeValue val;
};

// hipDrvLaunchKernelEx's configuration.
struct HIP_LAUNCH_CONFIG {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  hipStream_t hStream;
  hipLaunchAttribute* attrs;
  unsigned numAttrs;
};

// hipDeviceProp_tR0600 (what hipGetDevicePropertiesR0600 fills, ROCm 6+) is read
// only for the architecture name ("gfx942:sramecc+:xnack-"), at this offset; a
// buffer of kDevicePropBytes holds the whole struct (1472 bytes in ROCm 7.1).
constexpr size_t kDevicePropArchNameOffset = 1160;
constexpr size_t kDevicePropArchNameSize = 256;
constexpr size_t kDevicePropBytes = 8192;

static_assert(sizeof(hipLaunchAttribute) == 72, "hipLaunchAttribute layout");
static_assert(offsetof(HIP_LAUNCH_CONFIG, hStream) == 32, "HIP_LAUNCH_CONFIG layout");
static_assert(sizeof(HIP_LAUNCH_CONFIG) == 56, "HIP_LAUNCH_CONFIG layout");

}  // namespace lt::hip
