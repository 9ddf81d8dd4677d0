// BundleKernel: one signature and set of constexprs of a bundle's kernel.
// Binds the signature to the kernel's parameters, reads and packs each call's
// arguments (Triton's specialization, tensor descriptors, tuple elements),
// picks the variant for the call (or resolves one in lazy mode) and launches
// it through lt::Kernel::launch.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "bundle_manifest.h"
#include "bundle_signature.h"
#include "lazytriton/bundle.h"
#include "lazytriton/encode.h"
#include "lazytriton/resolve_table.h"

namespace lt {

using namespace manifest;
using namespace sigtypes;

namespace {

constexpr size_t kMaxArgs = 64;
constexpr size_t kMaxDescArgs = 8;  // tensor descriptor arguments per kernel
constexpr size_t kMaxKey = 1 + (2 * kMaxArgs + 63) / 64 + kMaxArgs;
const char* const kOptionNames[] = {"num_warps", "num_stages", "num_ctas", "maxnreg", "debug", "launch_pdl"};

// One runtime argument: how to read, check and pack it.
struct RtArg {
  std::string name;
  size_t call_index = 0;  // position among the kernel's call parameters
  Ty ty = Ty::kI32;
  std::string type;  // as in the signature ("*fp32", "i32")
  int dtype = kNoDtype;  // pointers
  bool annotated = false;  // type fixed by the kernel's annotation (else Triton's class of the value)
  bool specialize = true, align = true;
  int key_word = -1;  // index into the call key, if the value selects the binary
  int desc_rank = 0;  // tensor descriptors: the signature's block shape (the kernel's type)
  int64_t desc_block[kMaxDescRank] = {};
};

// A call's packed parameters and its key: [context, 2 specialization bits
// per argument, key values]. A descriptor's slot is its index in `descs`.
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

const char* arg_kind_name(Arg::Kind k) {
  switch (k) {
    case Arg::kPointer: return "a device pointer";
    case Arg::kInteger: return "an integer";
    case Arg::kFloat: return "a float";
    case Arg::kBool: return "a bool";
    case Arg::kDesc: return "a tensor descriptor";
  }
  return "?";
}

// An argument's integer as the encoders take it (encode.h).
IntVal int_val(const Arg& a) { return {a.bits(), a.big(), a.kind() == Arg::kBool}; }

std::string arg_value_text(const Arg& a) {
  return a.big() ? std::to_string(a.bits()) : std::to_string(a.integer());
}

std::string spec_suffix(const RtArg& r, uint64_t bits) {
  if (r.ty == Ty::kPtr) return bits & 1 ? "16" : "";
  if (is_int(r.ty)) return bits & 1 ? "1" : bits & 2 ? "16" : "";
  return "";
}

bool is_option(const std::string& name) {
  for (const char* o : kOptionNames)
    if (name == o) return true;
  return false;
}

}  // namespace

struct BundleKernel::Impl {
  std::shared_ptr<Bundle::Impl> bundle;
  std::shared_ptr<KernelRecord> record;
  KernelDesc desc;
  std::string label;  // "kernel add_kernel"
  std::string signature;
  std::vector<RtArg> args;
  std::vector<std::string> call_types;  // per leaf (a call parameter, or a tuple's element), as variants spell them
  std::vector<std::string> layout;  // per call parameter: "" or a tuple argument's nesting ("[_,[_,_]]")
  Constants constexprs;  // sorted: call constexprs, None'd pointers, options
  Constants options;
  std::vector<std::string> key_names;  // by key word, after the context and the bits
  size_t bit_words = 0, key_len = 0;
  std::unique_ptr<ResolveTable> table;

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
  void require_variant() const;
  std::string variant_list() const;

  // The call path.
  void read(const Arg* a, size_t n, Call& c) const;
  void pack(size_t i, const Arg& a, Call& c) const;
  void pack_int(const RtArg& r, const Arg& a, uint64_t* slot, uint64_t* bits) const;
  void pack_flag(const RtArg& r, const Arg& a, uint64_t* slot) const;
  double real_of(const RtArg& r, const Arg& a) const;
  double pack_float(const RtArg& r, const Arg& a, uint64_t* slot) const;
  void pack_desc(const RtArg& r, const Arg& a, uint64_t* slot, Call& c) const;
  // The kernel parameters of a resolved call (descriptors encoded into `dps`).
  size_t params(const Entry& e, Call& c, void** out, DescParams* dps) const;
  void launch_entry(const Entry& e, cu::CUcontext ctx, cu::CUstream s, Dim3 grid, Call& c) const;
  // The entry for c.key (context set): the table's, else resolved once.
  const Entry* entry(const Arg* a, const Call& c, cu::CUstream s, const GridFn* grid) const;
  std::string call_spec(const Call& c) const;

