"""What jax-triton's tests read from jax_triton.triton_lib: the primitive
(to find the call's equation in a jaxpr). Its compile-cache internals
(TritonFunction, compile_ttir_inplace) have no lazytriton counterpart."""
from lazytriton.jax import CUSTOM_CALL_TARGET_NAME, TensorDescriptor, triton_call  # noqa: F401
from lazytriton.jax import triton_call_p as triton_kernel_call_p  # noqa: F401
