"""First call of the 8-config autotuned matmul (2048^3 fp16, torch tensors), every
row in a fresh process with fresh caches, side by side in one run:

- Triton's own @triton.autotune (serial compile + tune), cold;
- lazytriton standalone: cold, then warm (persisted winner, new process), and
  what the warm first call adds over a steady call;
- JAX: lazytriton's triton_call under jax.jit, cold first execution (with the
  FFI handler prebuilt at install, and built at run time as from an isolated
  wheel); jax-triton (when importable); each split into lowering, XLA compile
  and first execution (imports and backend start reported, not timed);
- tuning quality: the config lazytriton chose vs the exhaustive best (every
  config timed with triton.testing.do_bench: L2 flushed, medians) at 4096^3,
  1024x1024x8192, 8192x256x4096 and on an autotuned softmax, with the tuning
  time it cost (compile cache warm).

    python benchmarks/cold_warm_start.py [--skip-quality] [--skip-jax] [--skip-standalone]
Progress goes to stderr; the table to stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

PRELUDE = r"""
import json, os, sys, time
t_start = time.perf_counter()
sys.path.insert(0, os.environ["LT_BENCH_DIR"])
"""

# Wrapping the kernel (where lazytriton starts its compile server) happens at
# import time, as with a decorator in a user's module; then the data; then the call.
LAZY = PRELUDE + r"""
import torch, triton, lazytriton
from lazytriton.demo_kernels import demo_matmul
k = lazytriton.kernel(demo_matmul)
M = N = K = 2048
torch.manual_seed(0)
a = torch.randn(M, K, device="cuda", dtype=torch.float16); b = torch.randn(K, N, device="cuda", dtype=torch.float16)
c = torch.empty(M, N, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t_ready = time.perf_counter()
grid = lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))
k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
torch.cuda.synchronize()
t_first = time.perf_counter()
k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
torch.cuda.synchronize()
t_second = time.perf_counter()
err = (c.float() - a.float() @ b.float()).abs().max().item()
print(json.dumps({"imports_s": t_ready - t_start, "first_call_s": t_first - t_ready,
                  "steady_call_s": t_second - t_first, "max_err": err, "stats": lazytriton.stats()}))
"""

TRITON = PRELUDE + r"""
import torch, triton
from lazytriton.demo_kernels import demo_matmul
M = N = K = 2048
torch.manual_seed(0)
a = torch.randn(M, K, device="cuda", dtype=torch.float16); b = torch.randn(K, N, device="cuda", dtype=torch.float16)
c = torch.empty(M, N, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t_ready = time.perf_counter()
grid = lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))
demo_matmul[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
torch.cuda.synchronize()
print(json.dumps({"first_call_s": time.perf_counter() - t_ready}))
"""

# The JAX rows, split: imports, backend start (first arrays), trace + lowering,
# XLA compile, first execution (lazytriton: compile the candidates, tune, run).
JAX_CALL = r"""
import jax, jax.numpy as jnp, numpy as np, triton
from lazytriton.demo_kernels import demo_matmul
t_import = time.perf_counter()
M = N = K = 2048
a = jnp.asarray(np.random.default_rng(0).standard_normal((M, K)), jnp.float16)
b = jnp.asarray(np.random.default_rng(1).standard_normal((K, N)), jnp.float16)
a.block_until_ready(); b.block_until_ready()
def mm(a, b):
    # Scalars by name, so the output fills `c` (jax-triton 0.4 binding).
    return triton_call(a, b, M=M, N=N, K=K, sam=K, sak=1, sbk=N, sbn=1, scm=N, scn=1, kernel=demo_matmul,
                       out_shape=jax.ShapeDtypeStruct((M, N), jnp.float16),
                       grid=lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"])))
f = jax.jit(mm)
t_ready = time.perf_counter()
lowered = f.lower(a, b)
t_lower = time.perf_counter()
compiled = lowered.compile()
t_compile = time.perf_counter()
out = compiled(a, b); out.block_until_ready()
t_first = time.perf_counter()
err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - a.astype(jnp.float32) @ b.astype(jnp.float32))))
r = {"import_s": t_import - t_start, "backend_s": t_ready - t_import, "lower_s": t_lower - t_ready,
     "xla_compile_s": t_compile - t_lower, "execute_s": t_first - t_compile, "first_call_s": t_first - t_ready,
     "max_err": err}
