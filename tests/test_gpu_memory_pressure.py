"""Tuning under memory pressure (issue 25): a JAX process that leaves the GPU
almost no free memory (XLA_PYTHON_CLIENT_MEM_FRACTION=0.99, or the platform
allocator with the rest of the device taken) runs an autotuned in-place kernel
on a multi-GiB aliased buffer. The tuner's L2-flush buffer (forced on) cannot
be allocated: tuning degrades (no flush, said once) and never fails; the
snapshot of the buffer lives in pinned host memory; the result is one launch
of the winner on the original data."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

WORKER = """
import json, sys
sys.path.insert(0, {tests!r})
import logging
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s: %(message)s")
import cupy as cp, jax, jax.numpy as jnp, triton, lazytriton
from lazytriton.jax import triton_call
from kernels import basic

n = {n}
x = jnp.arange(n, dtype=jnp.float32) % 1024.0  # {gib} GiB, aliased to the output: written in place
x.block_until_ready()
cp.get_default_memory_pool().free_all_blocks()
free = cp.cuda.runtime.memGetInfo()[0]
hog = cp.cuda.runtime.malloc(free - ({left_mib} << 20)) if free > ({left_mib} << 20) else None
left = cp.cuda.runtime.memGetInfo()[0]

def f(x):
    return triton_call(x, n, kernel=basic.increment_kernel, out_type=x, input_output_aliases={{0: 0}},
                       grid=lambda m: (triton.cdiv(n, m["BLOCK"]),))

y = jax.jit(f, donate_argnums=0)(x)  # donated: the output is x's own buffer, no copy of it
y.block_until_ready()
s = lazytriton.stats()
if hog is not None:
    cp.cuda.runtime.free(hog)  # room to check the result
ok = bool(jnp.all(y == (jnp.arange(n, dtype=jnp.float32) % 1024.0) + 1.0))  # x + 1, never x + k
print(json.dumps({{"ok": ok, "tunes": s["tunes"], "free_mib_at_call": left >> 20}}))
"""


@pytest.mark.gpu
@pytest.mark.exclusive_gpu  # fills the device: run alone (pytest -m exclusive_gpu)
@pytest.mark.parametrize("allocator", ["bfc_fraction_0.99", "platform"])
def test_jax_autotuned_in_place_kernel_on_a_multi_gib_buffer_with_no_memory_to_spare(cache_dir, allocator):
    n = 3 << 28  # 3 GiB of float32
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PYTHON_CLIENT_")}
    env.update(LAZYTRITON_CACHE_DIR=str(cache_dir), LAZYTRITON_FLUSH_L2="1")
    if allocator == "platform":
        env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    else:
        env.update(XLA_PYTHON_CLIENT_PREALLOCATE="true", XLA_PYTHON_CLIENT_MEM_FRACTION="0.99")
    code = WORKER.format(tests=str(TESTS), n=n, gib=n * 4 >> 30, left_mib=40)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                       cwd=os.path.expanduser("~"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(allocator, out)
    assert out["ok"] and out["tunes"] == 1, (out, r.stderr[-3000:])
    assert out["free_mib_at_call"] < 64, out  # less than any L2-flush buffer
    assert r.stderr.count("no device memory for the tuner's L2-flush buffer") == 1, r.stderr[-3000:]
