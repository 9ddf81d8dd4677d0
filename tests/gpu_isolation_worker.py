"""One process of tests/test_gpu_isolation.py: the first call of one kernel of
tests/kernels/isolation.py on fresh random data with a poisoned output, through one
face, then the process's next CUDA work; prints one JSON line.

    python gpu_isolation_worker.py FACE KERNEL N      FACE: cupy, torch or jax

The environment says the rest (LAZYTRITON_CACHE_DIR, LAZYTRITON_ISOLATION_TIMEOUT,
XLA_PYTHON_CLIENT_ALLOCATOR)."""
import faulthandler
import json
import os
import sys
import time

faulthandler.dump_traceback_later(240, exit=True)  # a hang shows where
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import triton  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton.runtime import isolation  # noqa: E402
from kernels import isolation as kernels  # noqa: E402

face, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
kern = getattr(kernels, name)
hanging = name == "one_hanging"
host = np.random.default_rng().standard_normal(n).astype(np.float32)
grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731
result, error, next_work = None, None, None

t0 = time.perf_counter()
try:
    if face == "cupy":
        import cupy as cp
        x, out, flag = cp.asarray(host), cp.full(n, cp.nan, cp.float32), cp.zeros(1, cp.int32)
        lazytriton.kernel(kern)[grid](x, n, out, *([flag] if hanging else []))
        result = cp.asnumpy(out)
    elif face == "torch":
        import torch
        x = torch.from_numpy(host).cuda()
        out, flag = torch.full((n,), float("nan"), device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")
        lazytriton.kernel(kern)[grid](x, n, out, *([flag] if hanging else []))
        result = out.cpu().numpy()
    else:
        import jax
        import jax.numpy as jnp
        from lazytriton.jax import triton_call
        x = jnp.asarray(host)
        extra = {"flag": jnp.zeros(1, jnp.int32)} if hanging else {}
        f = jax.jit(lambda x: triton_call(x, kernel=kern, out_type=jax.ShapeDtypeStruct((n,), jnp.float32),
                                          grid=grid, n=n, **extra))
        result = np.asarray(f(x))
except Exception as exc:  # noqa: BLE001 (reported)
    error = f"{type(exc).__name__}: {exc}"
elapsed = time.perf_counter() - t0

# The process's next CUDA work, in the same face.
try:
    if face == "cupy":
        y = cp.asarray(host) * 3
        next_work = bool(np.allclose(cp.asnumpy(y), host * 3))
        cp.cuda.runtime.deviceSynchronize()
    elif face == "torch":
        y = torch.from_numpy(host).cuda() * 3
        torch.cuda.synchronize()
        next_work = bool(np.allclose(y.cpu().numpy(), host * 3))
    else:
        next_work = bool(np.allclose(np.asarray(jnp.asarray(host) * 3), host * 3))
except Exception as exc:  # noqa: BLE001 (reported)
    next_work = f"{type(exc).__name__}: {exc}"

print(json.dumps({"correct": result is not None and bool(np.array_equal(result, host)), "error": error,
                  "elapsed_s": elapsed, "next_cuda_work": next_work, "isolation": isolation.stats(),
                  "stats": lazytriton.stats()}), flush=True)
