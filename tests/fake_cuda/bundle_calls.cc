// The C++ bundle face of the differential test (tests/fake_cuda/differential.py):
// launches, in order, every call listed in argv[2] from the bundle at argv[1],
// as a C++ program would (its own signature string and constexprs, lt::Arg
// values, a grid function of the winner's meta-parameters). Run against the
// stand-in libcuda.so.1, which records each launch. One call per line, fields
// separated by tabs:
//   source  signature  constexprs  grid  args
//   constexprs: name=n (None) | name=b:0|1 | name=i:INT | name=f:FLOAT, ';'-separated
//   grid: "X,Y,Z", or "cdiv:N" for (ceil(N / meta["BLOCK"]), 1, 1)
//   args: p:ADDR | i:INT (signed) | u:UINT | f:FLOAT | b:0|1, ','-separated
// A call the runtime refuses prints "refused <line> <message>" and the program goes on.
#include <lazytriton/bundle.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

lt::Constants constants(const std::string& field) {
  lt::Constants out;
  for (const auto& item : split(field, ';')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos) continue;
    std::string name = item.substr(0, eq), v = item.substr(eq + 1);
    if (v == "n") out.emplace_back(name, nullptr);
    else if (v.rfind("b:", 0) == 0) out.emplace_back(name, v[2] == '1');
    else if (v.rfind("i:", 0) == 0) out.emplace_back(name, int64_t(std::strtoll(v.c_str() + 2, nullptr, 10)));
    else out.emplace_back(name, std::strtod(v.c_str() + 2, nullptr));
  }
  return out;
}

lt::Arg arg(const std::string& a) {
  const char* v = a.c_str() + 2;
  switch (a[0]) {
    case 'p': return lt::Arg(lt::DevicePtr(static_cast<unsigned long long>(std::strtoull(v, nullptr, 10))));
    case 'i': return lt::Arg(int64_t(std::strtoll(v, nullptr, 10)));
    case 'u': return lt::Arg(uint64_t(std::strtoull(v, nullptr, 10)));
    case 'b': return lt::Arg(v[0] == '1');
    default: return lt::Arg(std::strtod(v, nullptr));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 1;
  lt::Bundle b = lt::Bundle::open(argv[1]);
  std::ifstream in(argv[2]);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    auto f = split(line, '\t');
    if (f.size() < 4) continue;
    std::vector<lt::Arg> args;
    if (f.size() > 4)
      for (const auto& a : split(f[4], ',')) args.push_back(arg(a));
    try {
      lt::BundleKernel k = b.kernel(f[0], f[1], constants(f[2]));
      if (f[3].rfind("cdiv:", 0) == 0) {
        int64_t total = std::strtoll(f[3].c_str() + 5, nullptr, 10);
        k.launch(nullptr, [total](const lt::Meta& m) {
          return lt::Dim3{unsigned((total + m["BLOCK"] - 1) / m["BLOCK"]), 1, 1};
        }, args.data(), args.size());
      } else {
        auto g = split(f[3], ',');
        k.launch(nullptr, lt::Dim3{unsigned(std::stoul(g[0])), unsigned(std::stoul(g[1])), unsigned(std::stoul(g[2]))},
                 args.data(), args.size());
      }
    } catch (const std::exception& e) {
      std::printf("refused %d %s\n", n, e.what());
    }
  }
  std::printf("done %d\n", n);
  return 0;
}
