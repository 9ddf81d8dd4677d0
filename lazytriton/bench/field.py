"""Cold first calls of kernels that live in a real package, and the first step of
a program of many kernels (issue 33). Needs a GPU, torch and jax.

The script writes a package in a temporary directory whose ``__init__`` imports
torch and jax (what a kernel library pulls in: seconds), and whose ``kernels``
module holds 16 distinct autotuned kernels (matmuls with epilogues, row
reductions, a cumsum, elementwise kernels, one that reads a constexpr-wrapped
Python function), and whose ``lazy`` module exports them as a package built on
lazytriton would: wrapped with ``lazytriton.kernel`` when it is imported, which
starts lazytriton's compile server while the program makes its data. Every row
runs in a fresh process with empty lazytriton,
Triton and JAX caches (except the warm rows, which reuse the cold row's), and
times from the data being ready (the package already imported) to the result
being ready.

Rows (one matmul of the package, 8 configs, standalone face):
  lazytriton                (compile server: front ends here, back ends in its workers)
  in-process threads        (LAZYTRITON_COMPILE_WORKERS=0)
  Triton's autotuner        (the kernel called directly, as the package would)
  warm start, new process   (0 compiles, 0 tunes)
  lazytriton.jax            (the same matmul under jax.jit, first execution; and in-process threads)
Rows (the 16-kernel program):
  JAX, first step           (compiled ahead at lowering; and LAZYTRITON_COMPILE_AHEAD=0)
  JAX, warm start           (a new process: 0 compiles, 0 tunes)
  standalone, first step    (k.compile_ahead at start; without it; and with the kernels wrapped
                            after the data, so that the compile server's start is on the way)
  reference                 slowest single kernel compile + the sum of the tunes (from the serial run)

    python -m lazytriton.bench.field [--repeat 3] [--out results.json]   (or benchmarks/cold_field.py)
    lazytriton bench --only field     (the harness's sections field and field_program, with a plot each)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

from .cold import ISOLATION_REPORT

PKG_INIT = """
import torch  # what a kernel library imports: seconds
import jax
import jax.numpy as jnp
"""

KERNELS = '''
import triton
import triton.language as tl

MM_CONFIGS = [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
              for bm, bn, bk, w, s in ((128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4),
                                       (128, 64, 64, 4, 4), (64, 64, 32, 4, 5), (128, 128, 32, 8, 4),
                                       (256, 128, 64, 8, 3), (64, 256, 32, 4, 4))]
ROW_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((1024, 4), (2048, 8), (4096, 8), (4096, 16))]
EW_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 2), (1024, 4), (2048, 8), (4096, 8))]


def _twice(v):
    return v * 2


DOUBLE = tl.constexpr(_twice)  # a constexpr-wrapped Python function: Triton's cache_key holds its address


def _matmul(epilogue):
    @triton.jit
    def body(a, b, M, N, K, sam, sak, sbk, sbn, scm, scn, c, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr):  # outputs last, as jax-triton appends them
        pid = tl.program_id(0)
        nn = tl.cdiv(N, BN)
        rm = (pid // nn) * BM + tl.arange(0, BM)
        rn = (pid % nn) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a + rm[:, None] * sam + (k + rk)[None, :] * sak)
            y = tl.load(b + (k + rk)[:, None] * sbk + rn[None, :] * sbn)
            acc += tl.dot(x, y)
        acc = epilogue(acc)
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.float16))
    return body


@triton.jit
def _ident(x):
    return x


@triton.jit
def _relu(x):
    return tl.maximum(x, 0.0)


@triton.jit
def _gelu(x):
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def _silu(x):
    return x * tl.sigmoid(x)


mm_plain = triton.autotune(MM_CONFIGS, key=["M", "N", "K"])(_matmul(_ident))
mm_relu = triton.autotune(MM_CONFIGS, key=["M", "N", "K"])(_matmul(_relu))
mm_gelu = triton.autotune(MM_CONFIGS, key=["M", "N", "K"])(_matmul(_gelu))
mm_silu = triton.autotune(MM_CONFIGS, key=["M", "N", "K"])(_matmul(_silu))


def _rowwise(op):
    @triton.autotune(ROW_CONFIGS, key=["n"])
    @triton.jit
    def body(x, n, y, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        o = tl.arange(0, BLOCK)
        v = tl.load(x + row * n + o, mask=o < n, other=0.0).to(tl.float32)
        tl.store(y + row * n + o, op(v, o < n).to(tl.float16), mask=o < n)
    return body


@triton.jit
def _softmax(v, m):
    v = tl.where(m, v, -float("inf"))
    e = tl.exp(v - tl.max(v, 0))
    return e / tl.sum(e, 0)


@triton.jit
def _rmsnorm(v, m):
    return v / tl.sqrt(tl.sum(v * v, 0) / tl.sum(m.to(tl.float32), 0) + 1e-6)


@triton.jit
def _layernorm(v, m):
    mean = tl.sum(v, 0) / tl.sum(m.to(tl.float32), 0)
    d = tl.where(m, v - mean, 0.0)
    return d / tl.sqrt(tl.sum(d * d, 0) / tl.sum(m.to(tl.float32), 0) + 1e-5)


@triton.jit
def _cumsum(v, m):
    return tl.cumsum(v, 0)


@triton.jit
def _logsumexp_shift(v, m):
    v = tl.where(m, v, -float("inf"))
    mx = tl.max(v, 0)
    return v - (mx + tl.log(tl.sum(tl.exp(v - mx), 0)))


softmax = _rowwise(_softmax)
rmsnorm = _rowwise(_rmsnorm)
layernorm = _rowwise(_layernorm)
cumsum = _rowwise(_cumsum)
log_softmax = _rowwise(_logsumexp_shift)


def _elementwise(op):
    @triton.autotune(EW_CONFIGS, key=["n"])
    @triton.jit
    def body(x, y, n, out, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = o < n
        a = tl.load(x + o, mask=m).to(tl.float32)
        b = tl.load(y + o, mask=m).to(tl.float32)
        tl.store(out + o, op(a, b).to(tl.float16), mask=m)
    return body


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _swiglu(a, b):
    return a * tl.sigmoid(a) * b


@triton.jit
def _geglu(a, b):
    return 0.5 * a * (1.0 + tl.erf(a * 0.7071067811865476)) * b


@triton.jit
def _axpy(a, b):
    return 2.0 * a + b


@triton.jit
def _scaled(a, b):
    if DOUBLE is not None:  # reads the constexpr-wrapped function
        a = a * 2.0
    return a - b


add = _elementwise(_add)
mul = _elementwise(_mul)
swiglu = _elementwise(_swiglu)
geglu = _elementwise(_geglu)
axpy = _elementwise(_axpy)
scaled_sub = _elementwise(_scaled)

MATMULS = [mm_plain, mm_relu, mm_gelu, mm_silu]
ROWWISE = [softmax, rmsnorm, layernorm, cumsum, log_softmax]
ELEMENTWISE = [add, mul, swiglu, geglu, axpy, scaled_sub]
ALL = MATMULS + ROWWISE + ELEMENTWISE  # 15 families; mm_plain twice (two shapes) makes 16 call sites
'''

# The package's lazytriton build of the same kernels: wrapped at its import.
LAZY = '''
import lazytriton

from . import kernels as K

MATMULS = [lazytriton.kernel(k) for k in K.MATMULS]
ROWWISE = [lazytriton.kernel(k) for k in K.ROWWISE]
ELEMENTWISE = [lazytriton.kernel(k) for k in K.ELEMENTWISE]
mm_plain = MATMULS[0]
'''

PRELUDE = r"""
import faulthandler, json, os, sys, time
faulthandler.dump_traceback_later(float(os.environ.get("LT_HANG_S", "300")), exit=True)  # a hang shows its stacks
sys.path.insert(0, os.environ["LT_PKG_DIR"])
t0 = time.perf_counter()
import ltfield
import ltfield.kernels as K
import torch
import triton
t_import = time.perf_counter() - t0
OUT = sys.argv[1]
def server_timeline(t):  # the compile server's start-up on the clock of the call at t
    from lazytriton.compile import pool
    return {k: (v - t if k.endswith("_at") else v) for k, v in pool.server_timeline().items()}
