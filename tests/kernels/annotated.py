"""Kernels with annotated scalar parameters (Triton packs each value as its
annotated type, whatever the Python value's type)."""
import triton
import triton.language as tl


@triton.jit
def store_scalars(out, out64, h: tl.float16, b: tl.bfloat16, f: tl.float32, d: tl.float64, n: tl.int64):
    # Each scalar as the kernel received it, widened exactly: the launcher's packing made visible.
    tl.store(out, h.to(tl.float32))
    tl.store(out + 1, b.to(tl.float32))
    tl.store(out + 2, f)
    tl.store(out64, d)
    tl.store(out64 + 1, n.to(tl.float64))


@triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["alpha"])
@triton.jit
def scale_fp16_kernel(x, out, alpha: tl.float16, n, BLOCK: tl.constexpr):
    # alpha is in the autotune key: the winner is chosen by its value.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * alpha.to(tl.float32), mask=m)


@triton.jit(do_not_specialize=["nospec"], do_not_specialize_on_alignment=["noalign", "noalign_i64"])
def scalar_probe(plain, nospec, noalign, i64: tl.int64, noalign_i64: tl.int64, u8: tl.uint8, b1: tl.int1,
                 h: tl.float16, bf: tl.bfloat16, f: tl.float32, d: tl.float64):
    pass  # only bound (specialized), never compiled
