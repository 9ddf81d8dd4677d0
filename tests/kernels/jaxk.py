"""Kernels in jax-triton's calling convention: inputs, then one pointer per output
(jax-triton 0.4: an input aliased to an output has no output pointer; the kernel writes the input)."""
import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, n, out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def add_one_kernel(x, n, out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + 1.0, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 512, 2048) for w in (2, 4)],
                 key=["n"])
@triton.jit
def inc_inplace_kernel(x, n, BLOCK: tl.constexpr):
    # `x` is updated in place (aliased to the output): tuning runs it many times, the result must be x + 1.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) + 1, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (128, 1024)], key=["n"])
@triton.jit
def inc_even_kernel(x, n, BLOCK: tl.constexpr):
    # Writes only the even elements of `x` (aliased to the output): the odd ones
    # must keep x's values.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = (offs < n) & (offs % 2 == 0)
    tl.store(x + offs, tl.load(x + offs, mask=m) + 1, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (128, 1024)], key=["n"])
@triton.jit
def sum_diff_kernel(x, y, n, s, d, BLOCK: tl.constexpr):
    # Two fresh outputs: s = x + y, d = x - y.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(x + offs, mask=m)
    b = tl.load(y + offs, mask=m)
    tl.store(d + offs, a - b, mask=m)
    tl.store(s + offs, a + b, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (128, 1024)], key=["n"])
@triton.jit
def sum_diff_inplace_kernel(x, y, n, d, BLOCK: tl.constexpr):
    # `x` accumulates x + y in place (aliased to output 0), `d` is a fresh output.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(x + offs, mask=m)
    b = tl.load(y + offs, mask=m)
    tl.store(d + offs, a - b, mask=m)
    tl.store(x + offs, a + b, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (64, 256, 1024)], key=["n"])
@triton.jit
def total_kernel(x, n, total, BLOCK: tl.constexpr):
    # Atomic accumulation: correct only if `total` is zeroed before every launch.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(total, tl.sum(tl.load(x + offs, mask=offs < n, other=0.0), axis=0))


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (128, 1024)], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def axpb_kernel(x, a, b, flag, n, out, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m) * a + b
    if flag:
        v = -v
    if EVEN:
        tl.store(out + offs, v)
    else:
        tl.store(out + offs, v, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 512, 1024) for w in (2, 4)],
                 key=["n"])
@triton.jit
def scatter_kernel(src, idx, n, dst, BLOCK: tl.constexpr):
    # dst[idx[i]] = src[i]: an index map that is garbage (not yet produced)
    # sends the stores out of bounds.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    i = tl.load(idx + offs, mask=m, other=0)
    tl.store(dst + i, tl.load(src + offs, mask=m), mask=m)


def _mm_configs():
    out = []
    for bm, bn, bk, w, s in [(128, 128, 32, 4, 3), (128, 128, 64, 8, 3), (64, 128, 32, 4, 4), (128, 64, 32, 4, 4),
                             (64, 64, 32, 4, 4), (128, 256, 64, 8, 3), (64, 256, 32, 4, 4), (256, 128, 64, 8, 3)]:
        out.append(triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s))
    return out


@triton.autotune(configs=_mm_configs(), key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a, b, M, N, K, sam, sak, sbk, sbn, scm, scn, c,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kk = k * BK + rk
        av = tl.load(a + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        bv = tl.load(b + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(av, bv)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def bad_kernel(x, n, out, BLOCK: tl.constexpr):
    # Does not compile: an unknown name.
    tl.store(out + tl.arange(0, BLOCK), undefined_name)  # noqa: F821