import gc
GC = []  # the interpreter's collections after the imports: (generation, start, seconds), a pause of the caller
def _gc_pause(phase, info, _t=[0.0]):
    if phase == "start":
        _t[0] = time.perf_counter()
    else:
        GC.append((info["generation"], _t[0], time.perf_counter() - _t[0]))
gc.callbacks.append(_gc_pause)
def done(r):
    r["import_s"] = t_import
    if "t0" in r:  # the full collections during the step
        r["gc"] = [(g, s - r["t0"], d) for g, s, d in GC if g == 2 and s >= r["t0"]]
    with open(OUT, "w") as f:
        json.dump(r, f)
"""

# One matmul, 8 configs, standalone: lazytriton (the mode is in the environment) or Triton.
ONE = PRELUDE + ISOLATION_REPORT + r"""
mode = os.environ["LT_MODE"]
if mode == "lazy":
    import ltfield.lazy as L  # the package's kernels, wrapped when it is imported
M = N = K_ = 2048
torch.manual_seed(0)
a = torch.randn(M, K_, device="cuda", dtype=torch.float16); b = torch.randn(K_, N, device="cuda", dtype=torch.float16)
c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
grid = lambda m: (triton.cdiv(M, m["BM"]) * triton.cdiv(N, m["BN"]),)
k = L.mm_plain if mode == "lazy" else K.mm_plain
torch.cuda.synchronize()
t = time.perf_counter()
k[grid](a, b, M, N, K_, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1), c)
torch.cuda.synchronize()
first = time.perf_counter() - t
err = (c.float() - a.float() @ b.float()).abs().max().item()
r = {"first_s": first, "max_err": err}
if mode == "lazy":
    import lazytriton
    from lazytriton.runtime import resolve
    st = lazytriton.stats()
    r.update(compiles=st["compiles"], tunes=st["tunes"], record_hits=st["record_hits"], timings=resolve.timings(),
             server=server_timeline(t), isolation=isolation_report())
