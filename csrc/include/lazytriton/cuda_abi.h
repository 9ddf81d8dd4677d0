// The slice of the CUDA driver ABI that lazytriton uses, declared here so that
// building needs no CUDA toolkit: the driver itself (libcuda.so.1) is loaded at
// run time. Values and layouts match cuda.h (CUDA 12/13); tests/test_abi.py
// checks them against a real cuda.h with static_asserts when one is available.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lt::cu {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;

// CUdevice_attribute
enum DeviceAttr : int {
  MAX_THREADS_PER_BLOCK = 1,
  MULTIPROCESSOR_COUNT = 16,
  L2_CACHE_SIZE = 38,
  COMPUTE_CAPABILITY_MAJOR = 75,
  COMPUTE_CAPABILITY_MINOR = 76,
  MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
  COOPERATIVE_LAUNCH = 95,
  MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  CLUSTER_LAUNCH = 120,
};

// CUfunction_attribute
enum FuncAttr : int {
  FUNC_MAX_THREADS_PER_BLOCK = 0,
  FUNC_SHARED_SIZE_BYTES = 1,
  FUNC_LOCAL_SIZE_BYTES = 3,
  FUNC_NUM_REGS = 4,
  FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
  FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14,
};

constexpr int CU_FUNC_CACHE_PREFER_SHARED = 1;
// CUpointer_attribute
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3;
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
constexpr int CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10;
constexpr int CU_CLUSTER_SCHEDULING_POLICY_SPREAD = 1;
constexpr unsigned CU_EVENT_DEFAULT = 0;
constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;  // CUstreamCaptureMode

// CUDA IPC: an allocation exported by one process, opened by another (runtime/isolation.py).
struct CUipcMemHandle {
  char reserved[64];
};
constexpr unsigned CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1;  // CUipcMem_flags

// CUlaunchAttributeID
enum LaunchAttrId : int {
  LAUNCH_ATTR_COOPERATIVE = 2,
  LAUNCH_ATTR_CLUSTER_DIMENSION = 4,
  LAUNCH_ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5,
  LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};

union CUlaunchAttributeValue {
  char pad[64];
  int cooperative;
  struct { unsigned x, y, z; } clusterDim;
  int clusterSchedulingPolicyPreference;
  int programmaticStreamSerializationAllowed;
};

struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  CUlaunchAttributeValue value;
};

struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};

// Tensor maps (TMA descriptors), for host-side tensor descriptor arguments.
// cuda.h (12.x/13.x) aligns the opaque struct to 128 bytes (older ones: 64);
// a kernel takes it by value as a 128-byte parameter.
struct alignas(128) CUtensorMap {
  uint64_t opaque[16];
};
constexpr int CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 = 11;  // CUtensorMapDataType
constexpr int CU_TENSOR_MAP_INTERLEAVE_NONE = 0;      // CUtensorMapInterleave
constexpr int CU_TENSOR_MAP_SWIZZLE_128B = 3;         // CUtensorMapSwizzle (the largest Triton picks)
constexpr int CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2;  // CUtensorMapL2promotion
constexpr int CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0;   // CUtensorMapFloatOOBfill
constexpr int CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA = 1;

static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap layout");
static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle layout");
static_assert(sizeof(CUlaunchAttributeValue) == 64, "CUlaunchAttributeValue layout");
static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute layout");
static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig layout");
static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig layout");

}  // namespace lt::cu
