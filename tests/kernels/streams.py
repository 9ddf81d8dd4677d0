"""Kernels for tests/test_gpu_torch_streams.py (PyTorch streams, CUDA graphs); its option-named
parameter kernels are the differential test's (kernels/differential_kernels.py)."""
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 512}, num_warps=8)],
                 key=["n"])
@triton.jit
def scale_add(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * 2.0 + 1.0, mask=m)