done(r)
"""

# The same matmul through lazytriton.jax under jax.jit: the first execution (trace, lowering
# and XLA's compile included, the same in both of its rows), default or in-process threads.
ONE_JAX = PRELUDE + r"""
import jax, jax.numpy as jnp
import lazytriton
from lazytriton.jax import triton_call
from lazytriton.runtime import resolve
M = N = K_ = 2048
ka, kb = jax.random.split(jax.random.PRNGKey(0))
a = jax.random.normal(ka, (M, K_), jnp.float16); b = jax.random.normal(kb, (K_, N), jnp.float16)
a.block_until_ready(); b.block_until_ready()
f = jax.jit(lambda a, b: triton_call(a, b, M, N, K_, K_, 1, N, 1, N, 1, kernel=K.mm_plain,
                                     out_shape=jax.ShapeDtypeStruct((M, N), jnp.float16),
                                     grid=lambda m: (triton.cdiv(M, m["BM"]) * triton.cdiv(N, m["BN"]),)))
t = time.perf_counter()
c = f(a, b).block_until_ready()
first = time.perf_counter() - t
err = float(jnp.abs(c.astype(jnp.float32) - a.astype(jnp.float32) @ b.astype(jnp.float32)).max())
st = lazytriton.stats()
done({"first_s": first, "max_err": err, "compiles": st["compiles"], "tunes": st["tunes"],
      "record_hits": st["record_hits"], "timings": resolve.timings()})
"""

# The 16-call-site program through lazytriton.jax under one jit.
JAX16 = PRELUDE + r"""
import jax, jax.numpy as jnp
import lazytriton
from lazytriton.jax import triton_call
from lazytriton.runtime import resolve
M = N = K_ = 1024
R, C = 512, 2048
E = 1 << 20

def mm(kern, a, b, m, n, k):
    return triton_call(a, b, m, n, k, k, 1, n, 1, n, 1, kernel=kern, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float16),
                       grid=lambda meta: (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),))

def row(kern, x):
    return triton_call(x, C, kernel=kern, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float16), grid=(R,))

def ew(kern, x, y):
    return triton_call(x, y, E, kernel=kern, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float16),
                       grid=lambda meta: (triton.cdiv(E, meta["BLOCK"]),))

@jax.jit
def program(a, b, a2, b2, x, e1, e2):
    outs = [mm(kk, a, b, M, N, K_) for kk in K.MATMULS]
    outs.append(mm(K.mm_plain, a2, b2, 512, 512, 512))
    outs += [row(kk, x) for kk in K.ROWWISE]
    outs += [ew(kk, e1, e2) for kk in K.ELEMENTWISE]
    return outs

key = jax.random.PRNGKey(0)
ks = jax.random.split(key, 7)
a = jax.random.normal(ks[0], (M, K_), jnp.float16); b = jax.random.normal(ks[1], (K_, N), jnp.float16)
a2 = jax.random.normal(ks[2], (512, 512), jnp.float16); b2 = jax.random.normal(ks[3], (512, 512), jnp.float16)
x = jax.random.normal(ks[4], (R, C), jnp.float16)
e1 = jax.random.normal(ks[5], (E,), jnp.float16); e2 = jax.random.normal(ks[6], (E,), jnp.float16)
jax.block_until_ready((a, b, a2, b2, x, e1, e2))
t = time.perf_counter()
outs = jax.block_until_ready(program(a, b, a2, b2, x, e1, e2))
first = time.perf_counter() - t
err = float(jnp.abs(outs[0].astype(jnp.float32) - (a.astype(jnp.float32) @ b.astype(jnp.float32))).max())
st = lazytriton.stats()
tm = resolve.timings()
from lazytriton.compile import schedule
from lazytriton.runtime import isolation
done({"t0": t, "compile_history": schedule.history(), "first_s": first, "max_err": err, "compiles": st["compiles"], "tunes": st["tunes"],
      "record_hits": st["record_hits"], "sites": len(tm), "timings": tm, "isolation": isolation.stats()})
