// A small JSON reader for bundle manifests (no dependency, no Python).
// Private to liblazytriton.
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

}  // namespace lt::json
