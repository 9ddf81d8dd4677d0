// BundleKernel: one signature and set of constexprs of a bundle's kernel.
// Binds the signature to the kernel's parameters and to the call's slot table
// (its variants' "table", the rows lazytriton.model.specialize.Shape.table() gives
// the Python stubs; in lazy mode before any winner, the same rows from Python),
// reads each call's arguments by walking those rows (packed and keyed through
// encode.h and call_layout.h, as the Python stubs' read_slot does), finds the
// call's entry in its resolve-once table (a new key's variant is found or
// resolved by bundle_resolve.cc) and launches it through lt::Kernel::launch.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "bundle_kernel_impl.h"

namespace lt {
namespace {

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

bool is_option(const std::string& name) {
  for (const char* o : kCppOptionNames)
    if (name == o) return true;
  return false;
}

}  // namespace

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
  for (const std::string& t : call_types) n_desc += t.rfind("tensordesc<", 0) == 0;
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
  slots = slot_table();
  // The call key (call_layout.h): the bits, each argument's value words, then the context.
  bit_words = key_bit_words(args.size());
  size_t w = bit_words;
  for (size_t i = 0; i < args.size(); ++i) {
    RtArg& r = args[i];
    r.slot = spec_of(slots[r.call_index]);
    if (is_constexpr_slot(r.slot))
      fail_arg(r, "the slot table has a constexpr where the signature has " + r.type);
    r.key_word = w;
    w += value_words(r.slot);
    if (r.slot.in_key) keyed.push_back(i);
  }
  key_len = w + 1;
}

