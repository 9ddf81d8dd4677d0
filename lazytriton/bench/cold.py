"""First call of the 8-config autotuned matmul (2048^3 fp16), each row in a
fresh process: cold (empty lazytriton, Triton and JAX caches) and warm (a new
process on the caches a cold one left: the persisted winner), as a timeline of
phases from the moment the data is ready (and, where a redis-server is installed, a new process
with empty local caches that finds the cold process's winner in Redis: SEEDED_FROM):

- Triton's own @triton.autotune: compile and benchmark every config, serially;
- lazytriton standalone (torch arrays): binding and cache lookup, compiling the
  candidates (worker processes), tuning (overlapped with compiling, from the
  first two compiled), the launch-stub build (g++, in the background) and the
  first launch; lazytriton.runtime.resolve.timings() and the `lazytriton` logger say
  when each ended;
- JAX (lazytriton.jax, jax-triton): jit(...).lower(), XLA's compile, the first
  execution (lazytriton: compile and tune inside it; the FFI handler's build).

Each process runs one of the scripts below with `python -c` (nothing imported
before its clock starts) and writes one JSON object to the path in argv[1];
phases() turns it into the section's row.
"""
from __future__ import annotations

import importlib.util

from .common import row

PRELUDE = r"""
import json, os, sys, time
t_start = time.perf_counter()
OUT = sys.argv[1]
def done(r):
    with open(OUT, "w") as f:
        json.dump(r, f)
def from_ready(timeline, t_ready):  # the compile server's start-up, from the data being ready
    return {k: v - t_ready if k.endswith("_at") else v for k, v in timeline.items()}
"""

# The same inputs, timing start and error check for every first-call script of the 2048^3 matmul.
MATMUL_INPUTS = r"""
M = N = K = 2048
torch.manual_seed(0)
a = torch.randn(M, K, device="cuda", dtype=torch.float16); b = torch.randn(K, N, device="cuda", dtype=torch.float16)
c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t_ready = time.perf_counter()
grid = lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))
"""
MATMUL_ERR = r"""
ref = a.float() @ b.float()
err, ref_max = (c.float() - ref).abs().max().item(), ref.abs().max().item()
"""

# What isolating first launches did (issue 50), read right after the first calls, while the helper
# process lives: its verdicts, its resident memory, and the device memory its context holds (the
# device's free memory with it and after it is ended; nothing else runs on the device meanwhile).
ISOLATION_REPORT = r"""
def isolation_report():
    from lazytriton.runtime import isolation
    r = {"stats": isolation.stats()}
    pids = isolation.helper_pids()
    if pids:
        try:
            with open(f"/proc/{pids[0]}/status") as f:
                r["helper_rss_bytes"] = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            pass
        import torch
        free_with = torch.cuda.mem_get_info()[0]
        isolation.shutdown()
        time.sleep(0.5)
        r["helper_device_bytes"] = torch.cuda.mem_get_info()[0] - free_with
    return r
"""

# Wrapping the kernel (where lazytriton starts its compile server) happens at
# import time, as a decorator in a user's module would; then the data; then the call.
LAZY = PRELUDE + ISOLATION_REPORT + r"""
import logging
import torch, triton, lazytriton
from lazytriton.compile import pool as compile_pool
from lazytriton.runtime import resolve, stubgen, torch_reader
from lazytriton.demo_kernels import demo_matmul

class Events(logging.Handler):  # when the background stub build started and ended
    def __init__(self):
        super().__init__(logging.INFO)
        self.seen = []
    def emit(self, record):
        self.seen.append((time.perf_counter(), record.getMessage()))
events = Events()
log = logging.getLogger("lazytriton")
log.addHandler(events)
log.setLevel(logging.INFO)

k = lazytriton.kernel(demo_matmul)
t_wrap = time.perf_counter()
GAP_S = float(os.environ.get("LAZYTRITON_BENCH_WRAP_GAP_S", "0"))  # the program's other set-up, if any
if GAP_S:
    time.sleep(GAP_S)
""" + MATMUL_INPUTS + r"""k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
torch.cuda.synchronize()
t_first = time.perf_counter()
k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
torch.cuda.synchronize()
t_second = time.perf_counter()
isolated = isolation_report()
stubgen.wait_for_builds(120)
torch_reader.wait(300)  # its build (started by the first call) ends before the next process is timed
server = from_ready(compile_pool.server_timeline(), t_ready)
""" + MATMUL_ERR + r"""stub = [(t - t_ready, m) for t, m in events.seen if "launch stub" in m and m.startswith(("building", "built"))]
done({"imports_s": t_ready - t_start, "first_call_s": t_first - t_ready, "steady_call_s": t_second - t_first,
      "max_err": err, "ref_max": ref_max, "stats": lazytriton.stats(), "stub_events": stub, "server": server,
      "wrapped_s": t_wrap - t_ready, "isolation": isolated,
      "resolutions": [dict(r, at=r["at"] - t_ready) for r in resolve.timings()]})
"""

