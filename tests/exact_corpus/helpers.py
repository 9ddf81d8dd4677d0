"""A user module the kernels of exact_corpus.kernels read through attributes
(tests/test_exact_compile.py changes them after a first compile)."""
import triton
import triton.language as tl

FACTOR = tl.constexpr(3)


@triton.jit
def op_a(v):
    return v + 1.0


@triton.jit
def op_b(v):
    return v * v


op = op_a  # replaced on the module by the test