"""
JAX_LAZY = PRELUDE + "import lazytriton.jax\nfrom lazytriton.jax import triton_call\n" + JAX_CALL + r"""
from lazytriton import jax_ffi, runtime
h = jax_ffi.handler_info()
# The handler: how it became ready, and when, from the first arrays being ready (> 0: lowering waited for it).
r["handler"] = {"how": h.get("how"), "seconds": h.get("seconds"),
                "ready_after_s": h["ready_at"] - t_ready if "ready_at" in h else None}
# Compile and tune of the first execution (overlapped): last candidate ready, tuning done.
r["resolutions"] = [dict(t, ended_after_s=t.pop("at") - t_compile) for t in runtime.timings()]
r["torch_imported"] = "torch" in sys.modules
print(json.dumps(r))
"""
JAX_TRITON = PRELUDE + "from jax_triton import triton_call\n" + JAX_CALL + "\nprint(json.dumps(r))\n"

# Chosen vs exhaustive best: lazytriton tunes (compile cache warm: the tuning
# time is what it costs); every config is then timed with do_bench.
QUALITY = PRELUDE + r"""
import torch, triton, lazytriton
from triton.testing import do_bench
from lazytriton.demo_kernels import demo_matmul, DEMO_CONFIGS
from tuning_kernels import softmax, SOFTMAX_CONFIGS
case = sys.argv[1]
torch.manual_seed(0)
if case == "softmax":
    R, C = 16384, 1024
    x = torch.randn(R, C, device="cuda", dtype=torch.float16); y = torch.empty_like(x)
    args = (x, y, R, C, C); kw = {"BLOCK": triton.next_power_of_2(C)}
    grid = lambda m: (triton.cdiv(R, m["ROWS"]),)
    kern, configs = softmax, SOFTMAX_CONFIGS
else:
    M, N, K = map(int, case.split("x"))
    a = torch.randn(M, K, device="cuda", dtype=torch.float16); b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    args = (a, b, c, M, N, K, K, 1, N, 1, N, 1); kw = {}
    grid = lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))
    kern, configs = demo_matmul, DEMO_CONFIGS