TRITON = PRELUDE + r"""
import torch, triton
from lazytriton.demo_kernels import demo_matmul
""" + MATMUL_INPUTS + r"""demo_matmul[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
torch.cuda.synchronize()
t_first = time.perf_counter()
""" + MATMUL_ERR + r"""done({"imports_s": t_ready - t_start, "first_call_s": t_first - t_ready, "max_err": err, "ref_max": ref_max})
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
ref = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
err, ref_max = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref))), float(jnp.max(jnp.abs(ref)))
r = {"imports_s": t_import - t_start, "backend_s": t_ready - t_import, "lower_s": t_lower - t_ready,
     "xla_compile_s": t_compile - t_lower, "execute_s": t_first - t_compile, "first_call_s": t_first - t_ready,
     "max_err": err, "ref_max": ref_max}
"""
JAX_LAZY = PRELUDE + r"""
import lazytriton.jax
def triton_call(*args, out_shape, **kwargs):
    return lazytriton.jax.triton_call(*args, out_type=out_shape, **kwargs)
""" + JAX_CALL + r"""
from lazytriton.jax import ffi as jax_ffi
from lazytriton.runtime import resolve
h = jax_ffi.handler_info()
# How the FFI handler became ready, and when from the data being ready (> 0: lowering waited for it).
r["handler"] = {"how": h.get("how"), "seconds": h.get("seconds"),
                "ready_after_s": h["ready_at"] - t_ready if "ready_at" in h else None}
r["resolutions"] = [dict(x, at=x["at"] - t_ready) for x in resolve.timings()]
from lazytriton.compile import pool as compile_pool
r["server"] = from_ready(compile_pool.server_timeline(), t_ready)
r["stats"] = lazytriton.stats()
done(r)
"""
JAX_TRITON = PRELUDE + "from jax_triton import triton_call\n" + JAX_CALL + "\ndone(r)\n"

# (group, row, kind, script, extra environment, cache shared with, suites, module it needs)
ROWS = [
    ("cold-triton", "Triton's @triton.autotune, cold", "other", TRITON, {}, None, ("quick", "full"), "torch"),
    ("cold-lazy", "lazytriton, cold", "lazytriton", LAZY, {}, None, ("quick", "full"), "torch"),
    ("warm-lazy", "lazytriton, warm (new process, persisted winner)", "lazytriton", LAZY, {}, "cold-lazy",
     ("quick", "full"), "torch"),
    # The compile server starts when a kernel is wrapped; the script above calls at once, so the server's
    # start-up (about 0.5 s) is on its path. A program with other set-up in between does not pay it:
    # A new host: empty local caches (lazytriton's, Triton's), the winner the cold row tuned found in Redis
    # (SEEDED_FROM); beside the warm row above (same run, same winner), its bar is within 1.5x of it.
    ("warm-redis", "lazytriton, warm from Redis (new process, empty local cache)", "lazytriton", LAZY, {}, None,
     ("quick", "full"), "torch"),
    # The same two warm starts in a program with 1 s of its own set-up between wrapping the kernel and
    # the data (loading weights, say): importing lazytriton starts importing Redis' client (0.2-0.4 s)
    # and connecting, which the rows above, calling at once, wait for.
    ("warm-lazy-gap", "lazytriton, warm (new process, persisted winner), kernel wrapped 1 s before the data",
     "lazytriton", LAZY, {"LAZYTRITON_BENCH_WRAP_GAP_S": "1.0"}, "cold-lazy", ("quick", "full"), "torch"),
    ("warm-redis-gap", "lazytriton, warm from Redis (new process, empty local cache), kernel wrapped 1 s before "
     "the data", "lazytriton", LAZY, {"LAZYTRITON_BENCH_WRAP_GAP_S": "1.0"}, None, ("quick", "full"), "torch"),
    ("cold-lazy-gap", "lazytriton, cold, kernel wrapped 1.5 s before the data", "lazytriton", LAZY,
     {"LAZYTRITON_BENCH_WRAP_GAP_S": "1.5"}, None, ("full",), "torch"),
    ("cold-jax", "lazytriton.jax, cold", "lazytriton", JAX_LAZY, {}, None, ("quick", "full"), "jax"),
    ("warm-jax", "lazytriton.jax, warm (new process, persisted winner)", "lazytriton", JAX_LAZY, {}, "cold-jax",
     ("full",), "jax"),
    ("cold-jax-runtime-handler", "lazytriton.jax, cold, FFI handler built at run time", "lazytriton", JAX_LAZY,
     {"LAZYTRITON_PREBUILT_HANDLER": "0"}, None, ("full",), "jax"),
    ("cold-jax-triton", "jax-triton, cold", "other", JAX_TRITON, {}, None, ("quick", "full"), "jax_triton"),
]