  // Resolution of a new key (once per key, see ResolveTable).
  std::shared_ptr<const Entry> resolve(const CallKey& key, const ResolveCtx& rc);
  bool compatible(const Variant& v) const;
  bool matches(const Variant& v, const Call& c, const std::string& target) const;
  std::shared_ptr<Variant> find_variant(const Call& c, const std::string& target, const std::string& device) const;
  std::shared_ptr<Variant> resolve_lazily(const ResolveCtx& rc, const std::string& target, Resolver& resolver);
  ResolveRequest request(const ResolveCtx& rc) const;
  std::shared_ptr<const Entry> make_entry(const std::shared_ptr<Variant>& v, const Call& c, const std::string& target);
  std::shared_ptr<Kernel> kernel_of(Variant& v) const;
  std::string describe_call(const Call& c, const std::string& target) const;
  std::string other_vendor(const DeviceInfo& dev) const;
};

// ---- set-up -----------------------------------------------------------------

void BundleKernel::Impl::bind(const std::string& sig, const Constants& given) {
  signature = sig;
  // Entries at the commas outside brackets: a tuple argument is one entry, "[*fp32,[i32,fp32]]";
  // a descriptor's block shape, "tensordesc<fp16[64, 64]>", stays in its entry too.
  std::vector<std::string> types = split_top(sig, label + ": signature");
  for (const auto& t : types)
    if (t.find(':') != std::string::npos)
      fail("signature entry '" + t + "': give types only; the specialization (:16, :1) comes from the arguments");
  check_constexprs(given);
  size_t next = 0;
  for (const ParamDesc& p : desc.params) bind_param(p, types, next, given);
  size_t n_desc = 0;
  for (const RtArg& r : args) n_desc += r.ty == Ty::kDesc;
  if (n_desc > kMaxDescArgs) fail("takes more than 8 tensor descriptor arguments");
  if (next != types.size() || args.size() > kMaxArgs) {
    fail("the signature '" + sig + "' has " + std::to_string(types.size()) + " types but the kernel takes " +
         std::to_string(args.size()) + " runtime arguments (" + sorted_names(arg_names()) + ")" +
         (args.size() > kMaxArgs ? "; at most 64 are supported" : ""));
  }
  for (const auto& kv : given)
    if (is_option(kv.first)) {
      options.push_back(kv);
      constexprs.push_back(kv);  // a different option is a different binary
    }
  std::sort(constexprs.begin(), constexprs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  bit_words = (2 * args.size() + 63) / 64;
  for (auto& r : args)
    if (r.key_word >= 0) {
      r.key_word = int(1 + bit_words + key_names.size());
      key_names.push_back(r.name);
    }
  key_len = 1 + bit_words + key_names.size();
}

void BundleKernel::Impl::check_constexprs(const Constants& given) const {
  for (const auto& [name, value] : given) {
    if (is_option(name)) continue;
    if (std::find(desc.supplied.begin(), desc.supplied.end(), name) != desc.supplied.end())
      fail(name + " is chosen by the kernel's autotune configs or heuristics; do not pass it");
    bool known = false;
    for (const auto& p : desc.params) known |= p.name == name;
    if (!known) {
      std::vector<std::string> names;
      for (const auto& p : desc.params) names.push_back(p.name);
      fail("no parameter named '" + name + "' (parameters: " + sorted_names(names) + ")");
    }
  }
}

void BundleKernel::Impl::bind_param(const ParamDesc& p, std::vector<std::string>& types, size_t& next,
                                    const Constants& given) {
  const Constant* value = nullptr;
  for (const auto& kv : given)
    if (kv.first == p.name) value = &kv.second;
  if (p.is_constexpr || value) {
    if (!p.is_constexpr && !value->is_none())
      fail("argument " + p.name + " is not a constexpr: pass it at launch (only None may be given here)");
    if (!value && !p.has_default) fail("constexpr " + p.name + " needs a value (pass it in constexprs)");
    constexprs.emplace_back(p.name, value ? *value : p.dflt);
    call_types.push_back("constexpr");
    layout.emplace_back();
    return;
  }
  if (next < types.size() && !types[next].empty() && types[next][0] == '[') {
    // A tuple argument: one runtime argument per element, in order, each
    // specialized as Triton specializes tuple elements (alignment, == 1 and
    // % 16 on, whatever the parameter says; no annotation).
    if (!p.annotation.empty()) fail("argument " + p.name + " is annotated " + p.annotation + ", not a tuple");
    std::vector<std::pair<std::string, std::string>> leaves;
    std::string structure;
    tuple_leaves(types[next++], "", leaves, structure, label + ": argument " + p.name);
    ParamDesc elem = p;
    elem.annotation.clear();
    elem.specialize = elem.align = true;
    for (const auto& [suffix, type] : leaves) {
      RtArg r;
      r.name = p.name + suffix;
      r.call_index = call_types.size();
      r.type = type;
      if (r.type[0] == '[') fail_arg(r, "bad type '" + r.type + "'");
      check_type(r, elem);
      call_types.push_back(r.type);
      args.push_back(r);
    }
    layout.push_back(structure);
    return;
  }
  layout.emplace_back();
  RtArg r;
  r.name = p.name;
  r.call_index = call_types.size();
  r.type = next < types.size() ? types[next] : "";
  ++next;
  if (next <= types.size()) check_type(r, p);
  call_types.push_back(r.type);
  args.push_back(r);
}

void BundleKernel::Impl::check_type(RtArg& r, const ParamDesc& p) {
  if (r.type == "i1") r.type = "u1";  // Triton spells bools u1
  r.specialize = p.specialize;
  r.align = p.align;
  std::string canonical;
  if (parse_desc_type(r.type, &r.dtype, &r.desc_rank, r.desc_block, &canonical)) {
    r.ty = Ty::kDesc;
    r.type = canonical;  // as the bundle's variants spell it
    if (p.heuristic)
      fail_arg(r, "the kernel's heuristics read this descriptor argument, so they need Python on every call; "
                  "the C++ launch path cannot evaluate them");
    return;
  }
  if (r.type.rfind("tensordesc", 0) == 0)
    fail_arg(r, "bad descriptor type '" + r.type + "' in the signature: spell it as Triton does, e.g. "
                "tensordesc<fp16[64, 64]> (the element type and the block shape)");
  if (!r.type.empty() && r.type[0] == '*') {
    r.ty = Ty::kPtr;
    r.dtype = dtype_from_name(std::string_view(r.type).substr(1));
    if (r.dtype == kNoDtype) fail_arg(r, "unknown element type in '" + r.type + "'");
    if (p.heuristic)
      fail_arg(r, "the kernel's heuristics read this pointer argument, so they need Python on every call; "
                  "the C++ launch path cannot evaluate them");
    return;
  }
  if (!scalar_type(r.type, &r.ty)) fail_arg(r, "unknown type '" + r.type + "' in the signature");
  r.annotated = !p.annotation.empty();
  if (r.annotated && p.annotation != r.type)
    fail_arg(r, "annotated " + p.annotation + " in the kernel, but the signature says " + r.type);
  if (!r.annotated && is_int(r.ty) && r.ty != Ty::kI32 && r.ty != Ty::kI64 && r.ty != Ty::kU64)
    fail_arg(r, "an unannotated int is i32, i64 or u64 (Triton's class of its value), not " + r.type);
  if (!r.annotated && is_float(r.ty) && r.ty != Ty::kFp32)
    fail_arg(r, "an unannotated float is passed as fp32, not " + r.type);
  if (p.key || p.heuristic) r.key_word = 0;  // numbered in bind()
}

bool BundleKernel::Impl::compatible(const Variant& v) const {
  if (v.types != call_types || v.constexprs != constexprs) return false;
  if (v.layout.empty()) return std::all_of(layout.begin(), layout.end(), [](const auto& l) { return l.empty(); });
  return v.layout == layout;
}

std::string BundleKernel::Impl::variant_list() const {
  std::string out;
  for (const auto& v : record->variants) {
    std::string sig;
    for (size_t i = 0; i < v->types.size(); ++i) {
      if (v->types[i] == "constexpr") continue;
      sig += (sig.empty() ? "" : ",") + v->types[i] + (v->specs[i].empty() ? "" : ":" + v->specs[i]);
    }
    for (const auto& [k, c] : v->constexprs) sig += " " + k + "=" + c.repr();
    for (const auto& [k, j] : v->key_values)
      sig += " " + k + "=" + (j.kind == json::Value::kFloat ? Constant(j.f).repr() : std::to_string(j.i));
    out += "\n  " + v->target + " " + sig + (v->device.empty() ? "" : " (tuned on " + v->device + ")");
  }
  return out.empty() ? " none" : out;
}

void BundleKernel::Impl::require_variant() const {
  std::lock_guard<std::mutex> lock(bundle->mu);
  if (bundle->resolver) return;
  for (const auto& v : record->variants)
    if (compatible(*v)) return;
  std::string cx;
  for (const auto& [k, c] : constexprs) cx += " " + k + "=" + c.repr();
  fail("bundle " + bundle->dir + " has no winner for signature " + signature + cx + "; its winners are:" +
       variant_list() + "\nTune it from Python (lazytriton.cpp.Bundle(dir).add(...)) or turn on lazy mode "
       "(lt::enable_lazy from lazytriton::embed)");
}

BundleKernel Bundle::kernel(const std::string& name, const std::string& signature, const Constants& constexprs) const {
  std::shared_ptr<KernelRecord> rec;
  std::shared_ptr<Resolver> resolver;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    rec = impl_->find(name);
    resolver = impl_->resolver;
  }
  if (!rec && resolver && name.find(':') != std::string::npos) {
    KernelDesc d = desc_from(json::parse(resolver->describe(name), "kernel " + name), "kernel " + name);
    std::lock_guard<std::mutex> lock(impl_->mu);
    rec = impl_->add_kernel(std::move(d));
  }
  if (!rec) {
    std::string why = !impl_->has_manifest ? " (it has no manifest.json)" : " (it has: " + sorted_names(kernel_names()) + ")";
    throw Error("kernel " + name + ": not in bundle " + impl_->dir + why +
                (resolver ? "; in lazy mode name it as module:function" : ""));
  }
  auto k = std::make_shared<BundleKernel::Impl>();
  k->bundle = impl_;
  k->record = rec;
  k->desc = rec->desc;
  k->label = kernel_label(rec->desc);
  k->bind(signature, constexprs);
  k->require_variant();
  BundleKernel::Impl* raw = k.get();
  k->table = std::make_unique<ResolveTable>(rec->desc.name, [raw](const CallKey& key, void* ctx) {
    return raw->resolve(key, *static_cast<const ResolveCtx*>(ctx));
  });
  return BundleKernel(k);
}

// ---- the call path ------------------------------------------------------------

// An int parameter: unannotated, Triton's class of the value; annotated, any
// value in its type, or a bool (0 or 1, specialized on nothing, as Triton's
// binder treats it). Only an unannotated 1 is folded into a constexpr.
void BundleKernel::Impl::pack_int(const RtArg& r, const Arg& a, uint64_t* slot, uint64_t* bits) const {
  if (a.kind() != Arg::kInteger && !(r.annotated && a.kind() == Arg::kBool))
    fail_arg(r, "expects an integer (" + r.type + "), got " + arg_kind_name(a.kind()));
  // == 1 is folded into a constexpr unless annotated; % 16 is tt.divisibility unless do_not_specialize(_on_alignment)
  IntSpec spec{r.ty, r.annotated, r.specialize && !r.annotated, r.specialize && r.align};
  switch (encode_int(spec, int_val(a), slot, bits)) {
    case Fit::kOk: return;
    case Fit::kWrongClass:
      fail_arg(r, arg_value_text(a) + " is " + type_name(int_class(int_val(a))) +
                      " under Triton's rules (i32 if it fits, else i64, else u64), but the signature says " + r.type);
    default: fail_arg(r, arg_value_text(a) + " does not fit " + r.type);
  }
}

// A bool parameter; annotated tl.int1, an int too (its low byte), as the stubs take it.
void BundleKernel::Impl::pack_flag(const RtArg& r, const Arg& a, uint64_t* slot) const {
  if (a.kind() != Arg::kBool && !(r.annotated && a.kind() == Arg::kInteger))
    fail_arg(r, std::string("expects a bool (u1), got ") + arg_kind_name(a.kind()));
  if (encode_flag(r.annotated, int_val(a), slot) != Fit::kOk) fail_arg(r, arg_value_text(a) + " does not fit 64 bits");
}

// A float parameter's value as Triton's launcher reads it (PyFloat_AsDouble):
// a float; for an annotated parameter an int or a bool too.
double BundleKernel::Impl::real_of(const RtArg& r, const Arg& a) const {
  if (a.kind() == Arg::kFloat) return a.real();
  if (!r.annotated || a.kind() == Arg::kPointer)
    fail_arg(r, std::string(r.annotated ? "expects a number (" : "expects a float (") + r.type + "), got " +
                    arg_kind_name(a.kind()));
  return a.big() ? double(a.bits()) : double(a.integer());  // a bool's bits are 0 or 1
}

// Packs a float parameter in its type, as Triton's launcher does
// (encode.h); returns the double it was converted from (the key value).
double BundleKernel::Impl::pack_float(const RtArg& r, const Arg& a, uint64_t* slot) const {
  double d = real_of(r, a);
  if (encode_float(r.ty, d, slot) != Fit::kOk)
    fail_arg(r, (a.kind() == Arg::kFloat ? Constant(d).repr() : arg_value_text(a)) +
                    " does not fit fp16 (it rounds beyond 65504; Triton's launcher raises OverflowError)");
  return d;
}

// A descriptor: its element type, rank and block shape are the signature's (the
// kernel's type); the rest is checked here and encoded at launch.
void BundleKernel::Impl::pack_desc(const RtArg& r, const Arg& a, uint64_t* slot, Call& c) const {
  if (a.kind() != Arg::kDesc)
    fail_arg(r, "expects a tensor descriptor (" + r.type + "), got " + arg_kind_name(a.kind()) +
                "; make one with lt::TensorDesc(base, shape, strides, block_shape)");
  HostTensorDesc d = a.desc()->desc;
  if (d.rank == 0) fail_arg(r, "its shape, strides and block_shape must have the same length, 1 to 5");
  if (d.dtype != kNoDtype && d.dtype != r.dtype)
    fail_arg(r, std::string("a descriptor over ") + dtype_name(d.dtype) + " where the signature says " + r.type);
  d.dtype = r.dtype;
  if (d.rank != r.desc_rank || !std::equal(d.block, d.block + d.rank, r.desc_block)) {
    std::string got;
    for (int i = 0; i < d.rank; ++i) got += (i ? ", " : "") + std::to_string(d.block[i]);
    fail_arg(r, "a descriptor with block shape [" + got + "] where the signature says " + r.type);
  }
  std::string why = check_tensor_desc(d);
  if (!why.empty()) fail_arg(r, why);
  *slot = c.n_desc;
  c.descs[c.n_desc++] = d;
}

void BundleKernel::Impl::pack(size_t i, const Arg& a, Call& c) const {
  const RtArg& r = args[i];
  uint64_t* slot = &c.slots[i];
  *slot = 0;
  uint64_t bits = 0, word = a.bits();  // word: the key value (a float's as converted, a double)
  if (r.ty == Ty::kDesc) {
    pack_desc(r, a, slot, c);
  } else if (r.ty == Ty::kPtr) {
    if (a.kind() != Arg::kPointer)
      fail_arg(r, std::string("expects a device pointer (") + r.type + "), got " + arg_kind_name(a.kind()) +
                      (a.kind() == Arg::kInteger ? "; wrap a CUdeviceptr in lt::DevicePtr(...)" : ""));
    if (a.dtype() != kNoDtype && a.dtype() != r.dtype)
      fail_arg(r, std::string("a pointer to ") + dtype_name(a.dtype()) + " where the signature says " + r.type);
    *slot = a.bits();
    bits = ptr_bit(r.align, a.bits());
  } else if (is_int(r.ty)) {
    pack_int(r, a, slot, &bits);
  } else if (r.ty == Ty::kU1) {
    pack_flag(r, a, slot);
  } else {
    double d = pack_float(r, a, slot);
    std::memcpy(&word, &d, 8);
  }
  c.key[1 + (2 * i) / 64] |= bits << ((2 * i) % 64);
  if (r.key_word >= 0) c.key[r.key_word] = word;
}

void BundleKernel::Impl::read(const Arg* a, size_t n, Call& c) const {
  if (n != args.size()) {
    fail("takes " + std::to_string(args.size()) + " runtime arguments (" + sorted_names(arg_names()) + "), got " +
         std::to_string(n));
  }
  for (size_t w = 1; w <= bit_words; ++w) c.key[w] = 0;
  c.n_desc = 0;
  for (size_t i = 0; i < n; ++i) pack(i, a[i], c);
}

size_t BundleKernel::Impl::params(const Entry& e, Call& c, void** out, DescParams* dps) const {
  const LaunchMeta& m = e.kernel->meta();
  size_t np = 0, k = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!e.is_param[i]) continue;
    if (args[i].ty == Ty::kDesc) {
      np += pack_tensor_desc(m.tensordesc, m.tensordesc_abi, k, c.descs[c.slots[i]], dps[k], out + np, desc.name,
                             args[i].name.c_str());
      ++k;
    } else {
      out[np++] = &c.slots[i];
    }
  }
  return np;
}

