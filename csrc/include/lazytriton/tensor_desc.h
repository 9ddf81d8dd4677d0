// Host-side tensor descriptors (Triton's TensorDescriptor) as kernel
// arguments: one implementation for the Python stubs, the XLA FFI handler and
// C++ bundles. A descriptor is encoded by value into the launch's parameter
// bytes (a CUtensorMap, host work only), so launches stay capture-safe.
//
// How a `tensordesc<...>` parameter expands into kernel parameters (Triton's
// nvidia driver.py, make_tensordesc_arg / fill_tma_descriptor):
//   with tensordesc_meta (lowered to TMA, sm_90+):
//     CUtensorMap (128 bytes, by value), shape as i32 x rank, strides as i64 x rank
//   without (decomposed, e.g. sm_80):
//     base pointer, shape as i64 x rank, strides as i64 x rank, padding == "nan" (i1),
//     [round_f32_to_tf32 (i1): Triton 3.7 and later], shape as i32 x rank, strides as i64 x rank
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lazytriton/cuda_abi.h"

namespace lt {

constexpr int kMaxDescRank = 5;

// One entry of a compiled kernel's tensordesc_meta: how Triton lowered one of
// its host descriptor parameters to TMA.
struct TmaMeta {
  int swizzle = 0;    // CUtensorMapSwizzle
  int elem_size = 0;  // bytes
  int elem_type = 0;  // Triton's (device-side) numbering of CUtensorMapDataType
  int rank = 0;       // entries of block
  uint32_t block[kMaxDescRank] = {};  // block_size, outermost dimension first
  bool fp4_padded = false;
  bool im2col = false;
};

// The descriptor parameter layout of one Triton version family.
//   1: Triton 3.5 and 3.6 (one i1 when decomposed; with fp4_padded, the doubled
//      inner dimension is also what the kernel gets as its shape)
//   2: Triton 3.7 and later (padding and round_f32_to_tf32 i1s when decomposed;
//      the shape parameters are the descriptor's own)
constexpr int kTensorDescAbiLatest = 2;
int tensor_desc_abi_of(const std::string& triton_version);  // from metadata["triton_version"]

// A host-side descriptor argument of one call: what a TensorDescriptor holds.
struct HostTensorDesc {
  uint64_t base = 0;
  int dtype = -1;  // lazytriton dtype id (lazytriton.model.arrays.DTYPES)
  int rank = 0;
  int64_t shape[kMaxDescRank] = {};    // elements, outermost dimension first
  int64_t strides[kMaxDescRank] = {};  // elements
  int64_t block[kMaxDescRank] = {};    // the block shape the caller gave
  bool nan_padding = false;            // padding="nan": out-of-bounds loads read NaN
  bool tf32 = false;                   // round_f32_to_tf32
};

// Bytes of one element of a lazytriton dtype id (0 if unknown).
int dtype_bytes(int dtype);

// Why `d` cannot be a descriptor argument at all (rank, shape, strides, base
// alignment, padding/tf32 against the dtype), or "" if it can. Needs no GPU.
std::string check_tensor_desc(const HostTensorDesc& d);

// The kernel parameters one descriptor expands into, for one launch. The
// CUtensorMap comes first: this struct is 128-byte aligned as cuda.h's. Left
// uninitialized (launch paths keep a few on the stack): packing writes every
// field it passes.
struct alignas(128) DescParams {
  cu::CUtensorMap map;
  uint64_t base;
  int64_t dims64[2 * kMaxDescRank];  // decomposed: shape, then strides
  uint8_t padding, tf32;
  int32_t shape32[kMaxDescRank];
  int64_t strides64[kMaxDescRank];
};
// The most kernel parameters one descriptor expands into.
constexpr size_t kMaxDescParams = 1 + 2 * kMaxDescRank + 2 + 2 * kMaxDescRank;

// Encodes `d` for the `index`-th descriptor parameter of a kernel whose
// tensordesc_meta is `metas` (empty: the decomposed layout) and writes
// pointers to its kernel parameters (into `out`) at `params`; returns how
// many. Throws lt::Error naming `kernel` and `arg` for a descriptor the
// kernel cannot take, lt::CudaError if cuTensorMapEncodeTiled fails.
size_t pack_tensor_desc(const std::vector<TmaMeta>& metas, int abi, size_t index, const HostTensorDesc& d,
                        DescParams& out, void** params, const std::string& kernel, const char* arg);

// The CUtensorMap of `d` for `m`, exactly as Triton's fill_tma_descriptor
// (tiled) encodes it. `what` prefixes error messages ("kernel k, argument a").
void encode_tensor_map(const TmaMeta& m, int abi, const HostTensorDesc& d, cu::CUtensorMap* out,
                       const std::string& what);

// Validation encode_tensor_map does before calling the driver: "" if `d` fits
// `m`, else the reason. Needs no GPU.
std::string check_tensor_map(const TmaMeta& m, const HostTensorDesc& d);

}  // namespace lt
