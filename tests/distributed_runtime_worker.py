"""One process of tests/test_distributed.py's runtime test: joins a jax.distributed
job on the CPU backend and makes the first call of an autotuned kernel through
lazytriton's real runtime (Triton compiles for sm_90; the driver is
tests/fake_cuda, so launches and timings are stand-ins). Prints one JSON line:
what this process compiled and tuned, what agreement did, its winner.

    LD_LIBRARY_PATH=<fake libcuda dir> LAZYTRITON_CACHE_DIR=... python distributed_runtime_worker.py RANK N PORT
"""
import json
import os
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"
import jax  # noqa: E402

rank, n, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=rank,
                           initialization_timeout=120)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton import distributed  # noqa: E402
from lazytriton.model.arrays import DeviceArray  # noqa: E402


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((64, 2), (128, 4), (256, 4))],
                 key=["n"])
@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


size = 4096
x, y, out = (DeviceArray(0x7F0000000000 + i * (1 << 20), "fp32", size * 4, (size,)) for i in range(3))
k = lazytriton.kernel(add)
time.sleep(float(os.environ.get("DELAY_S", "0")))  # a rank that comes up late
k[lambda meta: (triton.cdiv(size, meta["BLOCK"]),)](x, y, out, size, stream=0)
rec = k.records[-1]
st = lazytriton.stats()
print(json.dumps({"rank": rank, "compiles": st["compiles"], "tunes": st["tunes"], "record_hits": st["record_hits"],
                  "agreement": distributed.stats(), "winner_index": rec.winner_index, "winner": rec.winner,
                  "agreed": rec.extra.get("agreed")}), flush=True)
jax.distributed.shutdown()
