"""Kernels with tuple arguments (issue 10), for the CPU and GPU tests (triton.jit needs source)."""
import triton
import triton.language as tl


@triton.jit
def add_pair(xs, out, n, BLOCK: tl.constexpr):
    # xs = (x, (y, scale)): out = x + y * scale
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(xs[0] + offs, mask=m) + tl.load(xs[1][0] + offs, mask=m) * xs[1][1], mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 512, 1024) for w in (2, 4)],
                 key=["dims"])
@triton.jit
def nested_axpy(ptrs, dims, BLOCK: tl.constexpr):
    # ptrs = (x, (y, out)), dims = (n, (alpha, flag)):
    # out = alpha * x + y (flag) or alpha * x (not flag); y is then overwritten with x
    # (so tuning must restore a buffer that is a tuple element).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < dims[0]
    x = tl.load(ptrs[0] + offs, mask=m)
    y = tl.load(ptrs[1][0] + offs, mask=m)
    r = dims[1][0] * x
    if dims[1][1]:
        r = r + y
    tl.store(ptrs[1][1] + offs, r, mask=m)
    tl.store(ptrs[1][0] + offs, x, mask=m)
