// Launching tuned Triton kernels from C++ without Python: a bundle (a
// directory with manifest.json and cubins, written by lazytriton's Python
// side) holds each kernel's winners per specialization; a BundleKernel picks
// the winner for the actual arguments (Triton's rules: 16-byte pointer
// alignment, int == 1, int % 16, autotune key values) and launches it through
// the one C++ core (lt::Kernel::launch).
//
//   lt::Bundle bundle = lt::Bundle::open("/srv/model/kernels");
//   lt::BundleKernel add = bundle.kernel("kernels:add_kernel", "*fp32,*fp32,*fp32,i32", {{"BLOCK", 1024}});
//   add.launch(stream, [&](const lt::Meta& m) { return lt::Dim3{unsigned((n + m["BLOCK"] - 1) / m["BLOCK"])}; },
//              {x, y, out, n});
//
// Errors are C++ exceptions: lt::Error (message names the kernel and the
// argument) and lt::CudaError (adds the CUDA error name and code). Missing
// winners are an error unless lazy mode is on (lazytriton/embed.h), which
// compiles and tunes them through an embedded Python on first use.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "lazytriton/contract.h"
#include "lazytriton/kernel.h"

namespace lt {

// Triton element types: enum Dtype (kFp32, ...), generated into contract.h.
const char* dtype_name(int dtype);  // "fp32", or "?" for an unknown id
int dtype_from_name(std::string_view name);  // kNoDtype if unknown

// The element type of a typed device pointer, checked against the signature.
// Specialize for your own types, e.g. DtypeOf<__half> { static constexpr Dtype value = kFp16; }.
template <class T> struct DtypeOf { static constexpr Dtype value = kNoDtype; };
template <> struct DtypeOf<bool> { static constexpr Dtype value = kU1; };
template <> struct DtypeOf<int8_t> { static constexpr Dtype value = kI8; };
template <> struct DtypeOf<int16_t> { static constexpr Dtype value = kI16; };
template <> struct DtypeOf<int32_t> { static constexpr Dtype value = kI32; };
template <> struct DtypeOf<int64_t> { static constexpr Dtype value = kI64; };
template <> struct DtypeOf<uint8_t> { static constexpr Dtype value = kU8; };
template <> struct DtypeOf<uint16_t> { static constexpr Dtype value = kU16; };
template <> struct DtypeOf<uint32_t> { static constexpr Dtype value = kU32; };
template <> struct DtypeOf<uint64_t> { static constexpr Dtype value = kU64; };
template <> struct DtypeOf<float> { static constexpr Dtype value = kFp32; };
template <> struct DtypeOf<double> { static constexpr Dtype value = kFp64; };

// A compile-time value: a constexpr argument, a compile option or a winner's
// meta-parameter. None, bool, int, float or string, as in Python.
class Constant {
 public:
  enum Type : uint8_t { kNone, kBool, kInt, kFloat, kString };
  Constant() = default;
  Constant(std::nullptr_t) {}
  Constant(bool b) : type_(kBool), i_(b) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Constant(T v) : type_(kInt), i_(int64_t(v)) {}
  Constant(double d) : type_(kFloat), d_(d) {}
  Constant(const char* s) : type_(kString), s_(s) {}
  Constant(std::string s) : type_(kString), s_(std::move(s)) {}

  Type type() const { return type_; }
  bool is_none() const { return type_ == kNone; }
  int64_t as_int() const;  // int or bool; throws lt::Error otherwise
  double as_float() const;  // float or int
  const std::string& as_string() const;
  std::string repr() const;  // Python's spelling: None, True, 1024, 2.5, 'x'
  bool operator==(const Constant& o) const;
  bool operator!=(const Constant& o) const { return !(*this == o); }

 private:
  Type type_ = kNone;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
};
using Constants = std::vector<std::pair<std::string, Constant>>;

// What a grid function sees: the call's constexprs and the winning config's
// meta-parameters (block sizes, heuristics), by name.
class Meta {
 public:
  Meta() = default;
  Meta(std::string kernel, Constants items) : kernel_(std::move(kernel)), items_(std::move(items)) {}
  const Constant* find(std::string_view name) const;  // nullptr if absent
  const Constant& at(std::string_view name) const;  // throws lt::Error naming the kernel
  int64_t operator[](std::string_view name) const { return at(name).as_int(); }
  const Constants& items() const { return items_; }

