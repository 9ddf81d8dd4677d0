"""Process start to first kernel result, cold cache vs warm cache, for the
8-config autotuned matmul (2048^3 fp16). Each run is a fresh process; the
figure that matters is what a warm first call adds over a steady-state call.
    python benchmarks/cold_warm_start.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
import numpy as np, cupy as cp, triton, lazytriton
from lazytriton.demo_kernels import demo_matmul
M = N = K = 2048
rng = np.random.default_rng(0)
a = cp.asarray(rng.standard_normal((M, K)).astype(np.float16))
b = cp.asarray(rng.standard_normal((K, N)).astype(np.float16))
c = cp.empty((M, N), cp.float16)
cp.cuda.runtime.deviceSynchronize()
t_ready = time.perf_counter()
k = lazytriton.kernel(demo_matmul)
grid = lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))
import cProfile, io, os, pstats
prof = cProfile.Profile() if os.environ.get("LT_PROFILE") else None
prof and prof.enable()
k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
cp.cuda.runtime.deviceSynchronize()
if prof:
    prof.disable(); s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
    print(s.getvalue()[-6000:], file=sys.stderr)
t_first = time.perf_counter()
k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
cp.cuda.runtime.deviceSynchronize()
t_second = time.perf_counter()
print(json.dumps({"imports_s": t_ready - t_start, "first_call_s": t_first - t_ready,
                  "steady_call_s": t_second - t_first, "stats": lazytriton.stats()}))
"""


def run(env) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())  # import the installed package, not the checkout
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["process_s"] = time.perf_counter() - t0
    return r


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, LAZYTRITON_CACHE_DIR=os.path.join(d, "lt"), TRITON_CACHE_DIR=os.path.join(d, "tr"))
        cold = run(env)
        warm = run(env)
        if os.environ.get("LT_PROFILE"):
            p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                               cwd=tempfile.gettempdir())
            print(p.stderr[-6000:])
    print(f"{'':8s} {'process':>9s} {'imports':>9s} {'1st call':>10s} {'steady':>9s} {'compiles':>9s} {'trials':>7s}")
    for name, r in (("cold", cold), ("warm", warm)):
        print(f"{name:8s} {r['process_s']:8.2f}s {r['imports_s']:8.2f}s {r['first_call_s'] * 1e3:8.1f}ms "
              f"{r['steady_call_s'] * 1e3:7.2f}ms {r['stats']['compiles']:9d} {r['stats']['bench_launches']:7d}")
    added = (warm["first_call_s"] - warm["steady_call_s"]) * 1e3
    print(f"warm start adds {added:.1f} ms over a steady-state call (goal < 50 ms); "
          f"cold first call {cold['first_call_s']:.2f} s")


if __name__ == "__main__":
    main()