void BundleKernel::Impl::launch_entry(const Entry& e, cu::CUcontext ctx, cu::CUstream s, Dim3 grid, Call& c) const {
  void* out[kMaxArgs + kMaxDescArgs * kMaxDescParams];
  DescParams dps[kMaxDescArgs];  // uninitialized: packing writes what it passes
  size_t np = params(e, c, out, dps);
  e.kernel->launch(ctx, s, grid, out, np);
}

const Entry* BundleKernel::Impl::entry(const Arg* a, const Call& c, cu::CUstream s, const GridFn* grid) const {
  if (const Entry* e = table->find(c.key, key_len)) return e;
  ResolveCtx rc{a, &c, s, grid};
  return table->resolve(c.key, key_len, &rc);
}

void BundleKernel::launch(Stream stream, Dim3 grid, const Arg* args, size_t n) const {
  const Impl& k = *impl_;
  Call c;
  k.read(args, n, c);
  cu::CUcontext ctx = current_context();
  c.key[0] = reinterpret_cast<uint64_t>(ctx);
  const Entry* e = k.table->find(c.key, k.key_len);
  if (!e) {
    GridFn fixed = [grid](const Meta&) { return grid; };  // what lazy-mode tuning launches with
    e = k.entry(args, c, stream.handle, &fixed);
  }
  k.launch_entry(*e, ctx, stream.handle, grid, c);
}

