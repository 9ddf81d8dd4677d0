// The bundle manifest's records (manifest.json, written by
// lazytriton/bundle.py) as the C++ side reads them, and the open bundle that
// holds them. Private to liblazytriton: bundle.cc opens bundles,
// bundle_kernel.cc picks and launches their variants.
#pragma once
#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../core/json.h"
#include "lazytriton/bundle.h"
#include "lazytriton/slot_spec.h"

namespace lt {
namespace manifest {

struct ParamDesc {
  std::string name;
  bool is_constexpr = false;
  std::string annotation;  // Triton's normalised annotation ("i64", "fp32"), "" if none
  bool heuristic = false;  // read by a @triton.heuristics function (its specialization: the variants' slot tables)
  bool has_default = false;
  Constant dflt;
};

struct KernelDesc {
  std::string name, source;
  std::vector<ParamDesc> params;  // the call's parameters (configs' and heuristics' ones excluded)
  std::vector<std::string> supplied;  // chosen by configs or heuristics
  std::vector<std::string> overwritten;  // of those, what a call may pass and its heuristic overwrites
};

// A row of a call's slot table (specialize.Shape.table(), contract.SLOT_ROW's fields).
using SlotRow = std::array<int, kSlotRowFields>;
inline SlotSpec spec_of(const SlotRow& r) { return slot_spec(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]); }

// A slot table from JSON, one valid row per leaf, each agreeing with its leaf's type in `types`
// ("*fp32", "i64", "constexpr", ...); throws lt::Error naming `what` otherwise.
std::vector<SlotRow> table_from(const json::Value& rows, const std::vector<std::string>& types,
                                const std::string& what);

// One tuned winner: a binary for a specialization of a kernel.
struct Variant {
  // The device target it was built for: "sm_90" (NVIDIA; the manifest's "arch"
  // is the number 90) or "gfx942" (AMD; the manifest's "arch" is the name).
  std::string target;
  std::string device;
  std::vector<std::string> types;  // per call parameter; "constexpr" for constexprs
  std::vector<std::string> specs;  // per call parameter: "16", "1" or ""
  std::vector<SlotRow> table;  // per leaf: how it is read, packed and keyed (the binder walks it)
  Constants constexprs;  // sorted by name
  std::vector<std::pair<std::string, json::Value>> key_values;
  std::vector<bool> is_param;  // per call parameter
  // Tuple arguments: per call parameter "" or its nesting ("[_,[_,_]]"); types,
  // specs and is_param then have one entry per leaf (a tuple's elements, in
  // order). Empty: no tuple argument.
  std::vector<std::string> layout;
  Constants meta;
  LaunchMeta launch;
  std::string cubin_file;  // relative to the bundle
  int64_t cubin_size = -1;  // as written (-1: not recorded), checked when the cubin is read
  std::string cubin;  // bytes, once read (or as the resolver returned them)
  std::shared_ptr<Kernel> kernel;  // made on first use, shared by every handle
};

struct KernelRecord {
  KernelDesc desc;
  std::vector<std::shared_ptr<Variant>> variants;
};

std::string kernel_label(const KernelDesc& d);  // "kernel add_kernel"
// A kernel's entry ("name", "source", "params", "supplied") and one of its variants;
// throw lt::Error naming `what` on malformed input.
KernelDesc desc_from(const json::Value& k, const std::string& what);
std::shared_ptr<Variant> variant_from(const json::Value& v, const KernelDesc& d, const std::string& what);

// A file's bytes (a manifest, a cubin); *found is false if it cannot be opened.
std::string read_file(const std::string& path, bool* found);
// "a, b, c" for messages ("none" if empty).
std::string sorted_names(const std::vector<std::string>& names);

}  // namespace manifest

// An open bundle: its directory and kernel records (lazy mode adds to them).
struct Bundle::Impl {
  std::string dir;
  bool has_manifest = false;
  mutable std::mutex mu;
  std::vector<std::shared_ptr<manifest::KernelRecord>> kernels;
  std::shared_ptr<Resolver> resolver;

  std::shared_ptr<manifest::KernelRecord> find(const std::string& name) const;
  std::shared_ptr<manifest::KernelRecord> add_kernel(manifest::KernelDesc desc);
  void load(const std::string& text);
};

}  // namespace lt