 private:
  std::string kernel_;
  Constants items_;
};

// A CUstream of any spelling: cuda.h's CUstream / cudaStream_t, lt::cu::CUstream, nullptr.
struct Stream {
  cu::CUstream handle = nullptr;
  Stream(std::nullptr_t = nullptr) {}
  template <class T> Stream(T* s) : handle(reinterpret_cast<cu::CUstream>(s)) {}
};

// A device buffer. From a typed pointer the element type is known and checked;
// a CUdeviceptr converts too. nbytes (optional) bounds what lazy-mode tuning
// snapshots; 0 means up to the end of the allocation.
struct DevicePtr {
  uint64_t addr = 0;
  uint64_t nbytes = 0;
  Dtype dtype = kNoDtype;
  DevicePtr() = default;
  DevicePtr(unsigned long long a) : addr(a) {}  // CUdeviceptr
  template <class T>
  DevicePtr(T* p) : addr(uint64_t(reinterpret_cast<uintptr_t>(p))), dtype(DtypeOf<std::remove_cv_t<T>>::value) {}
};
inline DevicePtr buffer(DevicePtr p, uint64_t nbytes) { return p.nbytes = nbytes, p; }

// A host-side tensor descriptor (Triton's TensorDescriptor) for a parameter
// whose signature type is "tensordesc<fp16[64, 64]>" (its element type and
// block shape): the tensor's base pointer, shape and strides in elements
// (outermost first, the last stride 1), the block shape (the signature's),
// the padding out-of-bounds loads read (zero or NaN) and round_f32_to_tf32.
// It is encoded into a CUtensorMap on every launch, as lazytriton's Python
// stubs and Triton's own launcher encode it; a kernel whose config pre_hook
// sets block shapes gets the winner's. Give a CUdeviceptr base the element
// type through the signature, or a typed pointer (checked against it).
//
//   lt::TensorDesc a(a_ptr, {M, K}, {K, 1}, {1, 1});
//   k.launch(stream, grid, {a, b, c, M, N, K});
struct TensorDesc {
  enum Padding : uint8_t { kZero, kNan };
  TensorDesc(DevicePtr base, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides,
             std::initializer_list<int64_t> block_shape, Padding padding = kZero, bool round_f32_to_tf32 = false)
      : TensorDesc(base, shape.begin(), shape.size(), strides.begin(), strides.size(), block_shape.begin(),
                   block_shape.size(), padding, round_f32_to_tf32) {}
  TensorDesc(DevicePtr base, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
             const std::vector<int64_t>& block_shape, Padding padding = kZero, bool round_f32_to_tf32 = false)
      : TensorDesc(base, shape.data(), shape.size(), strides.data(), strides.size(), block_shape.data(),
                   block_shape.size(), padding, round_f32_to_tf32) {}
  TensorDesc(DevicePtr base, const int64_t* shape, size_t n_shape, const int64_t* strides, size_t n_strides,
             const int64_t* block, size_t n_block, Padding padding = kZero, bool round_f32_to_tf32 = false);

  HostTensorDesc desc;  // rank 0: shape, strides and block_shape lengths differ or exceed 5 (refused at launch)
  uint64_t nbytes = 0;  // the base buffer's size if known (what lazy-mode tuning may snapshot)
};

// One launch argument: a device pointer, an integer, a float, a bool or a
// tensor descriptor (kept by reference: it must outlive the launch call). Its
// kernel parameter type comes from the signature; the value must fit it.
class Arg {
 public:
  enum Kind : uint8_t { kPointer, kInteger, kFloat, kBool, kDesc };
  template <class T> Arg(T* p) : Arg(DevicePtr(p)) {}
  Arg(const TensorDesc& d) : kind_(kDesc), dtype_(Dtype(d.desc.dtype)), bits_(d.desc.base), nbytes_(d.nbytes), desc_(&d) {}
  Arg(TensorDesc&&) = delete;  // a temporary would be gone before a launch list is used
  Arg(DevicePtr p) : kind_(kPointer), dtype_(p.dtype), bits_(p.addr), nbytes_(p.nbytes) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Arg(T v) : kind_(kInteger), big_(std::is_unsigned_v<T> && uint64_t(v) > uint64_t(INT64_MAX)), bits_(uint64_t(v)) {}
  Arg(bool b) : kind_(kBool), bits_(b) {}
  Arg(double d) : kind_(kFloat), f_(d) {}
  Arg(std::nullptr_t) = delete;  // None is a constexpr: pass it with Bundle::kernel's constexprs

