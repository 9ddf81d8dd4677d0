"""Adversarial kernels for tests/test_exact_compile.py: each reads state in a
way Triton's cache key does not cover, or that a process without the caller's
state sees otherwise. Every kernel: (x, out, n, B: constexpr), fp32."""
import math

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from . import helpers

SCALE = 2


@triton.jit
def _scaled(v, s: tl.constexpr = SCALE):  # a @jit helper's default, bound at the def: 2
    return v * s


@constexpr_function
def _width(k=SCALE):  # a constexpr function's default, bound at the def: 2
    return k * 10


SCALE = 3  # rebound after the defs: Python keeps 2 in both defaults


@triton.jit
def defaults(x, out, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    v = tl.load(x + o, mask=o < n)
    tl.store(out + o, _scaled(v) + _width(), mask=o < n)


@triton.jit
def target_checks(x, out, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    v = tl.load(x + o, mask=o < n)
    if tl.target_info.cuda_capability_geq(9, 0):  # an sm_90 inline-asm path
        v = tl.inline_asm_elementwise("mul.rn.f32 $0, $1, 0f40000000;", "=r,r", [v], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        v = v + 1.0
    if tl.target_info.is_cuda():
        v = v * 3.0
    tl.store(out + o, v, mask=o < n)


@triton.jit
def _fma_shim(a, b, c):
    return a * b + c


# A compat shim of the kind kernel libraries carry: it adds to triton.language what an older
# Triton lacks; and an attribute added to a module that travels by name.
if not hasattr(tl, "lt_exact_fma"):
    tl.lt_exact_fma = _fma_shim
math.lt_exact_scale = 1.5


@triton.jit
def patched_modules(x, out, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    v = tl.load(x + o, mask=o < n)
    tl.store(out + o, tl.lt_exact_fma(v, math.lt_exact_scale, 1.0), mask=o < n)


@constexpr_function
def _factor():
    return getattr(helpers, "FACTOR", 1) * 100 + getattr(helpers, "MISSING", 7)


@triton.jit
def via_getattr(x, out, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    v = tl.load(x + o, mask=o < n)
    tl.store(out + o, v * _factor() + getattr(helpers, "FACTOR"), mask=o < n)


K = tl.constexpr(2)
DT = tl.float16


@triton.jit
def reads_globals(x, out, n, B: tl.constexpr):  # a constexpr global and a dtype global, by name
    o = tl.program_id(0) * B + tl.arange(0, B)
    v = tl.load(x + o, mask=o < n)
    tl.store(out + o, (v * K).to(DT).to(tl.float32), mask=o < n)


@triton.jit
def reads_module(x, out, n, B: tl.constexpr):  # a module attribute, and a helper reached through its module
    o = tl.program_id(0) * B + tl.arange(0, B)
    v = tl.load(x + o, mask=o < n)
    tl.store(out + o, helpers.op(v) * helpers.FACTOR, mask=o < n)


def make_closure():
    """A kernel reading a closure cell, and the setter of that cell."""
    c = tl.constexpr(1)

    @triton.jit
    def closure(x, out, n, B: tl.constexpr):
        o = tl.program_id(0) * B + tl.arange(0, B)
        v = tl.load(x + o, mask=o < n)
        tl.store(out + o, v + c, mask=o < n)

    def set_cell(value):
        nonlocal c
        c = tl.constexpr(value)

    return closure, set_cell


@triton.jit
def plain(x, out, n, B: tl.constexpr):  # for the knobs
    o = tl.program_id(0) * B + tl.arange(0, B)
    v = tl.load(x + o, mask=o < n)
    tl.store(out + o, tl.exp(v) * v + 1.0, mask=o < n)
