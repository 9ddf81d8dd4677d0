// Parsing Triton's type spellings (bundle_signature.h).
#include "bundle_signature.h"

#include <sstream>

#include "lazytriton/bundle.h"

namespace lt::sigtypes {

bool parse_desc_type(const std::string& t, int* dtype, int* rank, int64_t* block, std::string* canonical) {
  const std::string head = "tensordesc<";
  if (t.rfind(head, 0) != 0 || t.back() != '>') return false;
  size_t open = t.find('[', head.size()), close = t.find(']', open);
  if (open == std::string::npos || close == std::string::npos || close + 2 != t.size()) return false;
  std::string name = t.substr(head.size(), open - head.size());
  *dtype = dtype_from_name(name);
  if (*dtype == kNoDtype) return false;
  *rank = 0;
  std::stringstream ss(t.substr(open + 1, close - open - 1));
  for (std::string d; std::getline(ss, d, ',');) {
    d.erase(0, d.find_first_not_of(" \t"));
    d.erase(d.find_last_not_of(" \t") + 1);
    if (d.empty() || d.find_first_not_of("0123456789") != std::string::npos || *rank == kMaxDescRank) return false;
    block[(*rank)++] = std::stoll(d);
  }
  if (*rank < 1) return false;
  *canonical = head + name + "[";
  for (int i = 0; i < *rank; ++i) *canonical += (i ? ", " : "") + std::to_string(block[i]);
  *canonical += "]>";
  return true;
}

std::vector<std::string> split_top(std::string_view sig, const std::string& what) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  auto flush = [&] {
    size_t b = cur.find_first_not_of(" \t"), e = cur.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? std::string() : cur.substr(b, e - b + 1));
    cur.clear();
  };
  for (char ch : sig) {
    depth += ch == '[';
    depth -= ch == ']';
    if (depth < 0) throw Error(what + ": unbalanced ']' in '" + std::string(sig) + "'");
    if (ch == ',' && depth == 0) flush();
    else cur += ch;
  }
  if (depth) throw Error(what + ": unbalanced '[' in '" + std::string(sig) + "'");
  flush();
  if (out.size() == 1 && out[0].empty()) out.clear();
  return out;
}

void tuple_leaves(const std::string& t, const std::string& path, std::vector<std::pair<std::string, std::string>>& leaves,
                  std::string& structure, const std::string& what) {
  if (t.size() < 2 || t.front() != '[' || t.back() != ']') throw Error(what + ": bad tuple type '" + t + "'");
  structure += '[';
  std::vector<std::string> items = split_top(std::string_view(t).substr(1, t.size() - 2), what);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) structure += ',';
    std::string p = path + "[" + std::to_string(i) + "]";
    if (items[i].empty()) throw Error(what + ": empty element in tuple type '" + t + "'");
    if (items[i][0] == '[') {
      tuple_leaves(items[i], p, leaves, structure, what);
    } else {
      leaves.emplace_back(p, items[i]);
      structure += '_';
    }
  }
  structure += ']';
}

}  // namespace lt::sigtypes