void BundleKernel::launch(Stream stream, const GridFn& grid, const Arg* args, size_t n) const {
  const Impl& k = *impl_;
  Call c;
  k.read(args, n, c);
  cu::CUcontext ctx = current_context();
  c.key[0] = reinterpret_cast<uint64_t>(ctx);
  const Entry* e = k.entry(args, c, stream.handle, &grid);
  Dim3 g = grid(static_cast<const Winner*>(e->user.get())->meta);
  k.launch_entry(*e, ctx, stream.handle, g, c);
}

const Winner& BundleKernel::winner(const Arg* args, size_t n, Stream stream, const GridFn& grid) const {
  const Impl& k = *impl_;
  Call c;
  k.read(args, n, c);
  c.key[0] = reinterpret_cast<uint64_t>(current_context());
  const Entry* e = k.entry(args, c, stream.handle, grid ? &grid : nullptr);
  return *static_cast<const Winner*>(e->user.get());
}

std::string BundleKernel::Impl::call_spec(const Call& c) const {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string s = spec_suffix(args[i], c.key[1 + (2 * i) / 64] >> ((2 * i) % 64) & 3);
    out += (i ? "," : "") + args[i].type + (s.empty() ? "" : ":" + s);
  }
  return out;
}

std::string BundleKernel::specialization(std::initializer_list<Arg> args) const {
  Call c;
  impl_->read(args.begin(), args.size(), c);
  return impl_->call_spec(c);
}

