"""One process of tests/test_isolation.py: the first call of an autotuned kernel whose
configs differ in num_warps (tests/kernels/isolation.py `scale`: the stand-in driver,
tests/fake_cuda, faults or hangs a config by its block size: $FAKE_CUDA_FAULT_BLOCK,
$FAKE_CUDA_HANG_BLOCK), through lazytriton's real runtime (Triton compiles for sm_90) on
the standalone face, or on the JAX face (the call site lowered for CUDA on this CPU and
resolved as the XLA handler's first execution resolves it); then the process's next CUDA
work. Prints one JSON line. $AHEAD=1: the standalone kernel is compiled ahead first.

    LD_LIBRARY_PATH=<fake libcuda dir> python isolation_worker.py N [X_ADDRESS] [--jax]
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton import _core  # noqa: E402
from lazytriton.model.arrays import DeviceArray  # noqa: E402
from lazytriton.runtime import isolation  # noqa: E402
from kernels.isolation import scale  # noqa: E402

args = [a for a in sys.argv[1:] if a != "--jax"]
helpers_after_ahead = None
n = int(args[0])
x_address = int(args[1], 0) if len(args) > 1 else 0x7F0000000000
OUT = 0x7F1000000000
switch_intervals = []  # the interpreter's switch interval each time the grid is asked (trials, then the launch)
grid = lambda meta: (switch_intervals.append(sys.getswitchinterval()), (triton.cdiv(n, meta["B"]),))[1]  # noqa: E731


def jax_first_execution() -> None:
    import jax
    import jax.numpy as jnp

    from lazytriton import jax as ltj
    from lazytriton.jax import ffi as jax_ffi

    f = lambda x: ltj.triton_call(x, kernel=scale, out_type=x, grid=grid, n=n)  # noqa: E731
    text = jax.jit(f).trace(jax.ShapeDtypeStruct((n,), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    payload = re.search(r'payload = "((?:[^"\\]|\\.)*)"', text).group(1)
    site = jax_ffi.Site(json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), payload)))
    site.d["n_inputs"] = 1
    entry = site.resolve(((x_address, n * 4), (OUT, n * 4)), 0, 0, False)
    _core.launch_fixed(entry, 0, [x_address, OUT])


error = None
try:
    if "--jax" in sys.argv:
        jax_first_execution()
    else:
        x, out = DeviceArray(x_address, "fp32", n * 4, (n,)), DeviceArray(OUT, "fp32", n * 4, (n,))
        k = lazytriton.kernel(scale)
        if os.environ.get("AHEAD"):  # every candidate compiled ahead: the helper, if needed, starts then
            k.compile_ahead(x, out, n).result()
            helpers_after_ahead = len(isolation.helper_pids())
        k[grid](x, out, n, stream=0)
except Exception as exc:  # noqa: BLE001 (reported)
    error = f"{type(exc).__name__}: {exc}"
try:
    _core.synchronize(0)  # the process's next CUDA work
    next_work = True
except Exception as exc:  # noqa: BLE001 (reported)
    next_work = f"{type(exc).__name__}: {exc}"
print(json.dumps({"error": error, "next_cuda_work": next_work, "isolation": isolation.stats(),
                  "helpers_after_ahead": helpers_after_ahead, "switch_intervals": switch_intervals,
                  "switch_interval_after": sys.getswitchinterval(),
                  "stats": lazytriton.stats()}), flush=True)