# Rows run with LAZYTRITON_REMOTE_CACHE set to the run's own Redis server (bench/redis_server.py), which
# holds what the named group's process of the same repetition tuned (`lazytriton cache push`), and
# nothing else; they run only where `redis-server` and the redis client are installed.
SEEDED_FROM = {"warm-redis": "cold-lazy", "warm-redis-gap": "cold-lazy"}
# Rows beside the Redis rows only (their comparison): with --only first_call where Redis runs.
WITH_REDIS = {"warm-lazy-gap"}


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def phases(raw: dict) -> list[list]:
    """[lane, start_s, end_s] from the data being ready, for the timeline plot."""
    out = []
    first = raw["first_call_s"]
    if "lower_s" in raw:  # JAX
        lo, xc = raw["lower_s"], raw["xla_compile_s"]
        out += [["jit(...).lower()", 0.0, lo], ["XLA compile", lo, lo + xc], ["first execution", lo + xc, first]]
        h = raw.get("handler") or {}
        if h.get("how") and h.get("ready_after_s") is not None and h["ready_after_s"] > 0:
            end = h["ready_after_s"]
            out.append([f"FFI handler ({h['how']})", max(0.0, end - (h.get("seconds") or 0.0)), end])
    resolutions = raw.get("resolutions") or []
    for r in resolutions:
        start = r["at"] - r["tuned_s"]
        out += [["compile candidates", start, start + r["compiled_s"]], ["compile + tune (overlapped)", start, r["at"]]]
    server = raw.get("server") or {}
    # The compile server was still starting when the data was ready, and the call compiled.
    if server.get("ready_at", 0.0) > 0 and raw.get("resolutions"):
        out.append(["compile server start-up (background)", max(0.0, server["started_at"]), server["ready_at"]])
    stub = raw.get("stub_events") or []
    begin = next((t for t, m in stub if m.startswith("building")), None)
    end = next((t for t, m in stub if m.startswith("built")), None)
    if begin is not None and end is not None:
        out.append(["launch stub build (background)", begin, end])
    if "lower_s" not in raw:
        if resolutions:
            start = min(r["at"] - r["tuned_s"] for r in resolutions)
            out = [["bind + cache lookup", 0.0, start]] + out + [["first launch", max(r["at"] for r in resolutions),
                                                                  first]]
        elif "stats" in raw:  # lazytriton, warm: nothing compiled or tuned
            out.append(["cached winner: load + launch", 0.0, first])
        else:  # Triton's autotuner: one span
            out.append(["compile + benchmark every config (serial)", 0.0, first])
    return out


def to_row(group: str, raw: dict) -> dict:
    name, kind = next((r[1], r[2]) for r in ROWS if r[0] == group)
    split = {k: raw[k] for k in ("imports_s", "backend_s", "lower_s", "xla_compile_s", "execute_s", "steady_call_s")
             if k in raw}
    extra = {"phases": phases(raw), "split": split, "max_err": raw.get("max_err")}
    if raw.get("max_err") is not None and raw.get("ref_max") is not None:  # fp16 output of a 2048-long dot
        extra["correct"] = bool(raw["max_err"] <= 2e-2 * raw["ref_max"] + 1e-2)
    if "stats" in raw:
        extra["stats"] = {k: raw["stats"].get(k) for k in ("compiles", "tunes", "record_hits", "resolves")}
    if raw.get("handler"):
        extra["handler"] = raw["handler"]
    if raw.get("server"):  # the compile server's start-up, from the data being ready (< 0: before)
        extra["server"] = {k: round(v, 4) for k, v in raw["server"].items()}
    if "wrapped_s" in raw:
        extra["wrapped_s"] = round(raw["wrapped_s"], 4)
    return row(name, kind, [raw["first_call_s"]], **extra)


def section(rows: list[dict], notes: list[str]) -> dict:
    return {"title": "First call of an 8-config autotuned matmul (2048^3 fp16), fresh processes", "unit": "s",
            "better": "lower", "rows": rows, "ratio_to": "Triton's @triton.autotune, cold",
            "notes": notes + ["time from the data being ready to the first result; cold: empty lazytriton, Triton and "
                              "JAX caches; warm: a new process on the caches a cold one left (JAX's compilation "
                              "cache off: XLA compiles again)"]}
