"""The Triton kernels the C++ example launches (named example_kernels:<function>)."""
import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024) for w in (2, 4)],
                 key=["n"])
@triton.jit
def scale_kernel(x, out, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * alpha, mask=m)
