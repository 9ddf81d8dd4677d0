"""@jit helpers the kernels of recipe_kernels.py call from another module
(tests/test_compile_recipe.py). String annotations: this module's future flag
must reach the worker's rebuild too."""
from __future__ import annotations

import triton
import triton.language as tl

SCALE = tl.constexpr(3)


@triton.jit
def scaled(x):
    return x * SCALE


@triton.jit
def twice_scaled(x, FLIP: tl.constexpr = False):  # a callee of a callee, with its own global
    y = scaled(x) * 2
    if FLIP:
        y = -y
    return y


@triton.jit(noinline=True)
def not_inlined(x):
    return x + 1.0


@triton.constexpr_function
def pow2_at_least(n):
    return 1 << (n - 1).bit_length()
