// Reading bundle manifests (bundle_manifest.h): kernels, their parameters and
// variants, and launch metadata, from the JSON lazytriton/bundle.py writes.
#include "bundle_manifest.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace lt {
namespace manifest {
namespace {

Constant constant_from(const json::Value& v, const std::string& what) {
  switch (v.kind) {
    case json::Value::kNull: return Constant();
    case json::Value::kBool: return Constant(v.b);
    case json::Value::kInt: return Constant(v.i);
    case json::Value::kFloat: return Constant(v.f);
    case json::Value::kString: return Constant(v.s);
    default: throw Error(what + ": expected None, a bool, an int (at most int64), a float or a string");
  }
}

Constants constants_from(const json::Value& obj, const std::string& what) {
  Constants out;
  for (const auto& [k, v] : obj.as_object(what)) out.emplace_back(k, constant_from(v, what + "." + k));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

bool opt_bool(const json::Value& obj, const char* key, bool dflt, const std::string& what) {
  const json::Value* v = obj.find(key);
  return v && v->kind != json::Value::kNull ? v->as_bool(what + "." + key) : dflt;
}

int64_t opt_int(const json::Value& obj, const char* key, int64_t dflt, const std::string& what) {
  const json::Value* v = obj.find(key);
  return v && v->kind != json::Value::kNull ? v->as_int(what + "." + key) : dflt;
}

ParamDesc param_from(const json::Value& p, const std::string& what) {
  ParamDesc d;
  d.name = p.at("name", what).as_string(what + ".name");
  std::string w = what + " (" + d.name + ")";
  d.is_constexpr = opt_bool(p, "constexpr", false, w);
  if (const json::Value* a = p.find("annotation"); a && a->kind == json::Value::kString) d.annotation = a->s;
  d.specialize = opt_bool(p, "specialize", true, w);
  d.align = opt_bool(p, "align", true, w);
  d.key = opt_bool(p, "key", false, w);
  d.heuristic = opt_bool(p, "heuristic", false, w);
  if (const json::Value* v = p.find("default")) {
    d.has_default = true;
    d.dflt = constant_from(*v, w + ".default");
  }
  return d;
}

LaunchMeta launch_from(const json::Value& m, const std::string& what) {
  LaunchMeta l;
  l.name = m.at("name", what).as_string(what + ".name");
  l.num_warps = int(opt_int(m, "num_warps", 4, what));
  l.num_ctas = int(opt_int(m, "num_ctas", 1, what));
  l.shared = unsigned(opt_int(m, "shared", 0, what));
  l.global_scratch_size = uint64_t(opt_int(m, "global_scratch_size", 0, what));
  l.global_scratch_align = uint64_t(opt_int(m, "global_scratch_align", 1, what));
  l.profile_scratch_size = uint64_t(opt_int(m, "profile_scratch_size", 0, what));
  l.profile_scratch_align = uint64_t(opt_int(m, "profile_scratch_align", 1, what));
  l.cooperative = opt_bool(m, "launch_cooperative_grid", false, what);
  l.pdl = opt_bool(m, "launch_pdl", false, what);
  if (const json::Value* a = m.find("gfx"); a && a->kind == json::Value::kString) l.gfx = a->s;
  else l.arch = int(opt_int(m, "arch", 0, what));
  l.warp_size = int(opt_int(m, "warp_size", 32, what));
  l.cluster[0] = unsigned(l.num_ctas);
  if (const json::Value* c = m.find("cluster_dims"); c && c->kind == json::Value::kArray)
    for (size_t i = 0; i < c->items.size() && i < 3; ++i)
      l.cluster[i] = unsigned(std::max<int64_t>(1, c->items[i].as_int(what + ".cluster_dims")));
  // Host tensor descriptors: how each was lowered, and the Triton version's parameter layout.
  if (const json::Value* t = m.find("tensordesc_meta"); t && t->kind == json::Value::kArray)
    for (const json::Value& e : t->items) {
      std::string w = what + ".tensordesc_meta";
      TmaMeta tm;
      tm.swizzle = int(opt_int(e, "swizzle", 0, w));
      tm.elem_size = int(opt_int(e, "elem_size", 0, w));
      tm.elem_type = int(opt_int(e, "elem_type", 0, w));
      const auto& block = e.at("block_size", w).as_array(w + ".block_size");
      if (block.empty() || block.size() > size_t(kMaxDescRank)) throw Error(w + ": block_size must have 1 to 5 entries");
      tm.rank = int(block.size());
      for (size_t i = 0; i < block.size(); ++i) tm.block[i] = uint32_t(block[i].as_int(w + ".block_size"));
      tm.fp4_padded = opt_bool(e, "fp4_padded", false, w);
      tm.im2col = opt_bool(e, "is_im2col", false, w);
      l.tensordesc.push_back(tm);
    }
  if (const json::Value* a = m.find("lt_tensordesc_abi"); a && a->kind != json::Value::kNull)
    l.tensordesc_abi = int(a->as_int(what + ".lt_tensordesc_abi"));
  else if (const json::Value* v = m.find("triton_version"); v && v->kind == json::Value::kString)
    l.tensordesc_abi = tensor_desc_abi_of(v->s);
  return l;
}

std::vector<std::string> strings_from(const json::Value& a, const std::string& what) {
  std::vector<std::string> out;
  for (const auto& s : a.as_array(what)) out.push_back(s.as_string(what));
  return out;
}

}  // namespace

std::string kernel_label(const KernelDesc& d) { return "kernel " + d.name; }

KernelDesc desc_from(const json::Value& k, const std::string& what) {
  KernelDesc d;
  d.name = k.at("name", what).as_string(what + ".name");
  d.source = k.at("source", what).as_string(what + ".source");
  for (const auto& p : k.at("params", what).as_array(what + ".params")) d.params.push_back(param_from(p, what + ".params"));
  if (const json::Value* s = k.find("supplied"))
    for (const auto& n : s->as_array(what + ".supplied")) d.supplied.push_back(n.as_string(what + ".supplied"));
  if (const json::Value* s = k.find("overwritten"))
    for (const auto& n : s->as_array(what + ".overwritten"))
      d.overwritten.push_back(n.as_string(what + ".overwritten"));
  return d;
}

std::shared_ptr<Variant> variant_from(const json::Value& v, const KernelDesc& d, const std::string& what) {
  auto out = std::make_shared<Variant>();
  const json::Value& arch = v.at("arch", what);
  out->target = arch.kind == json::Value::kString ? arch.s : "sm_" + std::to_string(arch.as_int(what + ".arch"));
  if (const json::Value* dev = v.find("device"); dev && dev->kind == json::Value::kString) out->device = dev->s;
  out->types = strings_from(v.at("types", what), what + ".types");
  out->specs = strings_from(v.at("specs", what), what + ".specs");
  out->constexprs = constants_from(v.at("constexprs", what), what + ".constexprs");
  out->key_values = v.at("key_values", what).as_object(what + ".key_values");
  for (const auto& b : v.at("is_param", what).as_array(what + ".is_param")) out->is_param.push_back(b.as_bool(what));
  out->meta = constants_from(v.at("meta", what), what + ".meta");
  out->launch = launch_from(v.at("launch", what), what + ".launch");
  out->cubin_file = v.at("cubin", what).as_string(what + ".cubin");
  if (const json::Value* s = v.find("cubin_size"); s && s->kind != json::Value::kNull)
    out->cubin_size = s->as_int(what + ".cubin_size");
  size_t n = d.params.size();
  if (const json::Value* l = v.find("layout"); l && l->kind != json::Value::kNull) {
    out->layout = strings_from(*l, what + ".layout");
    if (out->layout.size() != n) throw Error(what + ": layout does not have one entry per argument of " + kernel_label(d));
    n = 0;
    for (const auto& s : out->layout) n += s.empty() ? 1 : size_t(std::count(s.begin(), s.end(), '_'));
  }
  if (out->types.size() != n || out->specs.size() != n || out->is_param.size() != n)
    throw Error(what + ": types/specs/is_param do not have one entry per argument (leaf) of " + kernel_label(d));
  return out;
}

std::string read_file(const std::string& path, bool* found) {
  std::ifstream f(path, std::ios::binary);
  *found = bool(f);
  if (!f) return "";
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string sorted_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace manifest

LaunchMeta launch_meta_from_json(const std::string& text) {
  return manifest::launch_from(json::parse(text, "launch metadata"), "launch metadata");
}

}  // namespace lt