k = lazytriton.kernel(kern)
torch.cuda.synchronize()
t0 = time.perf_counter()
k[grid](*args, **kw)
torch.cuda.synchronize()
tune_s = time.perf_counter() - t0
chosen = k.records[-1].winner_index
times = []
for cfg in configs:
    meta = {**cfg.kwargs, **kw}
    g = grid(meta)
    run = lambda: kern.fn[g](*args, **meta, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    try:
        times.append(do_bench(run, warmup=50, rep=300, return_mode="median"))
    except Exception as exc:  # out of resources: cannot win
        times.append(float("inf"))
best = min(range(len(times)), key=lambda i: times[i])
print(json.dumps({"case": case, "chosen": chosen, "best": best, "ratio": times[chosen] / times[best],
                  "tune_s": tune_s, "times_us": [t * 1e3 for t in times]}))
"""


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(code: str, env: dict, *argv: str, what: str) -> dict | None:
    progress(f"{what} ...")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True,
                       cwd=tempfile.gettempdir())  # import the installed package, not the checkout
    if p.returncode != 0:
        progress(f"{what}: FAILED\n{p.stderr[-3000:]}")
        return None
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["process_s"] = time.perf_counter() - t0
    progress(f"{what}: first call {r.get('first_call_s', r.get('tune_s', 0)):.2f} s")
    return r


def fresh_env(d: str, name: str) -> dict:
    env = dict(os.environ, LAZYTRITON_CACHE_DIR=os.path.join(d, name, "lt"),
               TRITON_CACHE_DIR=os.path.join(d, name, "tr"), LT_BENCH_DIR=HERE,
               JAX_ENABLE_COMPILATION_CACHE="false")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


def importable(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-jax", action="store_true")
    ap.add_argument("--skip-standalone", action="store_true", help="no Triton and lazytriton standalone rows")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        triton_r = cold = warm = None
        if not opts.skip_standalone:
            triton_r = run(TRITON, fresh_env(d, "triton"), what="Triton's @triton.autotune, cold")
            env = fresh_env(d, "lazy")
            cold = run(LAZY, env, what="lazytriton standalone, cold")
            warm = run(LAZY, env, what="lazytriton standalone, warm (new process)")
        jax_r = jax_rb = jt_r = None
        if not opts.skip_jax and importable("jax"):
            jax_r = run(JAX_LAZY, fresh_env(d, "jax"), what="lazytriton.jax triton_call, cold first execution")
            # As from a wheel built in isolation: no prebuilt FFI handler, built on import in the background.
            jax_rb = run(JAX_LAZY, dict(fresh_env(d, "jaxb"), LAZYTRITON_PREBUILT_HANDLER="0"),
                         what="lazytriton.jax triton_call, cold, FFI handler built at run time")
            if importable("jax_triton"):
                jt_r = run(JAX_TRITON, fresh_env(d, "jt"), what="jax-triton triton_call, cold")
        quality = []
        if not opts.skip_quality:
            qenv = fresh_env(d, "quality")
            for case in ("4096x4096x4096", "1024x1024x8192", "8192x256x4096", "softmax"):
                # Twice in one cache: the second run's tuning time excludes compiling.
                run(QUALITY, qenv, case, what=f"tuning quality {case} (compiling)")
                q = run(QUALITY, dict(qenv, LAZYTRITON_RETUNE="1"), case, what=f"tuning quality {case}")
                if q:
                    quality.append(q)

    def fmt(r, key="first_call_s"):
        return f"{r[key]:.2f} s" if r else "n/a"

    print("\n| first call (8-config matmul 2048^3 fp16, fresh caches) | time | vs Triton's autotuner |")
    print("| --- | --- | --- |")
    base = triton_r["first_call_s"] if triton_r else None

    def vs(r):
        return f"{base / r['first_call_s']:.2f}x faster" if (r and base) else ""

    print(f"| Triton's @triton.autotune (serial compile + tune) | {fmt(triton_r)} | 1.00x |")
    print(f"| lazytriton standalone, cold (goal <= 1.5 s, >= 3x) | {fmt(cold)} | {vs(cold)} |")
    if warm:
        added = (warm["first_call_s"] - warm["steady_call_s"]) * 1e3
        print(f"| lazytriton standalone, warm: adds over a steady call (goal < 50 ms) | {added:.1f} ms | |")
    if jax_r:
        print(f"| lazytriton.jax, cold first execution: lowering + XLA compile + execution (goal <= 2 s) | "
              f"{fmt(jax_r)} | {vs(jax_r)} |")
    if jax_rb:
        print(f"| lazytriton.jax, same, FFI handler built at run time (no prebuilt one) | {fmt(jax_rb)} | {vs(jax_rb)} |")
    if jt_r:
        print(f"| jax-triton, same: lowering + XLA compile + execution | {fmt(jt_r)} | {vs(jt_r)} |")
        if jax_r:
            print(f"| lazytriton.jax vs jax-triton (goal >= 2.5x) | {jt_r['first_call_s'] / jax_r['first_call_s']:.2f}x | |")
    for name, r in (("lazytriton.jax", jax_r), ("lazytriton.jax, handler built at run time", jax_rb),
                    ("jax-triton", jt_r)):
        if r:
            print(f"  {name}: imports {r['import_s']:.2f} s, backend start + data {r['backend_s']:.2f} s (before the "
                  f"timed span); lowering {r['lower_s'] * 1e3:.0f} ms, XLA compile {r['xla_compile_s'] * 1e3:.0f} ms, "
                  f"first execution {r['execute_s'] * 1e3:.0f} ms, max |err| {r['max_err']:.3g}")
    for name, r in (("lazytriton.jax", jax_r), ("lazytriton.jax, handler built at run time", jax_rb)):
        if not r:
            continue
        h = r.get("handler") or {}
        if h.get("how"):
            print(f"  {name}: FFI handler {h['how']} in {h['seconds']:.2f} s, ready "
                  f"{h['ready_after_s']:+.2f} s from the data being ready (> 0: lowering waited)")
        for t in r.get("resolutions", []):
            print(f"  {name}: {t['kernel']}: {t['candidates']} candidates, last compiled after "
                  f"{t['compiled_s']:.2f} s, compiled + tuned (overlapped) in {t['tuned_s']:.2f} s; "
                  f"torch imported: {r.get('torch_imported')}")
    for name, r in (("cold", cold), ("warm", warm)):
        if r:
            print(f"  {name}: stats {r['stats']}, max |err| {r['max_err']:.3g}")
    if quality:
        print("\n| tuning quality | chosen | best | chosen/best (goal <= 1.02) | tuning time (compiled) |")
        print("| --- | --- | --- | --- | --- |")
        for q in quality:
            print(f"| {q['case']} | config {q['chosen']} ({q['times_us'][q['chosen']]:.1f} us) | config {q['best']} "
                  f"({q['times_us'][q['best']]:.1f} us) | {q['ratio']:.3f} | {q['tune_s']:.2f} s |")


if __name__ == "__main__":
    main()
