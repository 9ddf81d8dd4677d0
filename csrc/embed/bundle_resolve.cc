// BundleKernel: the variant of a new call key, found once per key (see
// ResolveTable) among the bundle's winners for this device's target, or, in
// lazy mode, resolved by the embedded Python (lazytriton.cpp.embed) and added
// to the bundle.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "bundle_kernel_impl.h"

namespace lt {

bool BundleKernel::Impl::matches(const Variant& v, const Call& c, const std::string& target) const {
  if (v.target != target || !compatible(v)) return false;
  for (size_t i = 0; i < args.size(); ++i)
    if (v.specs[args[i].call_index] != spec_suffix(args[i].slot, key_bits_of(c.key, i)))
      return false;
  for (size_t i : keyed) {
    auto it = std::find_if(v.key_values.begin(), v.key_values.end(), [&](const auto& kv) { return kv.first == args[i].name; });
    if (it == v.key_values.end()) return false;
    const json::Value& j = it->second;
    uint64_t word = j.kind == json::Value::kUInt ? j.u : j.kind == json::Value::kBool ? uint64_t(j.b) : uint64_t(j.i);
    if (j.kind == json::Value::kFloat) std::memcpy(&word, &j.f, 8);
    if (word != c.key[args[i].key_word]) return false;
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
  for (size_t i : keyed) {
    const RtArg& r = args[i];
    uint64_t w = c.key[r.key_word];
    double d;
    std::memcpy(&d, &w, 8);
    out += " " + r.name + "=" +
           (r.slot.kind == SlotKind::kFloat ? Constant(d).repr()
            : r.slot.ty == Ty::kU64         ? std::to_string(w)
                                            : std::to_string(int64_t(w)));
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

std::shared_ptr<Entry> BundleKernel::Impl::make_entry(const std::shared_ptr<Variant>& v, const Call& c,
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
      if (r.slot.kind == SlotKind::kDesc) {  // as read (and checked) for this call
        cv.is_desc = true;
        cv.desc = rc.call->descs[rc.call->slots[next - 1]];
      }
      req.values.push_back(std::move(cv));
    }
  }
  return req;
}

std::shared_ptr<const Entry> BundleKernel::Impl::resolve_lazily(const ResolveCtx& rc, const std::string& target,
                                                                Resolver& resolver) {
  if (!rc.grid) fail("no winner yet for " + describe_call(*rc.call, target) + "; lazy mode tunes on the first launch, "
                     "which needs a grid (call launch(), or winner() with a grid)");
  ResolvedVariant got = resolver.resolve(request(rc));
  std::shared_ptr<Variant> v;
  if (got.this_call_only) {  // a candidate of online tuning: the same one comes back on later calls
    std::lock_guard<std::mutex> lock(bundle->mu);
    if (auto it = candidates.find(got.variant); it != candidates.end()) v = it->second;
  }
  if (!v) {
    std::string what = label + ": the lazily resolved variant";
    v = variant_from(json::parse(got.variant, what), desc, what);
    v->cubin = std::move(got.cubin);
    if (!matches(*v, *rc.call, target))
      fail("internal error: Python resolved a variant that does not match the call (" +
           describe_call(*rc.call, target) + "); please report it");
    std::lock_guard<std::mutex> lock(bundle->mu);
    if (got.this_call_only)
      candidates.emplace(got.variant, v);  // its module loads once (kernel_of)
    else
      record->variants.push_back(v);
  }
  std::shared_ptr<Entry> e = make_entry(v, *rc.call, target);
  e->once = got.this_call_only;  // not installed: the next call of the key asks the resolver again
  e->timer = std::move(got.timer);
  return e;
}

std::shared_ptr<const Entry> BundleKernel::Impl::resolve(const CallKey& key, const ResolveCtx& rc) {
  auto ctx = reinterpret_cast<cu::CUcontext>(key.back());  // the key's last word
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
    return resolve_lazily(rc, target, *resolver);
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
