"""Tests for lazytriton.model.ir_analysis: which pointer args a kernel may write.

Kernels are compiled for sm_90 on the CPU (no GPU needed) and the analysis
reads ``asm["ttir"]``.  Every case checks both the exact expected answer and
the safety property: the result is never missing a truly written argument.
"""

import importlib.util
import pathlib

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


def _load_analysis():
    """The package __init__ needs the built C++ core; this module does not.

    Fall back to loading the source file directly so these CPU-only tests run
    from an unbuilt checkout too.
    """
    try:
        from lazytriton.model.ir_analysis import written_pointer_args as fn
        return fn
    except ImportError:
        path = pathlib.Path(__file__).resolve().parents[1] / "lazytriton" / "ir_analysis.py"
        spec = importlib.util.spec_from_file_location("_lazytriton_ir_analysis", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.written_pointer_args


written_pointer_args = _load_analysis()

TARGET = GPUTarget("cuda", 90, 32)


def _compile(fn, signature, constexprs=None):
    """Compile to TTIR text; returns (ttir, runtime arg names in order)."""
    k = triton.compile(ASTSource(fn, signature, constexprs or {}), target=TARGET)
    names = [n for n, t in signature.items() if t != "constexpr"]
    return k.asm["ttir"], names


def _check(ttir, names, expected):
    got = written_pointer_args(ttir, names)
    # Safety first: a missed written argument would corrupt the caller's data.
    assert got is not None and expected <= got, (got, expected)
    assert got == expected


# --------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------

@triton.jit
def vec_add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def inc_inplace(x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) + 1, mask=m)


