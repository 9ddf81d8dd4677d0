"""A `jax_triton` stand-in that is lazytriton.jax: puts jax-triton 0.4.0's own
tests (tests/triton_call_test.py of jax-ml/jax-triton) in front of lazytriton.
Only for that test run; see ../README.md."""
import math

from lazytriton.jax import CUSTOM_CALL_TARGET_NAME, TensorDescriptor, triton_call  # noqa: F401

from . import triton_lib  # noqa: F401

__version__ = "0.4.0+lazytriton"
__version_info__ = (0, 4, 0)


def strides_from_shape(shape):
    """Row-major strides, in elements."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
