"""One process of tests/test_warm_start.py: imports the kernel module named on
the command line, makes the first call of its autotuned kernel `k` through
lazytriton's real runtime (Triton compiles for sm_90; the driver is
tests/fake_cuda) and prints one JSON line: what this process compiled, tuned
and found in the cache, and the kernel's fingerprint.

    LD_LIBRARY_PATH=<fake libcuda dir> LAZYTRITON_CACHE_DIR=... python warm_start_worker.py DIR MODULE
"""
import importlib
import json
import sys

sys.path.insert(0, sys.argv[1])
mod = importlib.import_module(sys.argv[2])

import triton  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton.cache import keys  # noqa: E402
from lazytriton.model.arrays import DeviceArray  # noqa: E402

size = 4096
x = DeviceArray(0x7F0000000000, "fp32", size * 4, (size,))
k = lazytriton.kernel(mod.k)
k[lambda meta: (triton.cdiv(size, meta["B"]),)](x, size, stream=0)
st = lazytriton.stats()
print(json.dumps({"compiles": st["compiles"], "tunes": st["tunes"], "record_hits": st["record_hits"],
                  "fingerprint": keys.kernel_fingerprint(mod.k), "triton_cache_key": mod.k.fn.cache_key}), flush=True)
