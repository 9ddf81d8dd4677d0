"""One process of a jax.distributed job on a GPU machine (tests/test_gpu_distributed.py):
a jitted program whose autotuned matmul goes through lazytriton.jax.triton_call; prints one JSON line with the winner's
config index, who tuned, the first step's time and the result's error.

    CUDA_VISIBLE_DEVICES=G LAZYTRITON_CACHE_DIR=... python gpu_distributed_worker.py R N PORT [SIZE]
"""
import json
import sys
import time
from pathlib import Path

rank, n, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
size = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
t_start = time.perf_counter()

import jax  # noqa: E402

jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=rank,
                           initialization_timeout=120)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import triton  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton import distributed  # noqa: E402
from lazytriton.jax import ffi as jax_ffi
from lazytriton.cache import Cache  # noqa: E402
from lazytriton.jax import triton_call  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import jaxk  # noqa: E402

M = N = K = size


def mm(a, b):
    return triton_call(a, b, M, N, K, K, 1, N, 1, N, 1, kernel=jaxk.matmul_kernel,
                       out_shape=jax.ShapeDtypeStruct((M, N), jnp.float16),
                       grid=lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"])))


ka, kb = jax.random.split(jax.random.key(0))  # the same inputs on every rank
a = jax.random.normal(ka, (M, K), jnp.float16)
b = jax.random.normal(kb, (K, N), jnp.float16)
a.block_until_ready()
b.block_until_ready()
f = jax.jit(mm)
t0 = time.perf_counter()
out = f(a, b).block_until_ready()  # the first step: compile, agree or tune, launch
first_s = time.perf_counter() - t0
t0 = time.perf_counter()
f(a, b).block_until_ready()
second_s = time.perf_counter() - t0

ref = np.asarray(jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32)))
err = float(np.abs(np.asarray(out, np.float32) - ref).max() / np.abs(ref).max())
sites = list(jax_ffi._sites.values())
rec = sites[0].lazy.records[-1]
stored = [e for e in Cache().entries() if e.kind == "record" and e.kernel_name == rec.kernel_name]
stored_rec = Cache().show(stored[0].key)["record"] if stored else None
print(json.dumps({
    "rank": rank, "device": str(jax.local_devices()[0]), "winner_index": rec.winner_index,
    "agreed": rec.extra.get("agreed"), "stored_agreed": (stored_rec or {}).get("extra", {}).get("agreed"),
    "stored_winner_index": (stored_rec or {}).get("winner_index"),
    "agreement": distributed.stats(), "lazytriton": {k: v for k, v in lazytriton.stats().items()
                                                     if k in ("compiles", "tunes", "resolves", "record_hits")},
    "first_step_s": first_s, "second_step_s": second_s, "process_s": time.perf_counter() - t_start,
    "rel_err": err}), flush=True)
jax.distributed.shutdown()
