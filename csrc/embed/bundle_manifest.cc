// Reading bundle manifests (bundle_manifest.h): kernels, their parameters and
// variants, and launch metadata, from the JSON lazytriton/bundle.py writes.
#include "bundle_manifest.h"

#include "bundle_signature.h"

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

ParamDesc param_from(const json::Value& p, const std::string& what) {
  ParamDesc d;
  d.name = p.at("name", what).as_string(what + ".name");
  std::string w = what + " (" + d.name + ")";
  d.is_constexpr = opt_bool(p, "constexpr", false, w);
  if (const json::Value* a = p.find("annotation"); a && a->kind == json::Value::kString) d.annotation = a->s;
  d.heuristic = opt_bool(p, "heuristic", false, w);
  if (const json::Value* v = p.find("default")) {
    d.has_default = true;
    d.dflt = constant_from(*v, w + ".default");
  }
  return d;
}

std::vector<std::string> strings_from(const json::Value& a, const std::string& what) {
  std::vector<std::string> out;
  for (const auto& s : a.as_array(what)) out.push_back(s.as_string(what));
  return out;
}

// Whether a row reads a leaf of type `type` (the variant's "types", a signature's leaf).
bool row_takes(const SlotSpec& s, const std::string& type) {
  switch (s.kind) {
    case SlotKind::kConstexpr: case SlotKind::kFolded: return type == "constexpr";
    case SlotKind::kPtr: return type == std::string("*") + dtype_name(s.dtype);
    case SlotKind::kInt: case SlotKind::kFloat: case SlotKind::kBool: return type == type_name(s.ty);
    case SlotKind::kDesc: {
      int dtype, rank;
      int64_t block[kMaxDescRank];
      std::string canonical;
      return sigtypes::parse_desc_type(type, &dtype, &rank, block, &canonical) && dtype == s.dtype && rank == s.rank;
    }
  }
  return true;  // a kind C++ bundles do not read: refused when a signature is bound
}

}  // namespace

std::vector<SlotRow> table_from(const json::Value& rows, const std::vector<std::string>& types,
                                const std::string& what) {
  const auto& a = rows.as_array(what + ".table");
  if (a.size() != types.size())
    throw Error(what + ": its slot table has " + std::to_string(a.size()) + " rows for " +
                std::to_string(types.size()) + " arguments (leaves)");
  std::vector<SlotRow> out;
  for (size_t i = 0; i < a.size(); ++i) {
    std::string w = what + ".table[" + std::to_string(i) + "]";
    const auto& row = a[i].as_array(w);
    if (row.size() != size_t(kSlotRowFields))
      throw Error(w + ": a slot table row has " + std::to_string(kSlotRowFields) + " fields");
    SlotRow r;
    for (size_t f = 0; f < r.size(); ++f) r[f] = int(row[f].as_int(w));
    if (const char* why = slot_row_error(r[0], r[1], r[2], r[3], r[7])) throw Error(w + ": " + why);
    if (!row_takes(spec_of(r), types[i]))
      throw Error(w + ": the row does not read the argument's type " + types[i]);
    out.push_back(r);
  }
  return out;
}

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
  out->launch = launch_meta_from(v.at("launch", what), what + ".launch");
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
  out->table = table_from(v.at("table", what), out->types, what);
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

}  // namespace lt
