// C++ bundle launches (AOT) of the kernels tests/fake_hip/launch_probe.py wrote
// into a bundle, with the same arguments as its Triton references: argv[1] is
// the bundle directory. Run against the stand-in libamdhip64.so (the winners
// are gfx942 HSACO) and, to see it refused, against the stand-in libcuda.so.1.
#include <lazytriton/bundle.h>

#include <cstdint>
#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return 1;
  try {
    const uint64_t base = 0x7F0000000000ull;
    lt::Bundle b = lt::Bundle::open(argv[1]);
    auto axpy = b.kernel("axpy_flag", "*fp32,*fp32,*fp32,i32,fp32,u1", {{"BLOCK", 256}});
    axpy.launch(nullptr, lt::Dim3{4, 1, 1}, {lt::DevicePtr(base), lt::DevicePtr(base + (1ull << 22)),
                                             lt::DevicePtr(base + (2ull << 22)), 1000, -0.75, true});
    auto pair = b.kernel("add_pair", "[*fp32,[*fp32,fp32]],*fp32,i32", {{"BLOCK", 256}});
    pair.launch(nullptr, lt::Dim3{4, 1, 1}, {lt::DevicePtr(base), lt::DevicePtr(base + (1ull << 22)), 1.5,
                                             lt::DevicePtr(base + (2ull << 22)), 1000});
  } catch (const lt::Error& e) {
    std::printf("error: %s\n", e.what());
    return 2;
  }
  std::printf("launched\n");
  return 0;
}
