"""Triton kernels the tests run (kept in a module: triton.jit needs source)."""
import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 512, 2048) for w in (2, 4)],
                 key=["n"])
@triton.jit
def increment_kernel(x, n, BLOCK: tl.constexpr):
    # In place: tuning runs it many times; the caller must still see x + 1.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) + 1, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (64, 256, 1024)], key=["n"], reset_to_zero=["total"])
@triton.jit
def sum_kernel(x, total, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n, other=0.0)
    tl.atomic_add(total, tl.sum(v, axis=0))


def _mm_configs():
    out = []
    for bm, bn, bk, w, s in [(128, 128, 32, 4, 3), (128, 128, 64, 8, 3), (64, 128, 32, 4, 4), (128, 64, 32, 4, 4),
                             (64, 64, 32, 4, 4), (128, 256, 64, 8, 3), (64, 256, 32, 4, 4), (256, 128, 64, 8, 3)]:
        out.append(triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s))
    return out


@triton.autotune(configs=_mm_configs(), key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
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
def big_shared_kernel(x, out, n, BLOCK: tl.constexpr):
    # A dot of BLOCKxBLOCK fp32 tiles with pipelining needs well over 48 KiB.
    r = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in range(0, n, BLOCK):
        a = tl.load(x + r[:, None] * n + (k + r)[None, :])
        b = tl.load(x + (k + r)[:, None] * n + r[None, :])
        acc += tl.dot(a, b)
    tl.store(out + r[:, None] * BLOCK + r[None, :], acc)


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (128, 1024)], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def scale_kernel(x, out, alpha, n, BLOCK: tl.constexpr, EVEN: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out + offs, tl.load(x + offs) * alpha)
    else:
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) * alpha, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": 1024})], key=[])
@triton.jit
def add_tuned_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)
