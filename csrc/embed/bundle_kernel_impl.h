// BundleKernel::Impl, shared by the two files of a bundle's kernel:
// bundle_kernel.cc (binding a signature to its slot table, the call path) and
// bundle_resolve.cc (finding or resolving the variant of a new call key).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bundle_manifest.h"
#include "bundle_signature.h"
#include "lazytriton/bundle.h"
#include "lazytriton/call_layout.h"
#include "lazytriton/encode.h"
#include "lazytriton/resolve_table.h"
#include "lazytriton/slot_spec.h"

namespace lt {

using namespace manifest;
using namespace sigtypes;

constexpr size_t kMaxArgs = 64;
constexpr size_t kMaxDescArgs = 8;  // tensor descriptor arguments per kernel
constexpr size_t kMaxKey = key_bit_words(kMaxArgs) + kMaxArgs + kMaxDescArgs * kMaxDescRank + 1;

// One runtime argument (a leaf of the call): its slot table row says how it is read, packed and
// keyed; the signature gives its type's spelling and a descriptor's block shape.
struct RtArg {
  std::string name;
  size_t call_index = 0;  // its leaf among the call's (the variant's types and table)
  std::string type;  // as in the signature ("*fp32", "i32")
  SlotSpec slot;  // its row of the call's slot table
  size_t key_word = 0;  // where its value words (value_words(slot)) start in the call key
  int64_t desc_block[kMaxDescRank] = {};  // tensor descriptors: the signature's block shape (the kernel's type)
};

// A call's packed parameters and its key (call_layout.h: 2 specialization bits per
// argument, each argument's value words, the context). A descriptor's slot is its index in `descs`.
struct Call {
  uint64_t slots[kMaxArgs];
  uint64_t key[kMaxKey];
  HostTensorDesc descs[kMaxDescArgs];
  size_t n_desc = 0;
};

struct ResolveCtx {
  const Arg* args;
  const Call* call;
  cu::CUstream stream;
  const GridFn* grid;
};

// A pointer or int argument's specialization as variants spell it ("16", "1" or "").
inline std::string spec_suffix(const SlotSpec& s, uint64_t bits) {
  if (s.kind == SlotKind::kPtr) return bits & 1 ? "16" : "";
  if (s.kind == SlotKind::kInt) return bits & 1 ? "1" : bits & 2 ? "16" : "";
  return "";
}

struct BundleKernel::Impl {
  std::shared_ptr<Bundle::Impl> bundle;
  std::shared_ptr<KernelRecord> record;
  KernelDesc desc;
  std::string label;  // "kernel add_kernel"
  std::string signature;
  std::vector<RtArg> args;
  std::vector<std::string> call_types;  // per leaf (a call parameter, or a tuple's element), as variants spell them
  std::vector<std::string> layout;  // per call parameter: "" or a tuple argument's nesting ("[_,[_,_]]")
  std::vector<SlotRow> slots;  // per leaf: the call's slot table (a variant's, or lazy mode's from Python)
  Constants constexprs;  // sorted: call constexprs, None'd pointers, options
  Constants options;
  std::vector<size_t> keyed;  // the arguments whose value selects the binary (in_key), in order
  size_t bit_words = 0, key_len = 0;
  std::unique_ptr<ResolveTable> table;
  // Online tuning's candidates so far (lazy mode), by their variant JSON; guarded by bundle->mu.
  std::map<std::string, std::shared_ptr<Variant>> candidates;

  std::vector<std::string> arg_names() const;  // runtime arguments, in launch order
  [[noreturn]] void fail(const std::string& why) const { throw Error(label + ": " + why); }
  [[noreturn]] void fail_arg(const RtArg& r, const std::string& why) const {
    throw Error(label + ": argument " + r.name + ": " + why);
  }

  // Set-up (Bundle::kernel).
  void bind(const std::string& sig, const Constants& given);
  void bind_param(const ParamDesc& p, std::vector<std::string>& types, size_t& next, const Constants& given);
  void check_type(RtArg& r, const ParamDesc& p);
  void check_constexprs(const Constants& given) const;
  std::vector<SlotRow> slot_table() const;
  [[noreturn]] void no_winner() const;
  std::string variant_list() const;

  // The call path.
  void read(const Arg* a, size_t n, Call& c) const;
  void read_arg(const RtArg& r, size_t i, const Arg& a, Call& c) const;
  double real_of(const RtArg& r, const Arg& a) const;
  void read_desc(const RtArg& r, const Arg& a, uint64_t* slot, Call& c) const;
  // The kernel parameters of a resolved call (descriptors encoded into `dps`).
  size_t params(const Entry& e, Call& c, void** out, DescParams* dps) const;
  void launch_entry(const Entry& e, cu::CUcontext ctx, cu::CUstream s, Dim3 grid, Call& c) const;
  // The entry for c.key (context set): the table's, else resolved once.
  const Entry* entry(const Arg* a, const Call& c, cu::CUstream s, const GridFn* grid) const;
  // A launch whose entry may have to be resolved (lazy mode; online tuning's candidates, timed).
  void launch_resolving(cu::CUcontext ctx, cu::CUstream s, const GridFn& grid, const Arg* a, Call& c) const;
  std::string call_spec(const Call& c) const;

  // Resolution of a new key (once per key, see ResolveTable).
  std::shared_ptr<const Entry> resolve(const CallKey& key, const ResolveCtx& rc);
  bool compatible(const Variant& v) const;
  bool matches(const Variant& v, const Call& c, const std::string& target) const;
  std::shared_ptr<Variant> find_variant(const Call& c, const std::string& target, const std::string& device) const;
  std::shared_ptr<const Entry> resolve_lazily(const ResolveCtx& rc, const std::string& target, Resolver& resolver);
  ResolveRequest request(const ResolveCtx& rc) const;
  std::shared_ptr<Entry> make_entry(const std::shared_ptr<Variant>& v, const Call& c, const std::string& target);
  std::shared_ptr<Kernel> kernel_of(Variant& v) const;
  std::string describe_call(const Call& c, const std::string& target) const;
  std::string other_vendor(const DeviceInfo& dev) const;
};

}  // namespace lt
