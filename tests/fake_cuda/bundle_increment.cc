// The C++ (AOT) reader of the bundle tests/test_broken_state.py writes and
// breaks: launches increment_kernel from it against the stand-in libcuda.so.1.
// argv[1] is the bundle directory. Prints "launched" or the lt::Error.
#include <lazytriton/bundle.h>

#include <cstdint>
#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return 1;
  try {
    lt::Bundle b = lt::Bundle::open(argv[1]);
    auto k = b.kernel("increment_kernel", "*fp32,i32", {});
    const int n = 1 << 20;
    k.launch(nullptr, [&](const lt::Meta& m) { return lt::Dim3{unsigned((n + m["BLOCK"] - 1) / m["BLOCK"])}; },
             {lt::DevicePtr(0x7F0000000000ull), n});
  } catch (const lt::Error& e) {
    std::printf("error: %s\n", e.what());
    return 2;
  }
  std::printf("launched\n");
  return 0;
}
