"""The harness's workloads, written as Triton's tutorials and TransformerEngine
write them (a module of their own: triton.jit needs the source, and lazytriton's
compile workers import kernels by name)."""
import triton
import triton.language as tl


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": 1024})], key=["n"])
@triton.jit
def add_tuned(x, y, out, n, BLOCK: tl.constexpr):
    """The vector add with BLOCK from its one config: a call with no keywords."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (2, 4, 8, 16)], key=["n_cols"])
@triton.jit
def softmax(x, y, n_rows, n_cols, stride, BLOCK: tl.constexpr):
    """Tutorial 02: one row per program, the row in one block."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    v = tl.load(x + row * stride + cols, mask=m, other=-float("inf")).to(tl.float32)
    v = tl.exp(v - tl.max(v, axis=0))
    tl.store(y + row * stride + cols, (v / tl.sum(v, axis=0)).to(y.dtype.element_ty), mask=m)


@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (2, 4, 8, 16)], key=["n_cols"])
@triton.jit
def layer_norm(x, y, w, b, n_cols, stride, eps, BLOCK: tl.constexpr):
    """Tutorial 05's forward, one row per program."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    v = tl.load(x + row * stride + cols, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(v, axis=0) / n_cols
    d = tl.where(m, v - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    out = d * rstd * tl.load(w + cols, mask=m) + tl.load(b + cols, mask=m)
    tl.store(y + row * stride + cols, out.to(y.dtype.element_ty), mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 2), (1024, 4), (4096, 8))],
                 key=["n"])
@triton.jit
def scale_inplace(x, n, alpha, BLOCK: tl.constexpr):
    """An aliased in-place update: tuning must leave x * alpha, once."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) * alpha, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((64, 1), (256, 4), (1024, 8))],
                 key=["cols"])
@triton.jit
def permute_rows(inp, dst, out, cols, BLOCK: tl.constexpr):
    """TransformerEngine-style: row r of inp goes to row dst[r] of out."""
    row = tl.program_id(0)
    to = tl.load(dst + row).to(tl.int64)
    for c in range(0, cols, BLOCK):
        offs = c + tl.arange(0, BLOCK)
        m = offs < cols
        tl.store(out + to * cols + offs, tl.load(inp + row * cols + offs, mask=m), mask=m)


@triton.jit
def add_one(x, n, out, BLOCK: tl.constexpr):
    """The 32-kernel chain's link, in jax-triton's convention (outputs last)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + 1.0, mask=m)


SOFTMAX_ROWS_CONFIGS = [triton.Config({"ROWS": r}, num_warps=w) for r in (1, 2, 4) for w in (4, 8, 16)]


@triton.autotune(configs=SOFTMAX_ROWS_CONFIGS, key=["n_rows", "n_cols"])
@triton.jit
def softmax_rows(x, y, n_rows, n_cols, stride, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Row softmax, ROWS rows per program, a row in one block: 9 configs to choose from."""
    row0 = tl.program_id(0) * ROWS
    cols = tl.arange(0, BLOCK)
    for i in range(ROWS):
        row = row0 + i
        m = (cols < n_cols) & (row < n_rows)
        v = tl.load(x + row * stride + cols, mask=m, other=-float("inf")).to(tl.float32)
        v = tl.exp(v - tl.max(v, axis=0))
        tl.store(y + row * stride + cols, (v / tl.sum(v, axis=0)).to(y.dtype.element_ty), mask=m)
