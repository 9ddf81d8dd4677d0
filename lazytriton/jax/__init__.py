"""JAX: `triton_call`, compatible with jax-triton's, as an XLA FFI custom call.

Tracing and lowering compile nothing: the call site becomes a custom call
whose attributes describe it completely (kernel identity, arguments, scalars,
meta-parameters, every candidate config with its grid and zeroed outputs,
aliases). The handler (lazytriton/jax/ffi.py, csrc/jax/ffi_handler.cc) is
command-buffer compatible: the first execution that is not being captured
compiles and tunes on the real buffers, every later one launches from C++.

    out = lazytriton.jax.triton_call(x, y, kernel=add_kernel, out_type=x,
                                     grid=lambda meta: (triton.cdiv(n, meta["BLOCK"]),), n=n)

The API is jax-triton 0.4's (Refs, aliases without a declared output,
out_type=, backend_options=, has_side_effect=, cost_estimate=). vmap runs the
call sequentially over the batch; autodiff raises NotImplementedError (wrap
the call in jax.custom_vjp with a backward kernel). A function holding calls
exports with jax.export (disabled_checks=[DisabledSafetyCheck.custom_call(
CUSTOM_CALL_TARGET_NAME)]); call register() in the process that runs it.
"""
from __future__ import annotations

from . import ffi as jax_ffi
from .call import register, triton_call
from .primitive import triton_call_p
from .types import TensorDescriptor

__all__ = ["triton_call", "TensorDescriptor", "handler_stats", "register", "CUSTOM_CALL_TARGET_NAME",
           "triton_call_p"]

handler_stats = jax_ffi.handler_stats
jax_ffi.prepare_in_background()

# The XLA custom-call target every lazytriton call lowers to: name it in
# jax.export.export(..., disabled_checks=[DisabledSafetyCheck.custom_call(CUSTOM_CALL_TARGET_NAME)]).
CUSTOM_CALL_TARGET_NAME: str = jax_ffi.TARGET
