"""One process of tests/test_isolation.py: the first call of an autotuned kernel whose
configs differ in num_warps (so that the stand-in driver, tests/fake_cuda, can fault or
hang a config by its block size: $FAKE_CUDA_FAULT_BLOCK, $FAKE_CUDA_HANG_BLOCK), through
lazytriton's real runtime (Triton compiles for sm_90); then the process's next CUDA work.
Prints one JSON line.

    LD_LIBRARY_PATH=<fake libcuda dir> python isolation_worker.py N [X_ADDRESS]
"""
import json
import sys

import triton
import triton.language as tl

import lazytriton
from lazytriton import _core
from lazytriton.model.arrays import DeviceArray
from lazytriton.runtime import isolation


# num_warps 1, 2, 4: blocks of 32, 64, 128 threads
@triton.autotune(configs=[triton.Config({"B": 64 << i}, num_warps=w) for i, w in enumerate((1, 2, 4))],
                 key=["n"])
@triton.jit
def scale(x, out, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(out + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)


n = int(sys.argv[1])
x_address = int(sys.argv[2], 0) if len(sys.argv) > 2 else 0x7F0000000000
x = DeviceArray(x_address, "fp32", n * 4, (n,))
out = DeviceArray(0x7F1000000000, "fp32", n * 4, (n,))
error = None
try:
    lazytriton.kernel(scale)[lambda meta: (triton.cdiv(n, meta["B"]),)](x, out, n, stream=0)
except Exception as exc:  # noqa: BLE001 (reported)
    error = f"{type(exc).__name__}: {exc}"
try:
    _core.synchronize(0)  # the process's next CUDA work
    next_work = True
except Exception as exc:  # noqa: BLE001 (reported)
    next_work = f"{type(exc).__name__}: {exc}"
print(json.dumps({"error": error, "next_cuda_work": next_work, "isolation": isolation.stats(),
                  "stats": lazytriton.stats()}), flush=True)