@triton.jit
def atomic_sum(x, out, lock, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.atomic_add(out + offs, tl.load(x + offs, mask=offs < n))
    tl.atomic_cas(lock, 0, 1)


@triton.jit
def matmul_block_ptr(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pa = tl.make_block_ptr(a, (M, K), (K, 1), (0, 0), (BM, BK), (1, 0))
    pb = tl.make_block_ptr(b, (K, N), (N, 1), (0, 0), (BK, BN), (1, 0))
    acc = tl.zeros((BM, BN), tl.float32)
    for _ in range(0, K, BK):
        acc += tl.dot(tl.load(pa, boundary_check=(0, 1)), tl.load(pb, boundary_check=(0, 1)))
        pa = tl.advance(pa, (0, BK))
        pb = tl.advance(pb, (BK, 0))
    pc = tl.make_block_ptr(c, (M, N), (N, 1), (0, 0), (BM, BN), (1, 0))
    tl.store(pc, acc, boundary_check=(0, 1))


@triton.jit
def select_dst(x, y, out, n, BLOCK: tl.constexpr, TO_OUT: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    p = tl.where(offs < n, x + offs, y + offs)   # runtime select: x or y
    tl.store(p, 1.0)
    if TO_OUT:                                   # compile-time choice
        dst = out
    else:
        dst = y
    tl.store(dst + offs, 2.0)


@triton.jit
def loop_carried(x, src, n, BLOCK: tl.constexpr):
    ptrs = x + tl.arange(0, BLOCK)
    sptrs = src + tl.arange(0, BLOCK)
    for _ in range(0, n, BLOCK):
        tl.store(ptrs, tl.load(sptrs))
        ptrs += BLOCK
        sptrs += BLOCK


@triton.jit
def scatter(idx, vals, out, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    where = tl.load(idx + offs)                  # offsets come from idx...
    tl.store(out + where, tl.load(vals + offs))  # ...but the base is out


@triton.jit
def runtime_if(x, out, flag, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + offs)
    if flag > 0:
        tl.store(out + offs, v)


@triton.jit
def device_desc(a, c, M, N, BLOCK: tl.constexpr):
    da = tl.make_tensor_descriptor(a, [M, N], [N, 1], [BLOCK, BLOCK])
    dc = tl.make_tensor_descriptor(c, [M, N], [N, 1], [BLOCK, BLOCK])
    dc.store([0, 0], da.load([0, 0]))


@triton.jit
def host_desc(a, scale, c):
    c.store([0, 0], a.load([0, 0]) * scale)


@triton.jit(noinline=True)
def _store_one(p, i):
    tl.store(p + i, 1.0)


@triton.jit
def calls_noinline(x, out, n):
    _store_one(out, n)
    _store_one(out + 1, tl.load(x).to(tl.int32))


@triton.jit
def while_swap(x, out, n):
    p = out
    q = x
    i = 0
    while i < n:          # scf.while whose carried pointers swap each trip
        tl.store(p + i, tl.load(q + i))
        p, q = q, p
        i += 1


@triton.jit
def renamed_args(a, b, n):
    # The TTIR header names argument a "%b" (the variable it was last bound
    # to) and b "%b_0": mapping by header name would miss that a is written.
    if n > 0:
        b = a
    else:
        b = a + 1
    tl.store(b, tl.load(a + 2))


@triton.jit
def pointer_from_int(addrs, vals):
    p = tl.load(addrs).to(tl.pointer_type(tl.float32))   # tt.int_to_ptr
    tl.store(p, tl.load(vals))


@triton.jit
def read_only(x, y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.device_assert(tl.sum(tl.load(x + offs) + tl.load(y + offs)) >= 0)


F32 = "*fp32"
B = {"BLOCK": 128}

# name -> (kernel, signature, constexprs, args truly written)
CASES = {
    "vec_add": (vec_add, {"x": F32, "y": F32, "out": F32, "n": "i32", "BLOCK": "constexpr"}, B,
                {"out"}),
    "inc_inplace": (inc_inplace, {"x": F32, "n": "i32", "BLOCK": "constexpr"}, B, {"x"}),
    "atomic_sum": (atomic_sum, {"x": F32, "out": F32, "lock": "*i32", "n": "i32",
                                "BLOCK": "constexpr"}, B, {"out", "lock"}),
    "select_to_out": (select_dst, {"x": F32, "y": F32, "out": F32, "n": "i32", "BLOCK": "constexpr",
                                   "TO_OUT": "constexpr"}, {"BLOCK": 128, "TO_OUT": True},
                      {"x", "y", "out"}),
    "select_to_y": (select_dst, {"x": F32, "y": F32, "out": F32, "n": "i32", "BLOCK": "constexpr",
                                 "TO_OUT": "constexpr"}, {"BLOCK": 128, "TO_OUT": False}, {"x", "y"}),
    "loop_carried": (loop_carried, {"x": F32, "src": F32, "n": "i32", "BLOCK": "constexpr"}, B, {"x"}),
    "scatter": (scatter, {"idx": "*i32", "vals": F32, "out": F32, "BLOCK": "constexpr"}, B, {"out"}),
    "runtime_if": (runtime_if, {"x": F32, "out": F32, "flag": "i32", "BLOCK": "constexpr"}, B, {"out"}),
    "host_desc": (host_desc, {"a": "tensordesc<fp32[32, 32]>", "scale": "fp32",
                              "c": "tensordesc<fp32[32, 32]>"}, {}, {"c"}),
    "calls_noinline": (calls_noinline, {"x": F32, "out": F32, "n": "i32"}, {}, {"out"}),
    "while_swap": (while_swap, {"x": F32, "out": F32, "n": "i32"}, {}, {"x", "out"}),
    "renamed_args": (renamed_args, {"a": F32, "b": F32, "n": "i32"}, {}, {"a"}),
    "read_only": (read_only, {"x": F32, "y": F32, "n": "i32", "BLOCK": "constexpr"}, B, set()),
}


@pytest.fixture(scope="module")
def compiled():
    """Compile each case once; the negative tests reuse the text."""
    return {name: _compile(fn, sig, const) for name, (fn, sig, const, _) in CASES.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_kernels(compiled, name):
    ttir, names = compiled[name]
    _check(ttir, names, CASES[name][3])


def test_matmul_block_ptr():
    sig = {"a": "*fp16", "b": "*fp16", "c": F32, "M": "i32", "N": "i32", "K": "i32",
           "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
    try:
        ttir, names = _compile(matmul_block_ptr, sig, {"BM": 32, "BN": 32, "BK": 32})
    except Exception as e:  # Triton >= 3.9 removed tl.make_block_ptr
        pytest.skip(f"block pointers unsupported: {type(e).__name__}")
    _check(ttir, names, {"c"})


def test_device_tensor_descriptor():
    sig = {"a": F32, "c": F32, "M": "i32", "N": "i32", "BLOCK": "constexpr"}
    try:
        ttir, names = _compile(device_desc, sig, {"BLOCK": 32})
    except Exception as e:
        pytest.skip(f"tl.make_tensor_descriptor unsupported: {type(e).__name__}")
    assert "tt.make_tensor_descriptor" in ttir
    _check(ttir, names, {"c"})


def test_pointer_from_int_is_unknown():
    ttir, names = _compile(pointer_from_int, {"addrs": "*i64", "vals": F32})
    assert written_pointer_args(ttir, names) is None


def test_arg_names_mismatch_is_unknown(compiled):
    ttir, names = compiled["vec_add"]
    assert written_pointer_args(ttir, names[:-1]) is None
    assert written_pointer_args(ttir, names + ["extra"]) is None


def test_truncated_and_mangled_ttir(compiled):
    ttir, names = compiled["loop_carried"]
    lines = ttir.splitlines()
    for cut in range(1, len(lines)):   # any prefix: unknown or still safe
        got = written_pointer_args("\n".join(lines[:cut]), names)
        assert got is None or "x" in got
    assert written_pointer_args(ttir.replace("loc(", "loc(("), names) is None


@pytest.mark.parametrize("junk", [
    "", "garbage", "module {", "}", "%0 = ", "tt.store %p", "\x00\xff{{{", "{-# x", "é" * 50,
    None, 123, b"module {}",
])
def test_garbage_returns_none(junk):
    assert written_pointer_args(junk, ["x"]) is None


# --------------------------------------------------------------------------
# Hand-written TTIR: positional %argN names and ops current Triton no longer
# emits at TTIR level (block pointers survive in older pipelines).
# --------------------------------------------------------------------------

MM_ARGN = """\
#loc = loc("/tmp/k.py":1:0)
module {
  tt.func public @mm(%arg0: !tt.ptr<f16> {tt.divisibility = 16 : i32} loc("/tmp/k.py":1:0), %arg1: !tt.ptr<f16> loc(#loc), %arg2: !tt.ptr<f32> loc(#loc), %arg3: i32 loc(#loc)) attributes {noinline = false} {
    %c0_i32 = arith.constant 0 : i32 loc(#loc)
    %c1_i64 = arith.constant 1 : i64 loc(#loc)
    %c32_i32 = arith.constant 32 : i32 loc(#loc)
    %cst = arith.constant dense<0.000000e+00> : tensor<32x32xf32> loc(#loc)
    %0 = arith.extsi %arg3 : i32 to i64 loc(#loc)
    %1 = tt.make_tensor_ptr %arg0, [%0, %0], [%0, %c1_i64], [%c0_i32, %c0_i32] {order = array<i32: 1, 0>} : <tensor<32x32xf16>> loc(#loc)
    %2 = tt.make_tensor_ptr %arg1, [%0, %0], [%0, %c1_i64], [%c0_i32, %c0_i32] {order = array<i32: 1, 0>} : <tensor<32x32xf16>> loc(#loc)
    %3:3 = scf.for %arg4 = %c0_i32 to %arg3 step %c32_i32 iter_args(%arg5 = %cst, %arg6 = %1, %arg7 = %2) -> (tensor<32x32xf32>, !tt.ptr<tensor<32x32xf16>>, !tt.ptr<tensor<32x32xf16>>)  : i32 {
      %5 = tt.load %arg6 {boundaryCheck = array<i32: 0, 1>} : !tt.ptr<tensor<32x32xf16>> loc(#loc)
      %6 = tt.load %arg7 {boundaryCheck = array<i32: 0, 1>} : !tt.ptr<tensor<32x32xf16>> loc(#loc)
      %7 = tt.dot %5, %6, %arg5 : tensor<32x32xf16> * tensor<32x32xf16> -> tensor<32x32xf32> loc(#loc)
      %8 = tt.advance %arg6, [%c0_i32, %c32_i32] : <tensor<32x32xf16>> loc(#loc)
      %9 = tt.advance %arg7, [%c32_i32, %c0_i32] : <tensor<32x32xf16>> loc(#loc)
      scf.yield %7, %8, %9 : tensor<32x32xf32>, !tt.ptr<tensor<32x32xf16>>, !tt.ptr<tensor<32x32xf16>> loc(#loc)
    } loc(#loc)
    %4 = tt.make_tensor_ptr %arg2, [%0, %0], [%0, %c1_i64], [%c0_i32, %c0_i32] {order = array<i32: 1, 0>} : <tensor<32x32xf32>> loc(#loc)
    tt.store %4, %3#0 {boundaryCheck = array<i32: 0, 1>} : !tt.ptr<tensor<32x32xf32>> loc(#loc)
    tt.return loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc1 = loc("/tmp/k.py":2:0)
"""
MM_NAMES = ["A", "B", "C", "K"]


def test_handwritten_argN_block_ptr_loop():
    _check(MM_ARGN, MM_NAMES, {"C"})


def test_handwritten_store_through_loop_result():
    # %3#1 is the loop-carried block pointer into A: result -> init + yield.
    _check(MM_ARGN.replace("tt.store %4, %3#0", "tt.store %3#1, %3#0"), MM_NAMES, {"A"})


def test_handwritten_store_through_unknown_value():
    # A pointer that is not traceable to an argument (undefined here) -> unknown.
    assert written_pointer_args(MM_ARGN.replace("tt.store %4,", "tt.store %99,"), MM_NAMES) is None


CFG_TTIR = """\
module {
  tt.func public @k(%arg0: !tt.ptr<f32>, %arg1: !tt.ptr<f32>, %arg2: i1) {
    %cst = arith.constant 1.0 : f32
    cf.cond_br %arg2, ^bb1(%arg0 : !tt.ptr<f32>), ^bb2
  ^bb1(%p: !tt.ptr<f32>):
    tt.store %p, %cst : !tt.ptr<f32>
    cf.br ^bb2
  ^bb2:
    %v = tt.load %arg1 : !tt.ptr<f32>
    tt.return
  }
}
"""


def test_handwritten_cf_block_args():
    _check(CFG_TTIR, ["x", "y", "flag"], {"x"})


def test_unknown_op_with_pointer_is_conservative():
    # An op we do not know that receives a traceable pointer counts as a write.
    mystery = CFG_TTIR.replace("%v = tt.load %arg1 : !tt.ptr<f32>",
                               '"tt.mystery"(%arg1) : (!tt.ptr<f32>) -> ()')
    _check(mystery, ["x", "y", "flag"], {"x", "y"})
    # ...and one whose pointer operand cannot be traced makes the answer unknown.
    opaque = mystery.replace('"tt.mystery"(%arg1)', '%q = tt.int_to_ptr %cst : f32 -> !tt.ptr<f32>\n'
                             '    "tt.mystery"(%q)')
    assert written_pointer_args(opaque, ["x", "y", "flag"]) is None


def test_inline_asm_with_pointer_operand():
    asm = CFG_TTIR.replace(
        "%v = tt.load %arg1 : !tt.ptr<f32>",
        '%v = tt.elementwise_inline_asm "st.global.f32 [$1], 0f0; // %r1 {" '
        '{constraints = "=r,l", packed_element = 1 : i32, pure = false} %arg1 : !tt.ptr<f32> -> i32')
    _check(asm, ["x", "y", "flag"], {"x", "y"})


def test_generic_op_form():
    # MLIR's generic printer quotes op names and lists all operand types.
    generic = CFG_TTIR.replace(
        "tt.store %p, %cst : !tt.ptr<f32>",
        '"tt.store"(%p, %cst) <{cache = 1 : i32, evict = 1 : i32}> : (!tt.ptr<f32>, f32) -> ()')
    assert '"tt.store"' in generic
    _check(generic, ["x", "y", "flag"], {"x"})
