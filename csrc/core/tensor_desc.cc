#include "lazytriton/tensor_desc.h"

#include <cstdio>
#include <cstring>

#include "lazytriton/driver.h"

namespace lt {

namespace {

// lazytriton.model.arrays.DTYPES order.
constexpr int kDtypeBytes[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 1, 1, 1, 1, 1};
constexpr int kNumDtypes = int(sizeof(kDtypeBytes) / sizeof(kDtypeBytes[0]));
bool is_float_dtype(int d) { return d >= 9; }  // fp16 .. fp8e5b16
constexpr int kFp32 = 11;

// Triton: "The TMA dtype enum values are slightly different on host vs device".
int tma_dtype_device_to_host(int t) { return t == 8 ? 10 : t == 9 ? 8 : t == 10 ? 9 : t; }

std::string list_text(const int64_t* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

int dtype_bytes(int dtype) { return dtype >= 0 && dtype < kNumDtypes ? kDtypeBytes[dtype] : 0; }

int tensor_desc_abi_of(const std::string& v) {
  int major = 0, minor = 0;
  if (std::sscanf(v.c_str(), "%d.%d", &major, &minor) == 2 && (major < 3 || (major == 3 && minor < 7))) return 1;
  return kTensorDescAbiLatest;
}

std::string check_tensor_desc(const HostTensorDesc& d) {
  if (d.rank < 1 || d.rank > kMaxDescRank)
    return "a tensor descriptor has rank 1 to 5, this one " + std::to_string(d.rank);
  int bytes = dtype_bytes(d.dtype);
  if (!bytes) return "unknown element type (dtype id " + std::to_string(d.dtype) + ")";
  if (d.base % 16)
    return "its base address 0x" + [&] {
      char b[32];
      std::snprintf(b, sizeof(b), "%llx", (unsigned long long)d.base);
      return std::string(b);
    }() + " is not 16-byte aligned (TMA needs 16-byte aligned tensors)";
  for (int i = 0; i < d.rank; ++i)
    if (d.shape[i] < 1 || d.shape[i] > INT32_MAX)
      return "shape " + list_text(d.shape, d.rank) + ": each dimension must be in [1, 2**31 - 1]";
  for (int i = 0; i < d.rank; ++i)
    if (d.block[i] < 1)
      return "block_shape " + list_text(d.block, d.rank) + ": each dimension must be positive";
  if (d.strides[d.rank - 1] != 1)
    return "strides " + list_text(d.strides, d.rank) + ": the last dimension must be contiguous (stride 1)";
  for (int i = 0; i + 1 < d.rank; ++i) {
    if (d.strides[i] < 1)
      return "strides " + list_text(d.strides, d.rank) + ": each stride must be positive";
    if ((d.strides[i] * bytes) % 16)
      return "strides " + list_text(d.strides, d.rank) + ": every stride but the last must be a multiple of 16 "
             "bytes (" + std::to_string(16 / bytes > 0 ? 16 / bytes : 1) + " elements of " +
             std::to_string(bytes) + " bytes)";
    if (d.strides[i] * bytes >= (int64_t(1) << 40))
      return "strides " + list_text(d.strides, d.rank) + ": a stride must be below 2**40 bytes";
  }
  if (d.nan_padding && !is_float_dtype(d.dtype))
    return "padding=\"nan\" needs a floating-point tensor";
  // TMA encodes 8-bit floats as UINT8, and the driver fills NaN only for its float types.
  if (d.nan_padding && bytes < 2)
    return "padding=\"nan\" needs a 16-, 32- or 64-bit float tensor (TMA moves 8-bit floats as integers)";
  if (d.tf32 && d.dtype != kFp32) return "round_f32_to_tf32 needs a float32 tensor";
  return "";
}

std::string check_tensor_map(const TmaMeta& m, const HostTensorDesc& d) {
  if (m.im2col) return "im2col tensor descriptors are not supported by lazytriton";
  if (m.rank != d.rank)
    return "the kernel was compiled for a rank-" + std::to_string(m.rank) + " descriptor, this one has rank " +
           std::to_string(d.rank);
  if (!m.fp4_padded && m.elem_size != dtype_bytes(d.dtype))
    return "the kernel was compiled for " + std::to_string(m.elem_size) + "-byte elements, this descriptor's are " +
           std::to_string(dtype_bytes(d.dtype)) + " bytes";
  for (int i = 0; i < m.rank; ++i)
    if (m.block[i] < 1 || m.block[i] > 256) {
      int64_t b[kMaxDescRank];
      for (int j = 0; j < m.rank; ++j) b[j] = m.block[j];
      return "block shape " + list_text(b, m.rank) + ": TMA takes blocks of 1 to 256 elements per dimension";
    }
  return "";
}

namespace {
// The encoding proper, `d` already checked against `m`; what() names the argument in errors.
template <class What>
void encode_map(const TmaMeta& m, const HostTensorDesc& d, cu::CUtensorMap* out, const What& what) {
  // As fill_tma_descriptor: dimensions innermost first; rank - 1 byte strides.
  const int rank = d.rank;
  const int elem = m.elem_size;
  uint32_t box[kMaxDescRank];
  uint64_t dims[kMaxDescRank];
  uint64_t strides[kMaxDescRank];
  for (int i = 0; i < rank; ++i) {
    box[rank - i - 1] = m.block[i];
    dims[rank - i - 1] = uint64_t(d.shape[i]);
  }
  if (m.fp4_padded) dims[0] *= 2;  // make_tensordesc_arg: shape[-1] *= 2
  for (int i = 0; i + 1 < rank; ++i) strides[rank - i - 2] = uint64_t(elem) * uint64_t(d.strides[i]);
  strides[rank - 1] = dims[rank - 1] * (rank == 1 ? uint64_t(elem) : strides[rank - 2]);
  uint32_t element_strides[kMaxDescRank] = {1, 1, 1, 1, 1};
  int type = tma_dtype_device_to_host(d.tf32 ? cu::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 : m.elem_type);
  int fill = d.nan_padding ? cu::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA : cu::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
  const Driver& drv = driver();
  auto encode = [&] {
    std::memset(out, 0, sizeof(*out));
    return drv.cuTensorMapEncodeTiled(out, type, uint32_t(rank), reinterpret_cast<void*>(d.base), dims, strides, box,
                                      element_strides, cu::CU_TENSOR_MAP_INTERLEAVE_NONE, m.swizzle,
                                      cu::CU_TENSOR_MAP_L2_PROMOTION_L2_128B, fill);
  };
  cu::CUresult r = encode();
  if (r == cu::CUDA_ERROR_INVALID_CONTEXT) {
    // A thread with no current context (its first launch packs the parameters before the launch
    // makes the device's context current): made current here, as the launch would, once.
    current_context();
    r = encode();
  }
  if (r != cu::CUDA_SUCCESS) {
    int64_t b[kMaxDescRank];
    for (int i = 0; i < rank; ++i) b[i] = m.block[i];
    throw CudaError(r, what() + ": cuTensorMapEncodeTiled (shape " + list_text(d.shape, rank) + ", strides " +
                           list_text(d.strides, rank) + ", block " + list_text(b, rank) + ", element type " +
                           std::to_string(type) + ", swizzle " + std::to_string(m.swizzle) + ")");
  }
  // Triton 3.7+ (after CUTLASS): drivers up to 13.1 mis-handle the L2 bit of a
  // tensor spanning less than 128 KiB; clear it. 64-bit arithmetic where
  // Triton's int could overflow (then it is never small).
  if (drv.version <= 13010) {
    uint64_t max_byte = 0;
    for (int i = 0; i < rank; ++i) max_byte += (dims[i] - 1) * (i == 0 ? uint64_t(elem) : strides[i - 1]);
    if (max_byte + 1 < 128 * 1024) out->opaque[1] &= ~(uint64_t(1) << 21);
  }
}
}  // namespace

void encode_tensor_map(const TmaMeta& m, int abi, const HostTensorDesc& d, cu::CUtensorMap* out,
                       const std::string& what) {
  (void)abi;  // the map itself is the same for every Triton version
  std::string why = check_tensor_desc(d);
  if (why.empty()) why = check_tensor_map(m, d);
  if (!why.empty()) throw Error(what + ": " + why);
  encode_map(m, d, out, [&] { return what; });
}

size_t pack_tensor_desc(const std::vector<TmaMeta>& metas, int abi, size_t index, const HostTensorDesc& d,
                        DescParams& out, void** params, const std::string& kernel, const char* arg) {
  // Built only for an error: this runs on every launch.
  auto what = [&] { return "kernel " + kernel + ", argument " + (arg ? arg : "?"); };
  const int rank = d.rank;
  size_t n = 0;
  if (!metas.empty()) {
    if (index >= metas.size())
      throw Error(what() + ": the kernel's metadata describes " + std::to_string(metas.size()) +
                  " tensor descriptor(s), this is descriptor " + std::to_string(index + 1));
    const TmaMeta& m = metas[index];
    std::string why = check_tensor_desc(d);
    if (why.empty()) why = check_tensor_map(m, d);
    if (!why.empty()) throw Error(what() + ": " + why);
    encode_map(m, d, &out.map, what);
    params[n++] = &out.map;
  } else {
    std::string why = check_tensor_desc(d);
    if (!why.empty()) throw Error(what() + ": " + why);
    // Before Triton 3.7 the decomposed layout has no tf32 flag: the kernel would read unrounded values.
    if (d.tf32 && abi < 2)
      throw Error(what() + ": round_f32_to_tf32 on a kernel not lowered to TMA (before sm_90) needs Triton 3.7 "
                           "or newer, whose kernels take the flag; this one was compiled by an older Triton");
    out.base = d.base;
    params[n++] = &out.base;
    for (int i = 0; i < rank; ++i) {
      out.dims64[i] = d.shape[i];
      out.dims64[rank + i] = d.strides[i];
    }
    for (int i = 0; i < 2 * rank; ++i) params[n++] = &out.dims64[i];
    out.padding = d.nan_padding;
    params[n++] = &out.padding;
    if (abi >= 2) {
      out.tf32 = d.tf32;
      params[n++] = &out.tf32;
    }
  }
  // The shape (i32) and strides (i64) follow in both layouts. Triton 3.5/3.6
  // pass the doubled inner dimension of an fp4-padded descriptor here too.
  const bool doubled = !metas.empty() && abi < 2 && metas[index].fp4_padded;
  for (int i = 0; i < rank; ++i) {
    int64_t s = d.shape[i] * (doubled && i == rank - 1 ? 2 : 1);
    out.shape32[i] = int32_t(s);
    params[n++] = &out.shape32[i];
  }
  for (int i = 0; i < rank; ++i) {
    out.strides64[i] = d.strides[i];
    params[n++] = &out.strides64[i];
  }
  return n;
}

}  // namespace lt
