// Bundles: tuned winners on disk, chosen per call by Triton's specialization
// rules and launched through lt::Kernel::launch. Python writes bundles
// (lazytriton/bundle.py); this file opens them (their manifest: bundle_manifest.cc;
// their kernels for a signature: bundle_kernel.cc).
#include "lazytriton/bundle.h"

#include <cstdlib>
#include <mutex>

#include "bundle_manifest.h"

namespace lt {

using namespace manifest;

std::shared_ptr<KernelRecord> Bundle::Impl::find(const std::string& name) const {
  std::vector<std::shared_ptr<KernelRecord>> hits;
  for (const auto& k : kernels)
    if (k->desc.source == name || k->desc.name == name) hits.push_back(k);
  if (hits.size() > 1) {
    std::vector<std::string> srcs;
    for (const auto& k : hits) srcs.push_back(k->desc.source);
    throw Error("kernel " + name + ": several kernels of bundle " + dir + " have this name (" + sorted_names(srcs) +
                "); name it as module:function");
  }
  return hits.empty() ? nullptr : hits[0];
}

std::shared_ptr<KernelRecord> Bundle::Impl::add_kernel(KernelDesc desc) {
  for (auto& k : kernels)
    if (k->desc.source == desc.source) return k;
  auto rec = std::make_shared<KernelRecord>();
  rec->desc = std::move(desc);
  kernels.push_back(rec);
  return rec;
}

void Bundle::Impl::load(const std::string& text) {
  std::string what = dir + "/manifest.json";
  json::Value doc = json::parse(text, what);
  const std::string& format = doc.at("format", what).as_string(what + ".format");
  if (format != "lazytriton-bundle") throw Error(what + ": not a lazytriton bundle (format '" + format + "')");
  int64_t version = doc.at("version", what).as_int(what + ".version");
  const std::string reads = std::to_string(kBundleVersion);
  if (version < kBundleVersion)  // lazytriton.cpp.bundle old_version_message says the same
    throw Error("bundle " + dir + " was written by an older lazytriton (bundle format version " +
                std::to_string(version) + "; this one reads version " + reads + ", whose variants carry their "
                "call's slot table): re-export it (add its kernels again with lazytriton.cpp.Bundle(dir).add(...), "
                "or rebuild it in lazy mode) into a new directory");
  if (version != kBundleVersion)
    throw Error(what + ": bundle format version " + std::to_string(version) + " (this lazytriton reads version " +
                reads + ")");
  for (const auto& [source, k] : doc.at("kernels", what).as_object(what + ".kernels")) {
    std::string kwhat = what + ": kernel " + source;
    auto rec = add_kernel(desc_from(k, kwhat));
    for (const auto& v : k.at("variants", kwhat).as_array(kwhat + ".variants"))
      rec->variants.push_back(variant_from(v, rec->desc, kwhat + " variant"));
  }
}

Bundle Bundle::open(const std::string& dir) {
  auto impl = std::make_shared<Impl>();
  impl->dir = dir;
  bool found = false;
  std::string text = read_file(dir + "/manifest.json", &found);
  impl->has_manifest = found;
  if (found) impl->load(text);
  return Bundle(impl);
}

namespace {
std::string cache_root() {
  auto env = [](const char* n) -> std::string {
    const char* v = std::getenv(n);
    return v && *v ? v : "";
  };
  std::string home = env("HOME");
  std::string dir = env("LAZYTRITON_CACHE_DIR");
  if (!dir.empty()) return dir.rfind("~/", 0) == 0 ? home + dir.substr(1) : dir;
  std::string xdg = env("XDG_CACHE_HOME");
  return (xdg.empty() ? home + "/.cache" : xdg) + "/lazytriton";
}

std::mutex g_default_mu;
std::shared_ptr<Bundle> g_default;
}  // namespace

Bundle Bundle::open_cache() { return open(cache_root() + "/bundle"); }

Bundle Bundle::default_bundle() {
  std::lock_guard<std::mutex> lock(g_default_mu);
  if (!g_default) {
    const char* env = std::getenv("LAZYTRITON_BUNDLE");
    g_default = std::make_shared<Bundle>(env && *env ? open(env) : open_cache());
  }
  return *g_default;
}

void Bundle::set_default(const Bundle& bundle) {
  std::lock_guard<std::mutex> lock(g_default_mu);
  g_default = std::make_shared<Bundle>(bundle);
}

const std::string& Bundle::path() const { return impl_->dir; }

std::vector<std::string> Bundle::kernel_names() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& k : impl_->kernels) out.push_back(k->desc.source);
  return out;
}

size_t Bundle::variant_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  size_t n = 0;
  for (const auto& k : impl_->kernels) n += k->variants.size();
  return n;
}

void Bundle::set_resolver(std::shared_ptr<Resolver> resolver) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->resolver = std::move(resolver);
}

bool Bundle::lazy() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->resolver != nullptr;
}

}  // namespace lt
