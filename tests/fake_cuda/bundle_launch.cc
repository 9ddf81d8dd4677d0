// C++ bundle launches (AOT) of the kernels tests/fake_cuda/launch_probe.py
// wrote into a bundle, with the same arguments as its Triton references:
// argv[1] is the bundle directory. Run against the stand-in libcuda.so.1.
#include <lazytriton/bundle.h>

#include <cstdint>
#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return 1;
  try {
    const uint64_t base = 0x7F0000000000ull;
    lt::Bundle b = lt::Bundle::open(argv[1]);
    auto copy = b.kernel("tma_copy_kernel", "tensordesc<fp16[64, 64]>,*fp16", {{"M", 64}, {"N", 64}});
    lt::TensorDesc d(lt::DevicePtr(base), {256, 128}, {128, 1}, {64, 64});
    copy.launch(nullptr, lt::Dim3{1, 1, 1}, {d, lt::DevicePtr(base + (1ull << 24))});
    auto scale = b.kernel("tma_scale_store_kernel", "tensordesc<fp32[32, 64]>,tensordesc<fp32[32, 64]>,fp32",
                          {{"BM", 32}, {"BN", 64}});
    lt::TensorDesc in(lt::DevicePtr(base), {96, 128}, {192, 1}, {32, 64}, lt::TensorDesc::kNan);
    lt::TensorDesc out(lt::DevicePtr(base + (1ull << 24)), {96, 128}, {128, 1}, {32, 64});
    scale.launch(nullptr, lt::Dim3{3, 2, 1}, {in, out, 2.5});
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
