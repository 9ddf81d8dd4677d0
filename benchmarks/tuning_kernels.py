"""Kernels for benchmarks/cold_warm_start.py, in an importable module so that
lazytriton's compile workers (and Triton) can import them by name."""
import triton
import triton.language as tl

from lazytriton.demo_kernels import DEMO_CONFIGS


@triton.autotune(configs=DEMO_CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_out_last(a, b, M, N, K, sam, sak, sbk, sbn, scm, scn, c,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """The demo matmul with its output last (the triton_call convention)."""
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


SOFTMAX_CONFIGS = [triton.Config({"ROWS": r}, num_warps=w) for r in (1, 2, 4) for w in (4, 8, 16)]


@triton.autotune(configs=SOFTMAX_CONFIGS, key=["n_rows", "n_cols"])
@triton.jit
def softmax(x, y, n_rows, n_cols, stride, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Row softmax, ROWS rows per program, a row in one block."""
    row0 = tl.program_id(0) * ROWS
    cols = tl.arange(0, BLOCK)
    for i in range(ROWS):
        row = row0 + i
        m = (cols < n_cols) & (row < n_rows)
        v = tl.load(x + row * stride + cols, mask=m, other=-float("inf")).to(tl.float32)
        v = tl.exp(v - tl.max(v, axis=0))
        tl.store(y + row * stride + cols, (v / tl.sum(v, axis=0)).to(y.dtype.element_ty), mask=m)