const std::string& BundleKernel::name() const { return impl_->desc.name; }
const std::string& BundleKernel::source() const { return impl_->desc.source; }
const std::string& BundleKernel::signature() const { return impl_->signature; }

std::vector<std::string> BundleKernel::Impl::arg_names() const {
  std::vector<std::string> out;
  for (const auto& r : args) out.push_back(r.name);
  return out;
}

std::vector<std::string> BundleKernel::arg_names() const { return impl_->arg_names(); }

// ---- resolution ---------------------------------------------------------------

bool BundleKernel::Impl::matches(const Variant& v, const Call& c, const std::string& target) const {
  if (v.target != target || !compatible(v)) return false;
  for (size_t i = 0; i < args.size(); ++i)
    if (v.specs[args[i].call_index] != spec_suffix(args[i], c.key[1 + (2 * i) / 64] >> ((2 * i) % 64) & 3))
      return false;
  for (size_t k = 0; k < key_names.size(); ++k) {
    auto it = std::find_if(v.key_values.begin(), v.key_values.end(), [&](const auto& kv) { return kv.first == key_names[k]; });
    if (it == v.key_values.end()) return false;
    const json::Value& j = it->second;
    uint64_t word = j.kind == json::Value::kUInt ? j.u : j.kind == json::Value::kBool ? uint64_t(j.b) : uint64_t(j.i);
    if (j.kind == json::Value::kFloat) std::memcpy(&word, &j.f, 8);
    if (word != c.key[1 + bit_words + k]) return false;
  }
  return true;
}