"""

# The same 16 calls on the standalone face, one after another (torch arrays). The kernels
# are the package's, wrapped at its import (LT_WRAP=late: wrapped after the data instead).
STANDALONE16 = PRELUDE + r"""
late = os.environ.get("LT_WRAP") == "late"
if not late:
    import ltfield.lazy as L
import lazytriton
from lazytriton.runtime import resolve
ahead = os.environ.get("LT_AHEAD") == "1"
M = N = K_ = 1024
R, C = 512, 2048
E = 1 << 20
torch.manual_seed(0)
a = torch.randn(M, K_, device="cuda", dtype=torch.float16); b = torch.randn(K_, N, device="cuda", dtype=torch.float16)
a2 = torch.randn(512, 512, device="cuda", dtype=torch.float16); b2 = torch.randn(512, 512, device="cuda", dtype=torch.float16)
x = torch.randn(R, C, device="cuda", dtype=torch.float16)
e1 = torch.randn(E, device="cuda", dtype=torch.float16); e2 = torch.randn(E, device="cuda", dtype=torch.float16)
if late:
    matmuls, rowwise, elementwise = ([lazytriton.kernel(k) for k in ks] for ks in (K.MATMULS, K.ROWWISE, K.ELEMENTWISE))
else:
    matmuls, rowwise, elementwise = L.MATMULS, L.ROWWISE, L.ELEMENTWISE
calls = []
for kk in matmuls:
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    calls.append((kk, (a, b, M, N, K_, K_, 1, N, 1, N, 1, c),
                  lambda m, M=M, N=N: (triton.cdiv(M, m["BM"]) * triton.cdiv(N, m["BN"]),)))
c2 = torch.empty(512, 512, device="cuda", dtype=torch.float16)
calls.append((matmuls[0], (a2, b2, 512, 512, 512, 512, 1, 512, 1, 512, 1, c2),
              lambda m: (triton.cdiv(512, m["BM"]) * triton.cdiv(512, m["BN"]),)))
for kk in rowwise:
    calls.append((kk, (x, C, torch.empty_like(x)), (R,)))
for kk in elementwise:
    calls.append((kk, (e1, e2, E, torch.empty_like(e1)), lambda m: (triton.cdiv(E, m["BLOCK"]),)))
torch.cuda.synchronize()
t = time.perf_counter()
if ahead:  # what a program that knows its calls does at start-up
    for k, args, _ in calls:
        k.compile_ahead(*args)
for k, args, grid in calls:
    k[grid](*args)
torch.cuda.synchronize()
first = time.perf_counter() - t
st = lazytriton.stats()
from lazytriton.compile import schedule
from lazytriton.runtime import isolation
done({"t0": t, "compile_history": schedule.history(), "first_s": first, "compiles": st["compiles"], "tunes": st["tunes"], "record_hits": st["record_hits"],
      "timings": resolve.timings(), "server": server_timeline(t), "isolation": isolation.stats()})
