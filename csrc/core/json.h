// A small JSON reader (no dependency, no Python): bundle manifests and kernels' launch
// metadata (kernel.cc launch_meta_from_json). Private to liblazytriton.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lt::json {

struct Value {
  enum Kind : uint8_t { kNull, kBool, kInt, kUInt, kFloat, kString, kArray, kObject };
  Kind kind = kNull;
  bool b = false;
  int64_t i = 0;  // kInt
  uint64_t u = 0;  // kUInt: integers above INT64_MAX
  double f = 0;
  std::string s;
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> members;

  bool is_number() const { return kind == kInt || kind == kUInt || kind == kFloat; }
  const Value* find(std::string_view key) const;
  // Field accessors for the manifest: throw lt::Error naming `what` on a
  // missing field or a wrong type.
  const Value& at(std::string_view key, const std::string& what) const;
  int64_t as_int(const std::string& what) const;
  bool as_bool(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
  const std::vector<Value>& as_array(const std::string& what) const;
  const std::vector<std::pair<std::string, Value>>& as_object(const std::string& what) const;
};

// Throws lt::Error("<origin>: invalid JSON at byte N: ...").
Value parse(std::string_view text, const std::string& origin);

// An optional field of `obj` (absent or null: `dflt`); a wrong type throws naming what.key.
bool opt_bool(const Value& obj, const char* key, bool dflt, const std::string& what);
int64_t opt_int(const Value& obj, const char* key, int64_t dflt, const std::string& what);

}  // namespace lt::json

namespace lt {
struct LaunchMeta;
// Launch metadata from its JSON (kernel.cc): the one decoder, for Python's kernels and bundles.
LaunchMeta launch_meta_from(const json::Value& m, const std::string& what);
}  // namespace lt