std::shared_ptr<Variant> BundleKernel::Impl::find_variant(const Call& c, const std::string& target,
                                                          const std::string& device) const {
  std::lock_guard<std::mutex> lock(bundle->mu);
  std::shared_ptr<Variant> best;
  for (const auto& v : record->variants)
    if (matches(*v, c, target) && (!best || (v->device == device && best->device != device))) best = v;
  return best;
}

std::string BundleKernel::Impl::describe_call(const Call& c, const std::string& target) const {
  std::string out = target + " " + call_spec(c);
  for (const auto& [k, v] : constexprs) out += " " + k + "=" + v.repr();
  for (size_t k = 0; k < key_names.size(); ++k) {
    const RtArg& r = *std::find_if(args.begin(), args.end(), [&](const RtArg& a) { return a.name == key_names[k]; });
    uint64_t w = c.key[1 + bit_words + k];
    double d;
    std::memcpy(&d, &w, 8);
    out += " " + r.name + "=" +
           (is_float(r.ty) ? Constant(d).repr() : r.ty == Ty::kU64 ? std::to_string(w) : std::to_string(int64_t(w)));
  }
  return out;
}

std::shared_ptr<Kernel> BundleKernel::Impl::kernel_of(Variant& v) const {
  std::lock_guard<std::mutex> lock(bundle->mu);
  if (v.kernel) return v.kernel;
  if (v.cubin.empty()) {
    bool found = false;
    v.cubin = read_file(bundle->dir + "/" + v.cubin_file, &found);
    if (!found || v.cubin.empty()) fail("cannot read its cubin " + bundle->dir + "/" + v.cubin_file);
    if (v.cubin_size >= 0 && int64_t(v.cubin.size()) != v.cubin_size) {
      std::string got = std::to_string(v.cubin.size());
      v.cubin.clear();
      fail("its cubin " + bundle->dir + "/" + v.cubin_file + " is " + got + " bytes, the manifest says " +
           std::to_string(v.cubin_size) + " (cut short?): add the kernel to the bundle again");
    }
  }
  auto image = std::make_shared<KernelImage>();
  image->cubin = v.cubin;
  image->meta = v.launch;
  v.kernel = std::make_shared<Kernel>(std::move(image));
  return v.kernel;
}

