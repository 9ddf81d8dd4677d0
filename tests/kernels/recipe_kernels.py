"""Kernels whose front end the compile server's workers run from a portable
recipe (lazytriton.compile.recipe), and two it cannot carry
(tests/test_compile_recipe.py)."""
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import recipe_helpers as ops  # a user module read as a namespace: ops.twice_scaled
from .recipe_helpers import not_inlined, pow2_at_least, scaled

HAS_TAIL = tl.constexpr(True)
ACC = tl.float32  # a dtype global (Triton allows those)
LIMIT = tl.constexpr(0.5)


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 256}, num_warps=4)],
                 key=["n"])
@triton.jit
def helpers(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    v = tl.load(x + o, mask=m).to(ACC)
    v = ops.twice_scaled(v, FLIP=True) + scaled(v)
    v = libdevice.exp(v) + libdevice.tanh(v)
    if HAS_TAIL:
        v = tl.minimum(v, LIMIT)
    v = v + not_inlined(tl.load(x).to(ACC))  # noinline takes scalars
    tl.store(y + o, v, mask=m)


@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["y"])
def unspecialized(x, y, n, stride, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, pow2_at_least(BLOCK))
    tl.store(y + o * stride, tl.load(x + o, mask=o < n) * 2, mask=o < n)


def _rowwise(op):
    @triton.jit
    def body(x, n, y, BLOCK: tl.constexpr):  # a closure: op is a cell
        o = tl.arange(0, BLOCK)
        v = tl.load(x + tl.program_id(0) * n + o, mask=o < n, other=0.0)
        tl.store(y + tl.program_id(0) * n + o, op(v), mask=o < n)
    return body


@triton.jit
def _square(v):
    return v * v


rowwise_square = _rowwise(_square)


@triton.jit
def refuses_large_blocks(x, n, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK <= 128, "BLOCK too large for this kernel")
    o = tl.arange(0, BLOCK)
    tl.store(x + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)


# What a recipe cannot carry: a constexpr holding a Python function (Triton hashes its address),
# and a repr hook (a user function that names the kernel).
def _py_twice(v):
    return v * 2


TWICE = tl.constexpr(_py_twice)


@triton.jit
def reads_a_python_function(x, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    v = tl.load(x + o, mask=o < n)
    if TWICE is not None:
        v = v * 2
    tl.store(x + o, v, mask=o < n)


@triton.jit(repr=lambda specialization: "renamed_kernel")
def with_repr_hook(x, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(x + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)


@triton.jit
def fp32_dot(a, b, c, BLOCK: tl.constexpr):  # its input precision follows triton.knobs.language.fp32_default
    o = tl.arange(0, BLOCK)
    x = tl.load(a + o[:, None] * BLOCK + o[None, :])
    y = tl.load(b + o[:, None] * BLOCK + o[None, :])
    tl.store(c + o[:, None] * BLOCK + o[None, :], tl.dot(x, y))
