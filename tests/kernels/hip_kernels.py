"""Kernels of the AMD (HIP) launch-bytes test (tests/fake_hip/launch_probe.py) and its
C++ bundle program: every scalar width Triton's HIP launcher packs, AMD options in configs."""
import triton
import triton.language as tl


@triton.jit
def axpy_flag(x, y, out, n, alpha, flag, BLOCK: tl.constexpr):
    # pointers, an i32 (specialized when % 16), an fp32 scalar and an i1
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    v = tl.load(x + o, mask=m) * alpha + tl.load(y + o, mask=m)
    if flag:
        v = v * 2
    tl.store(out + o, v, mask=m)


@triton.jit
def mixed_scalars(out, a, b, c, d, e, STRIDE: tl.constexpr):
    # an i64, a u64 (2**63 + 5), two fp32 and a bool beside a pointer, over a 2D grid
    pid = tl.program_id(0) + tl.program_id(1) * 3
    v = a.to(tl.float64) + b.to(tl.float64) + c + d.to(tl.float64)
    if e:
        v = -v
    tl.store(out + pid * STRIDE, v)


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=4, num_stages=2),
                          triton.Config({"BLOCK": 512, "waves_per_eu": 2}, num_warps=8, num_stages=2),
                          triton.Config({"BLOCK": 1024, "matrix_instr_nonkdim": 16, "kpack": 1}, num_warps=4)],
                 key=["n"])
@triton.jit
def tuned_scale(x, out, n, s, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(out + o, tl.load(x + o, mask=m) * s, mask=m)
