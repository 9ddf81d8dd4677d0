#include "json.h"

#include <cerrno>
#include <cstdlib>

#include "lazytriton/driver.h"

namespace lt::json {
namespace {

constexpr int kMaxDepth = 64;  // manifests are shallow; deeper input is rejected, not recursed into

class Parser {
 public:
  Parser(std::string_view text, const std::string& origin) : t_(text), origin_(origin) {}

  Value document() {
    Value v = value(0);
    skip_ws();
    if (pos_ != t_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(origin_ + ": invalid JSON at byte " + std::to_string(pos_) + ": " + why);
  }
  void skip_ws() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\n' || t_[pos_] == '\r' || t_[pos_] == '\t')) ++pos_;
  }
  char peek() {
    skip_ws();
    if (pos_ >= t_.size()) fail("unexpected end");
    return t_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool literal(std::string_view word) {
    if (t_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    char c = peek();
    Value v;
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      v.kind = Value::kString;
      v.s = string();
    } else if (literal("true")) {
      v.kind = Value::kBool;
      v.b = true;
    } else if (literal("false")) {
      v.kind = Value::kBool;
    } else if (literal("null")) {
      v.kind = Value::kNull;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v = number();
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  Value object(int depth) {
    Value v;
    v.kind = Value::kObject;
    expect('{');
    if (peek() == '}') return ++pos_, v;
    while (true) {
      if (peek() != '"') fail("expected a string key");
      std::string key = string();
      expect(':');
      v.members.emplace_back(std::move(key), value(depth + 1));
      if (peek() == '}') return ++pos_, v;
      expect(',');
    }
  }

  Value array(int depth) {
    Value v;
    v.kind = Value::kArray;
    expect('[');
    if (peek() == ']') return ++pos_, v;
    while (true) {
      v.items.push_back(value(depth + 1));
      if (peek() == ']') return ++pos_, v;
      expect(',');
    }
  }

  static bool number_char(char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
  }

  Value number() {
    size_t start = pos_;
    if (t_[pos_] == '-') ++pos_;
    bool is_float = false;
    while (pos_ < t_.size() && number_char(t_[pos_])) {
      is_float |= t_[pos_] == '.' || t_[pos_] == 'e' || t_[pos_] == 'E';
      ++pos_;
    }
    std::string text(t_.substr(start, pos_ - start));
    Value v;
    char* end = nullptr;
    errno = 0;
    if (is_float) {
      v.kind = Value::kFloat;
      v.f = std::strtod(text.c_str(), &end);
    } else if (text[0] == '-') {
      v.kind = Value::kInt;
      v.i = std::strtoll(text.c_str(), &end, 10);
    } else {
      unsigned long long u = std::strtoull(text.c_str(), &end, 10);
      v.kind = u > uint64_t(INT64_MAX) ? Value::kUInt : Value::kInt;
      v.u = u;
      v.i = int64_t(u);
    }
    if (errno == ERANGE || end != text.c_str() + text.size()) fail("bad number '" + text + "'");
    return v;
  }

  static void utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > t_.size()) fail("short \\u escape");
    uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      char h = t_[pos_++];
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("bad \\u escape");
      cp = cp * 16 + uint32_t(d);
    }
    return cp;
  }

  void escape(std::string& out) {
    if (pos_ >= t_.size()) fail("unterminated string");
    char e = t_[pos_++];
    switch (e) {
      case '"': case '\\': case '/': out += e; return;
      case 'b': out += '\b'; return;
      case 'f': out += '\f'; return;
      case 'n': out += '\n'; return;
      case 'r': out += '\r'; return;
      case 't': out += '\t'; return;
      case 'u': break;
      default: fail("bad escape");
    }
    uint32_t cp = hex4();
    if (cp >= 0xd800 && cp < 0xdc00 && t_.substr(pos_, 2) == "\\u") {  // surrogate pair
      pos_ += 2;
      uint32_t lo = hex4();
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    utf8(cp, out);
  }

  std::string string() {
    ++pos_;  // the opening quote
    std::string out;
    while (true) {
      if (pos_ >= t_.size()) fail("unterminated string");
      char c = t_[pos_++];
      if (c == '"') return out;
      if (c == '\\')
        escape(out);
      else
        out += c;
    }
  }

  std::string_view t_;
  const std::string& origin_;
  size_t pos_ = 0;
};

const char* kind_name(Value::Kind k) {
  static const char* names[] = {"null", "a bool", "an integer", "an integer", "a number", "a string", "an array", "an object"};
  return names[k];
}

[[noreturn]] void wrong(const std::string& what, const char* want, Value::Kind got) {
  throw Error(what + ": expected " + want + ", found " + kind_name(got));
}

}  // namespace

const Value* Value::find(std::string_view key) const {
  for (const auto& m : members)
    if (m.first == key) return &m.second;
  return nullptr;
}

const Value& Value::at(std::string_view key, const std::string& what) const {
  if (kind != kObject) wrong(what, "an object", kind);
  const Value* v = find(key);
  if (!v) throw Error(what + ": missing field '" + std::string(key) + "'");
  return *v;
}

int64_t Value::as_int(const std::string& what) const {
  if (kind != kInt) wrong(what, "an integer", kind);
  return i;
}

bool Value::as_bool(const std::string& what) const {
  if (kind != kBool) wrong(what, "a bool", kind);
  return b;
}

const std::string& Value::as_string(const std::string& what) const {
  if (kind != kString) wrong(what, "a string", kind);
  return s;
}

const std::vector<Value>& Value::as_array(const std::string& what) const {
  if (kind != kArray) wrong(what, "an array", kind);
  return items;
}

const std::vector<std::pair<std::string, Value>>& Value::as_object(const std::string& what) const {
  if (kind != kObject) wrong(what, "an object", kind);
  return members;
}

Value parse(std::string_view text, const std::string& origin) { return Parser(text, origin).document(); }

bool opt_bool(const Value& obj, const char* key, bool dflt, const std::string& what) {
  const Value* v = obj.find(key);
  return v && v->kind != Value::kNull ? v->as_bool(what + "." + key) : dflt;
}

int64_t opt_int(const Value& obj, const char* key, int64_t dflt, const std::string& what) {
  const Value* v = obj.find(key);
  return v && v->kind != Value::kNull ? v->as_int(what + "." + key) : dflt;
}

}  // namespace lt::json