std::shared_ptr<const Entry> BundleKernel::Impl::make_entry(const std::shared_ptr<Variant>& v, const Call& c,
                                                            const std::string& target) {
  auto e = std::make_shared<Entry>();
  e->kernel = kernel_of(*v);
  for (const auto& r : args) e->is_param.push_back(v->is_param[r.call_index]);
  auto w = std::make_shared<Winner>();
  w->kernel = e->kernel;
  Constants meta = constexprs;
  meta.insert(meta.end(), v->meta.begin(), v->meta.end());
  w->meta = Meta(desc.name, std::move(meta));
  w->specialization = describe_call(c, target);
  w->device = v->device;
  e->user = w;
  return e;
}

ResolveRequest BundleKernel::Impl::request(const ResolveCtx& rc) const {
  ResolveRequest req;
  req.bundle_dir = bundle->dir;
  req.source = desc.source;
  req.options = options;
  req.stream = rc.stream;
  if (rc.grid) req.grid = *rc.grid;
  if (std::any_of(layout.begin(), layout.end(), [](const auto& l) { return !l.empty(); })) req.layouts = layout;
  size_t next = 0, leaf = 0;
  for (size_t i = 0; i < desc.params.size(); ++i) {
    if (call_types[leaf] == "constexpr") {
      CallValue cv;
      cv.name = desc.params[i].name;
      cv.type = "constexpr";
      cv.is_constexpr = true;
      cv.constant = std::find_if(constexprs.begin(), constexprs.end(), [&](const auto& kv) { return kv.first == cv.name; })->second;
      req.values.push_back(std::move(cv));
      ++leaf;
      continue;
    }
    // One runtime argument, or each element of a tuple argument (in order).
    size_t n = layout[i].empty() ? 1 : size_t(std::count(layout[i].begin(), layout[i].end(), '_'));
    for (size_t k = 0; k < n; ++k, ++leaf) {
      CallValue cv;
      cv.name = args[next].name;
      cv.type = call_types[leaf];
      const RtArg& r = args[next];
      const Arg& a = rc.args[next++];
      cv.is_pointer = a.kind() == Arg::kPointer;
      cv.ptr = DevicePtr(static_cast<unsigned long long>(a.bits()));
      cv.ptr.nbytes = a.nbytes();
      cv.value = a;
      if (r.ty == Ty::kDesc) {  // as read (and checked) for this call
        cv.is_desc = true;
        cv.desc = rc.call->descs[rc.call->slots[next - 1]];
      }
      req.values.push_back(std::move(cv));
    }
  }
  return req;
}

