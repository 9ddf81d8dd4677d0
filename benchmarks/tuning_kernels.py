"""Kernels for benchmarks/cold_warm_start.py, in an importable module so that
lazytriton's compile workers (and Triton) can import them by name."""
import triton
import triton.language as tl

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