"""


def one_process(script: str, env: dict, pkg: str, caches: str, label: str, say=print) -> dict:
    out = os.path.join(caches, f"{label}.json")
    full = {**os.environ, "LT_PKG_DIR": pkg, "LAZYTRITON_CACHE_DIR": os.path.join(caches, "lt"),
            "TRITON_CACHE_DIR": os.path.join(caches, "triton"), "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            "JAX_COMPILATION_CACHE_DIR": os.path.join(caches, "jax"), "TRITON_DEFAULT_FP_FUSION": "1", **env}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", script, out], env=full, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        say(f"  {label}: failed\n{p.stdout[-3000:]}\n{p.stderr[-12000:]}")
        return {"failed": True, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    r = json.load(open(out))
    r["process_s"] = time.perf_counter() - t
    tm = r.get("timings") or []
    split = (f"; compiled after {max(t['compiled_s'] for t in tm):.2f} s, front ends {sum(t.get('front_end_s', 0) for t in tm):.2f} s"
             f" of GIL here ({sum(t.get('front_ends_here', 0) for t in tm)} front ends here), in threads"
             f" {sum(t.get('in_threads', 0) for t in tm)} of {sum(t['candidates'] for t in tm)}"
             if tm else "")
    sv = r.get("server") or {}
    if "ready_at" in sv:
        hashed = f"{sv['hashed_at']:+.2f}" if "hashed_at" in sv else "not yet at the end"
        split += (f"; compile server ready {sv['ready_at']:+.2f} s from the call (started {sv['started_at']:+.2f}, "
                  f"imports done {sv['imports_done_at']:+.2f}; Triton's installation hash {hashed})")
    if r.get("gc"):
        split += "; full collections of the interpreter in the step: " + ", ".join(
            f"{d * 1e3:.0f} ms at {s:+.2f} s" for _, s, d in r["gc"])
    iso = r.get("isolation") or {}
    if iso.get("jobs"):  # isolated first launches (issue 50): what they cost this row, and how buffers went
        split += (f"; {iso['jobs']} first launches isolated, {iso['isolated_s']:.2f} s (helper start included), "
                  f"buffers: {iso['ipc_buffers']} by IPC, {iso.get('copied_buffers', 0)} as device copies by IPC, "
                  f"{iso['staged_buffers']} staged through host memory")
    say(f"  {label}: first {r['first_s']:.2f} s (import {r['import_s']:.2f} s)"
          + (f", compiles {r['compiles']}, tunes {r['tunes']}" if "compiles" in r else "") + split)
    return r


def reference(timings: list[dict]) -> dict:
    """Slowest single kernel's compile + the sum of the tunes, from a serial run's timings
    (per kernel: compiled_s when its last candidate was ready, tune_s the tuner's own
    seconds in trials). A tune starts as soon as two candidates are ready, beside the
    compiles: what is left of it once the last candidate is ready (tuned_s - compiled_s,
    `tail_tunes_s`, this reference's sum until the tuner counted its seconds) leaves out
    the trials that ran beside them."""
    compiles = [t["compiled_s"] for t in timings]
    tails = [max(0.0, t["tuned_s"] - t["compiled_s"]) for t in timings]
    tunes = [t.get("tune_s", tail) for t, tail in zip(timings, tails)]
    # What the cores can do at best: every candidate's compile seconds (front end and back
    # end, each on one core) spread over all of them, then the last kernel's tune.
    cores = len(os.sched_getaffinity(0))
    floor = sum(t.get("compile_s", 0.0) for t in timings) / cores + (tunes[-1] if tunes else 0.0)
    return {"slowest_compile_s": max(compiles), "sum_tunes_s": sum(tunes), "ref_s": max(compiles) + sum(tunes),
            "tail_tunes_s": sum(tails), "tail_ref_s": max(compiles) + sum(tails),
            "compile_s": sum(t.get("compile_s", 0.0) for t in timings), "cores": cores, "floor_s": floor}


def step_breakdown(r: dict) -> dict | None:
    """Where a 16-site step's first seconds went, from one run's compile history and timings
    (all on the step's clock): the first compile queued (the program's tracing and lowering
    before it), the compile that ended last (its front end's start, its job, its end), the full
    collections of the interpreter, and the sites after the one that waited for it: their
    trials, their isolated first launches and the rest (resolving, keys, the cache)."""
    hist, timings, t0 = r.get("compile_history") or [], r.get("timings") or [], r.get("t0")
    if not hist or not timings or t0 is None or "at" not in timings[0]:
        return None
    last = max(hist, key=lambda e: e["job_done"])
    ends = [t["at"] - t0 for t in timings]
    # The sites that ended after the last compile: what is left of the step once every compile is done.
    after = [t for t, e in zip(timings, ends) if e > last["job_done"] - t0]
    tail = ends[-1] - (last["job_done"] - t0) if after else 0.0
    trials, isolated = sum(t.get("tune_s", 0.0) for t in after), sum(t.get("isolated_s", 0.0) for t in after)
    return {"first_queued_s": min(e["queued"] for e in hist) - t0,
            "last_compile": {"label": last["label"], "front_end_s": last["front_end"] - t0,
                             "job_s": last["job_s"], "done_s": last["job_done"] - t0},
            "full_collections": [[round(s, 3), round(d, 3)] for _, s, d in r.get("gc", [])],
            "sites_after": len(after), "tail_s": tail, "tail_trials_s": trials, "tail_isolated_s": isolated,
            "tail_other_s": max(0.0, tail - trials - isolated)}


def breakdown_notes(res: dict) -> list[str]:
    """step_breakdown of each 16-site row compiled ahead (its median run), a sentence each."""
    notes = []
    for name, what in (("jax_ahead", "JAX 16 sites"), ("sa_ahead", "standalone 16 calls")):
        b = step_breakdown(res.get(name) or {})
        if b is None:
            continue
        lc = b["last_compile"]
        gcs = ", ".join(f"{d:.2f} s at +{s:.2f} s" for s, d in b["full_collections"]) or "none"
        notes.append(f"{what}, compiled ahead, the median run: first compile queued at +{b['first_queued_s']:.2f} s; "
                     f"the last compile to end ({lc['label'].split(' (')[0]}) started its front end at "
                     f"+{lc['front_end_s']:.2f} s, ran {lc['job_s']:.2f} s, ended at +{lc['done_s']:.2f} s; full "
                     f"collections: {gcs}; then {b['sites_after']} sites in {b['tail_s']:.2f} s: trials "
                     f"{b['tail_trials_s']:.2f} s, isolated first launches {b['tail_isolated_s']:.2f} s, the rest "
                     f"{b['tail_other_s']:.2f} s")
    return notes


def median_timings(runs: list[list[dict]]) -> list[dict]:
    """Each kernel's median over the runs of every number the reference reads: one serial run's
    slowest compile or sum of tunes moves by tenths of a second from run to run, each kernel's
    median far less."""
    keys = ("compiled_s", "tuned_s", "tune_s", "compile_s")
    out = []
    for per_kernel in zip(*runs):
        out.append({k: sorted(t[k] for t in per_kernel)[len(per_kernel) // 2]
                    for k in keys if all(k in t for t in per_kernel)})
    return out


def write_package(root: str) -> str:
    """The field package (`ltfield`: the kernels, and their lazytriton build) under root/pkg;
    returns root/pkg, the directory one_process puts on sys.path."""
    pkg = os.path.join(root, "pkg")
    os.makedirs(os.path.join(pkg, "ltfield"))
    with open(os.path.join(pkg, "ltfield", "__init__.py"), "w") as f:
        f.write(PKG_INIT)
    with open(os.path.join(pkg, "ltfield", "kernels.py"), "w") as f:
        f.write(textwrap.dedent(KERNELS))
    with open(os.path.join(pkg, "ltfield", "lazy.py"), "w") as f:
        f.write(LAZY)
    return pkg


def measure(repeat: int = 1, skip: set | None = None, say=print, saved=None) -> dict:
    """Every row's numbers (each a fresh process; cold rows `repeat` times,
    interleaved): {row: the median run's numbers with all_first_s, ...}; `saved(res)`
    after each group, so that a run cut short keeps the groups it finished."""
    skip = skip or set()
    root = tempfile.mkdtemp(prefix="lt-cold-field-")
    pkg = write_package(root)
    res: dict = {}

    def fresh(name):
        d = os.path.join(root, name)
        os.makedirs(d)
        return d

    def cold(rows: list[tuple[str, str, dict, str]]) -> dict:
        """Runs each row `repeat` times, interleaved (fresh process, fresh caches each
        time); keeps for each row the run of median first_s, all first_s and its first
        run's cache directory (for the warm rows)."""
        runs: dict = {name: [] for name, *_ in rows}
        dirs: dict = {}
        for i in range(repeat):
            for name, script, env, label in rows:
                d = fresh(f"{name}-{i}")
                dirs.setdefault(name, d)
                r = one_process(script, env, pkg, d, label + (f" (run {i + 1})" if repeat > 1 else ""), say)
                if not r.get("failed"):
                    runs[name].append(r)
        for name, rs in runs.items():
            if rs:
                rs.sort(key=lambda r: r["first_s"])
                res[name] = dict(rs[len(rs) // 2], all_first_s=[r["first_s"] for r in rs],
                                 all_timings=[r["timings"] for r in rs if r.get("timings")])
            else:
                res[name] = {"failed": True}
        return dirs

    if "one" not in skip:
        say("one 8-config matmul in a heavy package, standalone and lazytriton.jax, cold (fresh process and caches):")
        dirs = cold([("lazytriton", ONE, {"LT_MODE": "lazy"}, "lazytriton"),
                     ("threads", ONE, {"LT_MODE": "lazy", "LAZYTRITON_COMPILE_WORKERS": "0"}, "in-process threads"),
                     ("triton", ONE, {"LT_MODE": "triton"}, "Triton's autotuner"),
                     ("jax_one", ONE_JAX, {}, "lazytriton.jax"),
                     ("jax_one_threads", ONE_JAX, {"LAZYTRITON_COMPILE_WORKERS": "0"},
                      "lazytriton.jax, in-process threads")])
        res["warm"] = one_process(ONE, {"LT_MODE": "lazy"}, pkg, dirs["lazytriton"], "warm start, new process", say)
        if saved:
            saved(res)
    if "jax" not in skip:
        say("16 autotuned call sites under one jax.jit, first step (fresh process and caches):")
        dirs = cold([("jax_ahead", JAX16, {}, "JAX, compiled ahead at lowering"),
                     ("jax_serial", JAX16, {"LAZYTRITON_COMPILE_AHEAD": "0"}, "JAX, LAZYTRITON_COMPILE_AHEAD=0")])
        res["jax_warm"] = one_process(JAX16, {}, pkg, dirs["jax_ahead"], "JAX, warm start, new process", say)
        if "timings" in res["jax_serial"]:
            res["jax_reference"] = reference(res["jax_serial"]["timings"])
            res["jax_reference_medians"] = reference(median_timings(res["jax_serial"]["all_timings"]))
        if saved:
            saved(res)
    if "standalone" not in skip:
        say("the same 16 calls, standalone face, first calls (fresh process and caches):")
        dirs = cold([("sa_ahead", STANDALONE16, {"LT_AHEAD": "1"}, "standalone, compile_ahead at start"),
                     ("sa_serial", STANDALONE16, {}, "standalone, no compile_ahead")])
        # Once: where the program does not wrap its kernels before making its data.
        res["sa_late"] = one_process(STANDALONE16, {"LT_AHEAD": "1", "LT_WRAP": "late"}, pkg, fresh("sa_late"),
                                     "standalone, compile_ahead at start, kernels wrapped after the data (once)", say)
        res["sa_warm"] = one_process(STANDALONE16, {}, pkg, dirs["sa_ahead"], "standalone, warm start, new process", say)
        if "timings" in res["sa_serial"]:
            res["sa_reference"] = reference(res["sa_serial"]["timings"])
            res["sa_reference_medians"] = reference(median_timings(res["sa_serial"]["all_timings"]))
        if saved:
            saved(res)
    shutil.rmtree(root, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write every row's numbers here (JSON)")
    p.add_argument("--repeat", type=int, default=1, help="cold rows: runs each (interleaved); the median is reported")
    p.add_argument("--skip", default="", help="comma-separated groups to skip: one, jax, standalone")
    opts = p.parse_args(argv)

    def save(res: dict) -> None:
        if opts.out:
            with open(opts.out, "w") as f:
                json.dump(res, f, indent=1)

    res = measure(opts.repeat, set(filter(None, opts.skip.split(","))), saved=save)
    print("\n| row | first call / step (s) | ratio |")
    print("| --- | --- | --- |")

    def fs(name):
        return res.get(name, {}).get("first_s")

    def line(label, name, base=None, base_label=""):
        v = fs(name) if isinstance(name, str) else name
        if v is None:
            return
        ratio = f"{v / base:.2f}x {base_label}" if base else ""
        print(f"| {label} | {v:.2f} | {ratio} |")

    line("lazytriton, heavy package, cold", "lazytriton", fs("threads"), "in-process threads")
    line("in-process threads (LAZYTRITON_COMPILE_WORKERS=0)", "threads")
    line("Triton's autotuner", "triton")
    if fs("lazytriton") and fs("triton"):
        print(f"| lazytriton / Triton's autotuner | | {fs('lazytriton') / fs('triton'):.2f}x |")
    line("warm start, new process", "warm", fs("lazytriton"), "cold")
    line("lazytriton.jax, heavy package, cold", "jax_one", fs("jax_one_threads"), "its in-process threads")
    line("lazytriton.jax, in-process threads (LAZYTRITON_COMPILE_WORKERS=0)", "jax_one_threads")
    for face, what, p in (("JAX", "16 sites", "jax"), ("standalone", "16 calls", "sa")):
        ahead, serial, warm, ref = f"{p}_ahead", f"{p}_serial", f"{p}_warm", res.get(f"{p}_reference", {})
        line(f"{face} {what}, compiled ahead", ahead, ref.get("ref_s"), "reference")
        line(f"{face} {what}, not compiled ahead", serial, ref.get("ref_s"), "reference")
        if p == "sa":
            line(f"{face} {what}, compiled ahead, kernels wrapped after the data", "sa_late", ref.get("ref_s"),
                 "reference")
        line(f"{face} reference (slowest compile + sum of tunes)", ref.get("ref_s"))
        med = res.get(f"{p}_reference_medians", {}).get("ref_s")
        if med and len(res.get(serial, {}).get("all_timings", [])) > 1:
            line(f"{face} {what}, compiled ahead, against the reference from each kernel's medians over the "
                 "serial runs", ahead, med, "median reference")
            line(f"{face} reference from each kernel's medians over the serial runs", med)
        line(f"{face} {what}, compiled ahead, against the tails of the tunes (the reference until the tuner "
             "counted its seconds)", ahead, ref.get("tail_ref_s"), "slowest compile + tails")
        line(f"{face} floor (all compile seconds / cores + last tune)", ref.get("floor_s"))
        line(f"{face} {what}, compiled ahead, against the floor", ahead, ref.get("floor_s"), "floor")
        line(f"{face} warm start, new process", warm)
    for note in breakdown_notes(res):
        print(note)
    for name in ("warm", "jax_warm", "sa_warm"):
        r = res.get(name, {})
        if "compiles" in r:
            print(f"{name}: compiles {r['compiles']}, tunes {r['tunes']}, winners from the cache {r['record_hits']}")
    save(res)
    return 0


# -- the harness's group (lazytriton bench --only field) --------------------------------------

ONE_ROWS = ["lazytriton (compile server), heavy package, cold", "in-process threads (LAZYTRITON_COMPILE_WORKERS=0)",
            "Triton's @triton.autotune, cold", "lazytriton, warm start in a new process",
            "lazytriton.jax (compile server), heavy package, first execution",
            "lazytriton.jax, in-process threads (LAZYTRITON_COMPILE_WORKERS=0)"]
PROGRAM_ROWS = ["JAX: compiled ahead at lowering", "JAX: LAZYTRITON_COMPILE_AHEAD=0", "JAX: warm start in a new process",
                "JAX reference: slowest kernel's compile + sum of tunes", "standalone: compile_ahead at start",
                "standalone: no compile_ahead", "standalone: warm start in a new process",
                "standalone reference: slowest kernel's compile + sum of tunes",
                "standalone: compile_ahead at start, kernels wrapped after the data (the compile server starting)"]


def sections(res: dict) -> dict:
    """measure()'s numbers as the harness's two sections."""
    from .common import row

    def rows_of(pairs):
        out = []
        for system, name, kind in pairs:
            r = res.get(name) or {}
            if "all_first_s" in r or "first_s" in r:
                out.append(row(system, kind, r.get("all_first_s") or [r["first_s"]],
                               **{k: r[k] for k in ("compiles", "tunes", "record_hits") if k in r}))
            elif "ref_s" in r:
                out.append(row(system, "floor", [r["ref_s"]], floor_s=r.get("floor_s")))
        return out

    def warm_note(n):
        return f"{n}: compiles {res[n]['compiles']}, tunes {res[n]['tunes']} (a new process on the cold run's caches)"

    one_notes = [warm_note("warm")] if "compiles" in res.get("warm", {}) else []
    jax_one, jax_threads = (res.get(n, {}).get("first_s") for n in ("jax_one", "jax_one_threads"))
    if jax_one and jax_threads:  # the section's ratios are to the standalone threads: this face's own, here
        one_notes.append(f"lazytriton.jax against its own in-process threads: {jax_one / jax_threads:.2f}x")
    notes = [warm_note(n) for n in ("jax_warm", "sa_warm") if "compiles" in res.get(n, {})]
    for n in ("jax_reference", "sa_reference"):
        if n in res:
            notes.append(f"{n}: slowest kernel's compile {res[n]['slowest_compile_s']:.2f} s + tunes "
                         f"{res[n]['sum_tunes_s']:.2f} s (the tuner's seconds in trials; what was left of the tunes "
                         f"once each kernel's last candidate was ready: {res[n].get('tail_tunes_s', 0.0):.2f} s); all "
                         f"compile seconds / {res[n]['cores']} cores + the last tune: {res[n]['floor_s']:.2f} s")
    failed = [f"{n}: FAILED ({r.get('error', '?')})" for n, r in res.items() if isinstance(r, dict) and r.get("failed")]
    return {
        "field": {"title": "First call of an 8-config matmul in a package whose import takes seconds (torch, jax), "
                           "fresh processes and caches",
                  "unit": "s", "better": "lower", "ratio_to": ONE_ROWS[1],
                  "notes": one_notes + failed,
                  "rows": rows_of([(ONE_ROWS[0], "lazytriton", "lazytriton"), (ONE_ROWS[1], "threads", "other"),
                                   (ONE_ROWS[2], "triton", "other"), (ONE_ROWS[3], "warm", "lazytriton"),
                                   (ONE_ROWS[4], "jax_one", "lazytriton"), (ONE_ROWS[5], "jax_one_threads", "other")])},
        "field_program": {"title": "First step of a program of 16 autotuned call sites (76 compiles), fresh "
                                   "processes and caches", "unit": "s", "better": "lower",
                          "ratio_to": PROGRAM_ROWS[3], "notes": notes + breakdown_notes(res) + failed,
                          "rows": rows_of([(PROGRAM_ROWS[0], "jax_ahead", "lazytriton"),
                                           (PROGRAM_ROWS[1], "jax_serial", "lazytriton"),
                                           (PROGRAM_ROWS[2], "jax_warm", "lazytriton"),
                                           (PROGRAM_ROWS[3], "jax_reference", "floor"),
                                           (PROGRAM_ROWS[4], "sa_ahead", "lazytriton"),
                                           (PROGRAM_ROWS[5], "sa_serial", "lazytriton"),
                                           (PROGRAM_ROWS[6], "sa_warm", "lazytriton"),
                                           (PROGRAM_ROWS[7], "sa_reference", "floor"),
                                           (PROGRAM_ROWS[8], "sa_late", "lazytriton")])},
    }


def run(progress, suite: str) -> dict:
    """The harness's group: every row in fresh processes, cold rows twice in the
    full suite (once otherwise): inside the harness's 300 s per process."""
    return {"sections": sections(measure(2 if suite == "full" else 1, say=progress))}


if __name__ == "__main__":
    sys.exit(main())