void BundleKernel::Impl::check_constexprs(const Constants& given) const {
  for (const auto& [name, value] : given) {
    if (is_option(name)) continue;
    // A heuristic overwrites it and reads it not (Triton's Heuristics.run): the call's value is dropped.
    if (std::find(desc.overwritten.begin(), desc.overwritten.end(), name) != desc.overwritten.end()) continue;
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
    // A tuple argument: one runtime argument per element, in order (its slot table rows
    // specialize them as Triton specializes tuple elements).
    if (!p.annotation.empty()) fail("argument " + p.name + " is annotated " + p.annotation + ", not a tuple");
    std::vector<std::pair<std::string, std::string>> leaves;
    std::string structure;
    tuple_leaves(types[next++], "", leaves, structure, label + ": argument " + p.name);
    ParamDesc elem = p;
    elem.annotation.clear();
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

// The signature's type of one argument, checked against the kernel's declaration (its
// specialization is the slot table's, not derived here).
void BundleKernel::Impl::check_type(RtArg& r, const ParamDesc& p) {
  if (r.type == "i1") r.type = "u1";  // Triton spells bools u1
  int dtype, rank;
  std::string canonical;
  if (parse_desc_type(r.type, &dtype, &rank, r.desc_block, &canonical)) {
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
    if (dtype_from_name(std::string_view(r.type).substr(1)) == kNoDtype)
      fail_arg(r, "unknown element type in '" + r.type + "'");
    if (p.heuristic)
      fail_arg(r, "the kernel's heuristics read this pointer argument, so they need Python on every call; "
                  "the C++ launch path cannot evaluate them");
    return;
  }
  Ty ty;
  if (!scalar_type(r.type, &ty)) fail_arg(r, "unknown type '" + r.type + "' in the signature");
  bool annotated = !p.annotation.empty();
  if (annotated && p.annotation != r.type)
    fail_arg(r, "annotated " + p.annotation + " in the kernel, but the signature says " + r.type);
  if (!annotated && is_int(ty) && ty != Ty::kI32 && ty != Ty::kI64 && ty != Ty::kU64)
    fail_arg(r, "an unannotated int is i32, i64 or u64 (Triton's class of its value), not " + r.type);
  if (!annotated && is_float(ty) && ty != Ty::kFp32)
    fail_arg(r, "an unannotated float is passed as fp32, not " + r.type);
}

bool BundleKernel::Impl::compatible(const Variant& v) const {
  if (v.types != call_types || v.constexprs != constexprs || (!slots.empty() && v.table != slots)) return false;
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

[[noreturn]] void BundleKernel::Impl::no_winner() const {
  std::lock_guard<std::mutex> lock(bundle->mu);
  std::string cx;
  for (const auto& [k, c] : constexprs) cx += " " + k + "=" + c.repr();
  fail("bundle " + bundle->dir + " has no winner for signature " + signature + cx + "; its winners are:" +
       variant_list() + "\nTune it from Python (lazytriton.cpp.Bundle(dir).add(...)) or turn on lazy mode "
       "(lt::enable_lazy from lazytriton::embed)");
}

// The call's slot table: the first variant's for this signature and these constexprs (variants
// with other rows are other bindings: compatible() keeps them apart), else, in lazy mode, what
// Python reads the signature's types as; without lazy mode, no variant is an error.
std::vector<SlotRow> BundleKernel::Impl::slot_table() const {
  std::shared_ptr<Resolver> resolver;
  {
    std::lock_guard<std::mutex> lock(bundle->mu);
    for (const auto& v : record->variants)
      if (compatible(*v)) return v->table;
    resolver = bundle->resolver;
  }
  if (!resolver) no_winner();
  std::string what = label + ": lazy mode's slot table for " + signature;
  return table_from(json::parse(resolver->slot_table(desc.source, call_types, layout), what), call_types, what);
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
  BundleKernel::Impl* raw = k.get();
  k->table = std::make_unique<ResolveTable>(rec->desc.name, [raw](const CallKey& key, void* ctx) {
    return raw->resolve(key, *static_cast<const ResolveCtx*>(ctx));
  });
  return BundleKernel(k);
}

// ---- the call path ------------------------------------------------------------

// A float parameter's value as Triton's launcher reads it (PyFloat_AsDouble):
// a float; for an annotated parameter an int or a bool too.
double BundleKernel::Impl::real_of(const RtArg& r, const Arg& a) const {
  if (a.kind() == Arg::kFloat) return a.real();
  if (!r.slot.annotated || a.kind() == Arg::kPointer)
    fail_arg(r, std::string(r.slot.annotated ? "expects a number (" : "expects a float (") + r.type + "), got " +
                    arg_kind_name(a.kind()));
  return a.big() ? double(a.bits()) : double(a.integer());  // a bool's bits are 0 or 1
}

// A descriptor: its element type, rank and block shape are the signature's (the
// kernel's type); the rest is checked here and encoded at launch.
void BundleKernel::Impl::read_desc(const RtArg& r, const Arg& a, uint64_t* slot, Call& c) const {
  if (a.kind() != Arg::kDesc)
    fail_arg(r, "expects a tensor descriptor (" + r.type + "), got " + arg_kind_name(a.kind()) +
                "; make one with lt::TensorDesc(base, shape, strides, block_shape)");
  HostTensorDesc d = a.desc()->desc;
  if (d.rank == 0) fail_arg(r, "its shape, strides and block_shape must have the same length, 1 to 5");
  if (d.dtype != kNoDtype && d.dtype != r.slot.dtype)
    fail_arg(r, std::string("a descriptor over ") + dtype_name(d.dtype) + " where the signature says " + r.type);
  d.dtype = r.slot.dtype;
  if (d.rank != r.slot.rank || !std::equal(d.block, d.block + d.rank, r.desc_block)) {
    std::string got;
    for (int i = 0; i < d.rank; ++i) got += (i ? ", " : "") + std::to_string(d.block[i]);
    fail_arg(r, "a descriptor with block shape [" + got + "] where the signature says " + r.type);
  }
  std::string why = check_tensor_desc(d);
  if (!why.empty()) fail_arg(r, why);
  *slot = c.n_desc;
  c.descs[c.n_desc++] = d;
}

// Argument i as its slot table row says (csrc/python/slot_table.h read_slot does the same for
// a Python object): its parameter into c.slots[i], its bits and value words into the key. What
// does not fit the row is an error naming the argument.
void BundleKernel::Impl::read_arg(const RtArg& r, size_t i, const Arg& a, Call& c) const {
  const SlotSpec& s = r.slot;
  uint64_t* cell = &c.slots[i];
  uint64_t* words = &c.key[r.key_word];
  *cell = 0;
  switch (s.kind) {
    case SlotKind::kPtr:
      if (a.kind() != Arg::kPointer)
        fail_arg(r, std::string("expects a device pointer (") + r.type + "), got " + arg_kind_name(a.kind()) +
                        (a.kind() == Arg::kInteger ? "; wrap a CUdeviceptr in lt::DevicePtr(...)" : ""));
      if (a.dtype() != kNoDtype && a.dtype() != s.dtype)
        fail_arg(r, std::string("a pointer to ") + dtype_name(a.dtype()) + " where the signature says " + r.type);
      *cell = a.bits();
      key_put_bits(c.key, i, ptr_bit(s.specialize, a.bits()));
      return;
    case SlotKind::kInt: {  // annotated: any value in its type, or a bool (0 or 1, specialized on nothing)
      if (a.kind() != Arg::kInteger && !(s.annotated && a.kind() == Arg::kBool))
        fail_arg(r, "expects an integer (" + r.type + "), got " + arg_kind_name(a.kind()));
      uint64_t bits = 0;
      switch (encode_int(s.int_spec, int_val(a), cell, &bits)) {
        case Fit::kOk: break;
        case Fit::kWrongClass:
          fail_arg(r, arg_value_text(a) + " is " + type_name(int_class(int_val(a))) +
                          " under Triton's rules (i32 if it fits, else i64, else u64), but the signature says " + r.type);
        default: fail_arg(r, arg_value_text(a) + " does not fit " + r.type);
      }
      key_put_bits(c.key, i, bits);
      if (s.in_key) words[0] = a.bits();
      return;
    }
    case SlotKind::kFloat: {
      double d = real_of(r, a);
      if (encode_float(s.ty, d, cell) != Fit::kOk)
        fail_arg(r, (a.kind() == Arg::kFloat ? Constant(d).repr() : arg_value_text(a)) +
                        " does not fit fp16 (it rounds beyond 65504; Triton's launcher raises OverflowError)");
      if (s.in_key) std::memcpy(words, &d, 8);  // a float's key: the double it converts from
      return;
    }
    case SlotKind::kBool:  // tl.int1 (annotated): an int too, as its low byte
      if (a.kind() != Arg::kBool && !(s.annotated && a.kind() == Arg::kInteger))
        fail_arg(r, std::string("expects a bool (u1), got ") + arg_kind_name(a.kind()));
      if (encode_flag(s.annotated, int_val(a), cell) != Fit::kOk) fail_arg(r, arg_value_text(a) + " does not fit 64 bits");
      if (s.in_key) words[0] = a.bits();
      return;
    case SlotKind::kDesc:  // the block shape is the key: it is the kernel's type
      read_desc(r, a, cell, c);
      for (int j = 0; j < s.rank; ++j) words[j] = uint64_t(r.desc_block[j]);
      return;
    case SlotKind::kConstexpr: case SlotKind::kFolded: break;  // never a runtime argument (bind refuses it)
  }
  fail_arg(r, "its kind of argument (slot kind " + std::to_string(int(s.kind)) + ") cannot be passed from C++");
}

void BundleKernel::Impl::read(const Arg* a, size_t n, Call& c) const {
  if (n != args.size()) {
    fail("takes " + std::to_string(args.size()) + " runtime arguments (" + sorted_names(arg_names()) + "), got " +
         std::to_string(n));
  }
  for (size_t w = 0; w < bit_words; ++w) c.key[w] = 0;
  c.n_desc = 0;
  for (size_t i = 0; i < n; ++i) read_arg(args[i], i, a[i], c);
}

size_t BundleKernel::Impl::params(const Entry& e, Call& c, void** out, DescParams* dps) const {
  return pack_params(*e.kernel, desc.name, args.size(), [&](size_t i) -> ParamRef {
    if (!e.is_param[i]) return {};
    if (args[i].slot.kind == SlotKind::kDesc) return {nullptr, &c.descs[c.slots[i]], args[i].name.c_str()};
    return {&c.slots[i]};
  }, dps, out);
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

void BundleKernel::Impl::launch_resolving(cu::CUcontext ctx, cu::CUstream s, const GridFn& grid, const Arg* a,
                                          Call& c) const {
  for (;;) {
    const Entry* e = entry(a, c, s, &grid);
    Dim3 g = grid(static_cast<const Winner*>(e->user.get())->meta);
    if (launch_entry_timed(*e, [&] { launch_entry(*e, ctx, s, g, c); })) return;
  }
}

void BundleKernel::launch(Stream stream, Dim3 grid, const Arg* args, size_t n) const {
  const Impl& k = *impl_;
  Call c;
  k.read(args, n, c);
  cu::CUcontext ctx = current_context();
  c.key[k.key_len - 1] = reinterpret_cast<uint64_t>(ctx);
  if (const Entry* e = k.table->find(c.key, k.key_len)) return k.launch_entry(*e, ctx, stream.handle, grid, c);
  k.launch_resolving(ctx, stream.handle, [grid](const Meta&) { return grid; }, args, c);
}

void BundleKernel::launch(Stream stream, const GridFn& grid, const Arg* args, size_t n) const {
  const Impl& k = *impl_;
  Call c;
  k.read(args, n, c);
  cu::CUcontext ctx = current_context();
  c.key[k.key_len - 1] = reinterpret_cast<uint64_t>(ctx);
  k.launch_resolving(ctx, stream.handle, grid, args, c);
}

const Winner& BundleKernel::winner(const Arg* args, size_t n, Stream stream, const GridFn& grid) const {
  const Impl& k = *impl_;
  Call c;
  k.read(args, n, c);
  c.key[k.key_len - 1] = reinterpret_cast<uint64_t>(current_context());
  const Entry* e = k.entry(args, c, stream.handle, grid ? &grid : nullptr);
  if (e->timer && e->timer->take()) e->timer->disarm();  // online tuning: this call launched nothing
  return *static_cast<const Winner*>(e->user.get());
}

std::string BundleKernel::Impl::call_spec(const Call& c) const {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string s = spec_suffix(args[i].slot, key_bits_of(c.key, i));
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

}  // namespace lt