std::shared_ptr<Variant> BundleKernel::Impl::resolve_lazily(const ResolveCtx& rc, const std::string& target,
                                                            Resolver& resolver) {
  if (!rc.grid) fail("no winner yet for " + describe_call(*rc.call, target) + "; lazy mode tunes on the first launch, "
                     "which needs a grid (call launch(), or winner() with a grid)");
  auto [text, cubin] = resolver.resolve(request(rc));
  std::string what = label + ": the lazily resolved variant";
  std::shared_ptr<Variant> v = variant_from(json::parse(text, what), desc, what);
  v->cubin = std::move(cubin);
  if (!matches(*v, *rc.call, target))
    fail("internal error: Python resolved a variant that does not match the call (" + describe_call(*rc.call, target) +
         "); please report it");
  std::lock_guard<std::mutex> lock(bundle->mu);
  record->variants.push_back(v);
  return v;
}

std::shared_ptr<const Entry> BundleKernel::Impl::resolve(const CallKey& key, const ResolveCtx& rc) {
  auto ctx = reinterpret_cast<cu::CUcontext>(key[0]);
  const DeviceInfo& dev = device_info(context_device(ctx));
  const std::string& target = dev.arch;  // "sm_90" or "gfx942"
  std::shared_ptr<Variant> v = find_variant(*rc.call, target, dev.name);
  if (!v) {
    std::shared_ptr<Resolver> resolver;
    {
      std::lock_guard<std::mutex> lock(bundle->mu);
      resolver = bundle->resolver;
    }
    if (!resolver) {
      std::lock_guard<std::mutex> lock(bundle->mu);
      fail(other_vendor(dev) + "no tuned winner in bundle " + bundle->dir + " for " + describe_call(*rc.call, target) +
           "; its winners are:" + variant_list() +
           "\nTune this call from Python (lazytriton.cpp.Bundle(dir).add(...)) or turn on lazy mode "
           "(lt::enable_lazy from lazytriton::embed)");
    }
    v = resolve_lazily(rc, target, *resolver);
  }
  return make_entry(v, *rc.call, target);
}

// Where every winner of this kernel is for the other vendor's GPUs: says so
// first (an NVIDIA bundle on an AMD device, or the reverse).
std::string BundleKernel::Impl::other_vendor(const DeviceInfo& dev) const {
  std::string targets;
  for (const auto& v : record->variants) {
    if ((v->target.rfind("gfx", 0) == 0) == dev.hip) return "";
    if (targets.find(v->target) == std::string::npos) targets += (targets.empty() ? "" : ", ") + v->target;
  }
  if (targets.empty()) return "";
  return "bundle " + bundle->dir + " holds this kernel only for " + (dev.hip ? "NVIDIA" : "AMD") + " GPUs (" +
         targets + "); this device, " + dev.name + ", is " + (dev.hip ? "an AMD " : "an NVIDIA ") + dev.arch +
         ": build the bundle on (or for) this device's target. ";
}

}  // namespace lt