  Kind kind() const { return kind_; }
  uint64_t bits() const { return bits_; }  // pointer address, or the integer's 64 bits
  int64_t integer() const { return int64_t(bits_); }
  bool big() const { return big_; }  // an unsigned value above INT64_MAX
  double real() const { return f_; }
  Dtype dtype() const { return dtype_; }
  uint64_t nbytes() const { return nbytes_; }
  const TensorDesc* desc() const { return desc_; }  // kDesc

 private:
  Kind kind_;
  bool big_ = false;
  Dtype dtype_ = kNoDtype;
  uint64_t bits_ = 0;
  uint64_t nbytes_ = 0;
  double f_ = 0;
  const TensorDesc* desc_ = nullptr;
};

using GridFn = std::function<Dim3(const Meta&)>;

// The binary chosen for a call.
struct Winner {
  std::shared_ptr<Kernel> kernel;  // cubin + launch metadata (kernel->meta().num_warps, ...)
  Meta meta;  // constexprs + the config's meta-parameters
  std::string specialization;  // e.g. "sm_90 *fp32:16,*fp32:16,*fp32:16,i32:16 BLOCK=1024"
  std::string device;  // the GPU it was tuned on
};

class Bundle;

// A kernel of a bundle for one signature and set of constexprs. A cheap,
// copyable handle; launches from many threads at once are fine.
class BundleKernel {
 public:
  // Launch on `stream` in the calling thread's current CUDA context (device
  // 0's primary context, or LAZYTRITON_DEVICE's, if it has none).
  void launch(Stream stream, Dim3 grid, std::initializer_list<Arg> args) const {
    launch(stream, grid, args.begin(), args.size());
  }
  void launch(Stream stream, const GridFn& grid, std::initializer_list<Arg> args) const {
    launch(stream, grid, args.begin(), args.size());
  }
  void launch(Stream stream, Dim3 grid, const Arg* args, size_t n) const;
  void launch(Stream stream, const GridFn& grid, const Arg* args, size_t n) const;

  // The winner for these arguments without launching it (e.g. to read its
  // block size). A lazy-mode miss tunes on the arguments and needs `grid`; a kernel
  // tuned online that is still deciding answers the candidate a launch would get
  // (valid until this thread's next call of the kernel).
  const Winner& winner(std::initializer_list<Arg> args, Stream stream = nullptr, const GridFn& grid = {}) const {
    return winner(args.begin(), args.size(), stream, grid);
  }
  const Winner& winner(const Arg* args, size_t n, Stream stream = nullptr, const GridFn& grid = {}) const;

  // Triton's specialization of these arguments, e.g. "*fp32:16,*fp32:16,*fp32,i32:16"
  // (validates them; needs no GPU).
  std::string specialization(std::initializer_list<Arg> args) const;

  const std::string& name() const;  // the Triton function's name
  const std::string& source() const;  // "module:function"
  const std::string& signature() const;
  std::vector<std::string> arg_names() const;  // runtime arguments, in launch order

  struct Impl;

