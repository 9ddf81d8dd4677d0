"""Kernels whose autotune configs differ in which buffers they write (tests of
tuning that starts while candidates still compile)."""
import triton
import triton.language as tl

# SIDE=1 configs also accumulate into `side`: a buffer that the SIDE=0 configs
# never write, so a snapshot taken from them alone would not cover it.
SIDE_CONFIGS = [triton.Config({"B": 1024, "SIDE": 0}, num_warps=4), triton.Config({"B": 256, "SIDE": 0}, num_warps=2),
                triton.Config({"B": 512, "SIDE": 1}, num_warps=4), triton.Config({"B": 128, "SIDE": 1}, num_warps=1)]


@triton.autotune(configs=SIDE_CONFIGS, key=["n"])
@triton.jit
def accumulate_side(x, out, side, n, B: tl.constexpr, SIDE: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    m = o < n
    v = tl.load(x + o, mask=m)
    tl.store(out + o, tl.load(out + o, mask=m) + v, mask=m)  # accumulates: a missed restore shows
    if SIDE:
        tl.store(side + o, tl.load(side + o, mask=m) + 1.0, mask=m)