 private:
  friend class Bundle;
  explicit BundleKernel(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

class Resolver;
class LaunchTimer;  // lazytriton/tuning.h

// A variant's launch metadata ("launch" in the manifest) is read by kernel.h's launch_meta_from_json.

// A directory of tuned winners: manifest.json + cubins/. Copyable handle.
class Bundle {
 public:
  // Reads dir/manifest.json (a directory without one is an empty bundle).
  static Bundle open(const std::string& dir);
  // The bundle inside lazytriton's cache ($LAZYTRITON_CACHE_DIR/bundle, else
  // $XDG_CACHE_HOME/lazytriton/bundle, else ~/.cache/lazytriton/bundle).
  static Bundle open_cache();
  // What generated stubs use: set_default()'s, else $LAZYTRITON_BUNDLE, else open_cache().
  static Bundle default_bundle();
  static void set_default(const Bundle& bundle);

  // `name` is "module:function" or, if unique in the bundle, the function's
  // name. `signature` lists the runtime arguments' types in order
  // ("*fp32,*fp32,i32"): pointers "*dtype", ints i32/i64/u64 (Triton's class
  // of the values passed) or the annotated type, fp32, u1. `constexprs` gives
  // constexpr arguments (defaults fill the rest), compile options (num_warps,
  // ...) and None for pointer arguments left out. A tuple argument is one
  // entry in Triton's spelling of a tuple type, "[*fp32,[*fp32,fp32]]", and
  // its elements are passed at launch as separate arguments, in order
  // (arg_names() calls them "xs[0]", "xs[1][0]", ...). Throws lt::Error if the
  // kernel is unknown, the signature does not fit it, or (without lazy mode)
  // the bundle has no winner for this signature and constexprs.
  BundleKernel kernel(const std::string& name, const std::string& signature, const Constants& constexprs = {}) const;

  const std::string& path() const;
  std::vector<std::string> kernel_names() const;  // "module:function" of each kernel
  size_t variant_count() const;

  // Lazy mode's hook (lt::enable_lazy installs it); nullptr turns it off.
  void set_resolver(std::shared_ptr<Resolver> resolver) const;
  bool lazy() const;

  struct Impl;

 private:
  explicit Bundle(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// ---- lazy mode's hook, implemented by lazytriton::embed (embed.h) ----------

// One call argument for the resolver: a runtime argument or a constexpr.
struct CallValue {
  std::string name;
  bool is_pointer = false;
  DevicePtr ptr;  // when is_pointer (dtype from the signature); a descriptor's base and size
  bool is_desc = false;
  HostTensorDesc desc;  // when is_desc (dtype from the signature)
  Arg value = Arg(int64_t(0));  // runtime scalar (its signature type in `type`)
  bool is_constexpr = false;
  Constant constant;  // when is_constexpr
  std::string type;  // signature type, "constexpr" for constexprs
};

struct ResolveRequest {
  std::string bundle_dir;
  std::string source;  // "module:function"
  std::vector<CallValue> values;  // the kernel's call arguments, in order (a tuple argument: its elements)
  // Per call parameter, "" or a tuple argument's nesting ("[_,[_,_]]", one '_'
  // per element of `values`); empty when the call has no tuple argument.
  std::vector<std::string> layouts;
  Constants options;  // compile options (num_warps, ...)
  cu::CUstream stream = nullptr;
  GridFn grid;  // the caller's grid (empty if none was given)
};

// What the resolver answers for one call.
struct ResolvedVariant {
  std::string variant;  // JSON, as the manifest stores it
  std::string cubin;
  // Online tuning still deciding (lazytriton.kernel(fn, tuning="online")): a candidate for this
  // call only, not added to the bundle (the next call asks again), its launch timed by `timer`
  // when there is one (the first call's and a capturing call's are not).
  bool this_call_only = false;
  std::shared_ptr<LaunchTimer> timer;
};

class Resolver {
 public:
  virtual ~Resolver() = default;
  // The kernel's description as the bundle manifest stores it (JSON).
  virtual std::string describe(const std::string& source) = 0;
  // The slot table (JSON rows of specialize.Shape.table()) of a call whose leaves have these types
  // ("constexpr" for constexprs; layouts: per call parameter "" or a tuple's nesting), for a
  // signature the bundle has no winner for yet.
  virtual std::string slot_table(const std::string& source, const std::vector<std::string>& types,
                                 const std::vector<std::string>& layouts) = 0;
  // Compile and tune for this call, persist it, and return it; or, tuning online, this call's candidate.
  virtual ResolvedVariant resolve(const ResolveRequest& request) = 0;
};

}  // namespace lt
