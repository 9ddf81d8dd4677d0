"""What the harness measures. Each section returns
{"title", "unit", "better", "rows": [{"system", "kind", "samples", ...}], "notes"};
kind is "lazytriton", "other" (what a user would otherwise run) or "floor".

GPU sections run in a worker process each (the runner repeats them in several
processes); the cpu section needs no GPU and runs in the runner's process.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Callable

from .timing import interleaved

Progress = Callable[[str], None]


def _row(system: str, kind: str, samples: list[float], **extra) -> dict:
    return {"system": system, "kind": kind, "samples": [float(s) for s in samples], **extra}


# -- GPU sections ------------------------------------------------------------------------


def launch(progress: Progress, full: bool) -> dict:
    """Host cost per launch of a launch-bound kernel (vector add, 1024 elements)."""
    import torch
    import triton

    import lazytriton
    from lazytriton import _core

    from .kernels import add

    n, block, grid = 1024, 1024, (1,)
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    stream = torch.cuda.current_stream().cuda_stream
    sync = torch.cuda.synchronize
    k = lazytriton.kernel(add)
    k[grid](x, y, out, n, BLOCK=block, stream=stream)
    add[grid](x, y, out, n, BLOCK=block)
    sync()
    kern = next(iter(k._kernels.values()))
    types, vals = ["*fp32", "*fp32", "*fp32", "i32"], [x.data_ptr(), y.data_ptr(), out.data_ptr(), n]

    def lazy_torch(b):
        for _ in range(b):
            k[grid](x, y, out, n, BLOCK=block, stream=stream)

    def triton_launcher(b):
        for _ in range(b):
            add[grid](x, y, out, n, BLOCK=block)

    paths = {
        "raw cuLaunchKernel loop (C++)": lambda b: _core.raw_launch_loop(kern, grid, stream, types, vals, b),
        "lazytriton C++ core loop": lambda b: _core.core_launch_loop(kern, grid, stream, types, vals, b),
        "lazytriton k[grid](...), torch": lazy_torch,
        "Triton's launcher kernel[grid](...)": triton_launcher,
    }
    try:
        import cupy

        xc, yc, oc = (cupy.asarray(t) for t in (x, y, out))

        def lazy_cupy(b):
            for _ in range(b):
                k[grid](xc, yc, oc, n, BLOCK=block, stream=stream)

        paths["lazytriton k[grid](...), CuPy"] = lazy_cupy
    except ImportError:
        pass
    batch = 200
    progress(f"launch: {len(paths)} paths, interleaved")
    samples = interleaved(paths, sync, rounds=60 if full else 30, batch=batch)
    # Floor: the same kernel recorded `batch` times into a CUDA graph, replayed.
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with torch.cuda.graph(g, stream=side):
            for _ in range(batch):
                k[grid](x, y, out, n, BLOCK=block, stream=torch.cuda.current_stream().cuda_stream)
    from triton.testing import do_bench

    replay = do_bench(g.replay, warmup=5, rep=100, return_mode="all")  # ms per replay, device time
    sync()
    assert torch.equal(out, x + y), "vector add gave a wrong result"
    kinds = {"raw cuLaunchKernel loop (C++)": "floor", "Triton's launcher kernel[grid](...)": "other"}
    rows = [_row(name, kinds.get(name, "lazytriton"), s) for name, s in samples.items()]
    rows.append(_row("CUDA graph replay, per kernel", "floor", [t * 1e3 / batch for t in replay]))
    return {"title": "Host cost per launch (vector add, 1024 elements)", "unit": "us/launch", "better": "lower",
            "ratio_to": "raw cuLaunchKernel loop (C++)", "rows": rows,
            "notes": [f"median of {batch}-launch batches, rounds interleaved; graph replay: per kernel of a "
                      f"{batch}-kernel graph"]}


def _ceilings(progress: Progress) -> dict:
    """The device's copy bandwidth (GB/s) and fp16 matmul rate (TFLOP/s), measured."""
    import torch
    from triton.testing import do_bench

    progress("ceilings: copy bandwidth, fp16 matmul rate")
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    t = do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    tm = do_bench(lambda: a @ a, warmup=10, rep=100, return_mode="median")
    return {"copy_GBps": 2 * src.numel() * 4 / t / 1e6, "matmul_TFLOPs": 2 * 8192 ** 3 / tm / 1e9}


def _workloads(full: bool):
    """(name, setup) pairs; setup() -> (lazytriton call, reference call or None, check, bytes, flops, kernel, grid,
    args, meta) for the tuning section."""
    import torch
    import triton

    import lazytriton
    from lazytriton.demo_kernels import demo_matmul

    from . import kernels as bk

    def softmax(rows=8192, cols=4096):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
        y = torch.empty_like(x)
        k = lazytriton.kernel(bk.softmax)
        blk = triton.next_power_of_2(cols)
        args = (x, y, rows, cols, cols)
        return dict(run=lambda: k[(rows,)](*args, BLOCK=blk), ref=lambda: torch.softmax(x, -1),
                    check=lambda: torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=2e-3),
                    bytes=2 * x.numel() * 2, flops=0, kernel=bk.softmax, grid=lambda m: (rows,), args=args,
                    meta={"BLOCK": blk}, lazy=k, ref_name="torch.softmax")

    def layer_norm(rows=8192, cols=4096):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
        w, b = torch.randn(cols, device="cuda"), torch.randn(cols, device="cuda")
        y = torch.empty_like(x)
        k = lazytriton.kernel(bk.layer_norm)
        blk = triton.next_power_of_2(cols)
        args = (x, y, w, b, cols, cols, 1e-5)
        ref = lambda: torch.nn.functional.layer_norm(x.float(), (cols,), w, b, 1e-5)  # noqa: E731
        wh, bh = w.half(), b.half()
        return dict(run=lambda: k[(rows,)](*args, BLOCK=blk),
                    ref=lambda: torch.nn.functional.layer_norm(x, (cols,), wh, bh, 1e-5),
                    check=lambda: torch.allclose(y.float(), ref(), atol=3e-2), bytes=2 * x.numel() * 2, flops=0,
                    kernel=bk.layer_norm, grid=lambda m: (rows,), args=args, meta={"BLOCK": blk}, lazy=k,
                    ref_name="torch layer_norm")

    def matmul(m, n, kk):
        a = torch.randn(m, kk, device="cuda", dtype=torch.float16)
        b = torch.randn(kk, n, device="cuda", dtype=torch.float16)
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        k = lazytriton.kernel(demo_matmul)
        args = (a, b, c, m, n, kk, kk, 1, n, 1, n, 1)
        grid = lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"]))  # noqa: E731
        return dict(run=lambda: k[grid](*args), ref=lambda: a @ b,
                    check=lambda: torch.allclose(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=0.5),
                    bytes=0, flops=2 * m * n * kk, kernel=demo_matmul, grid=grid, args=args, meta={}, lazy=k,
                    ref_name="torch.matmul (cuBLAS)")

    def permute(rows=8192, cols=2048):
        inp = torch.randn(rows, cols, device="cuda")
        dst = torch.randperm(rows, device="cuda", dtype=torch.int32)
        out = torch.empty_like(inp)
        k = lazytriton.kernel(bk.permute_rows)
        args = (inp, dst, out, cols)
        want, dst64 = torch.empty_like(inp), dst.long()
        return dict(run=lambda: k[(rows,)](*args), ref=lambda: want.index_copy_(0, dst64, inp),
                    check=lambda: torch.equal(out, torch.empty_like(inp).index_copy_(0, dst64, inp)),
                    bytes=2 * inp.numel() * 4, flops=0, kernel=bk.permute_rows, grid=lambda m: (rows,), args=args,
                    meta={}, lazy=k, ref_name="torch index_copy_")

    def inplace(n=1 << 26):
        x = torch.randn(n, device="cuda")
        x0 = x.clone()
        k = lazytriton.kernel(bk.scale_inplace)
        grid = lambda m: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731
        state = {"calls": 0}

        def run():
            state["calls"] += 1
            k[grid](x, n, 1.0)  # alpha 1: repeatable; the first call is checked against x0

        first = {}

        def check():
            return first.get("ok", True)

        def first_call():
            k[grid](x, n, 2.0)
            torch.cuda.synchronize()
            first["ok"] = torch.equal(x, x0 * 2)  # tuning left exactly one update
        return dict(run=run, first=first_call, ref=lambda: x.mul_(1.0), check=check, bytes=2 * n * 4, flops=0,
                    kernel=bk.scale_inplace, grid=grid, args=(x, n, 1.0), meta={}, lazy=k, ref_name="torch mul_")

    out = [("softmax 8192x4096 fp16", softmax), ("layer norm 8192x4096 fp16", layer_norm),
           ("matmul 4096^3 fp16", lambda: matmul(4096, 4096, 4096)),
           ("permute rows 8192x2048 fp32", permute), ("in-place scale 64M fp32 (aliased)", inplace)]
    if full:
        out += [("matmul 1024x1024x8192 fp16", lambda: matmul(1024, 1024, 8192)),
                ("matmul 8192x256x4096 fp16", lambda: matmul(8192, 256, 4096))]
    return out


def throughput(progress: Progress, full: bool) -> dict:
    """Kernel time of each tuned workload, lazytriton beside the reference op;
    achieved TB/s or TFLOP/s against the measured ceilings. Also the tuning
    section's data: every config timed with Triton's own launch."""
    import torch
    from triton.testing import do_bench

    ceil = _ceilings(progress)
    rows, tuning = [], []
    for name, setup in _workloads(full):
        progress(f"throughput: {name}")
        w = setup()
        t0 = time.perf_counter()
        (w.get("first") or w["run"])()  # the first call: compile (cache) + tune on these arguments
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        w["run"]()
        torch.cuda.synchronize()
        ok = bool(w["check"]())
        lazy = do_bench(w["run"], warmup=20, rep=200, return_mode="all")
        ref = do_bench(w["ref"], warmup=20, rep=200, return_mode="all")
        rate = (lambda ms: w["flops"] / ms / 1e9) if w["flops"] else (lambda ms: w["bytes"] / ms / 1e6)
        unit = "TFLOP/s" if w["flops"] else "GB/s"
        ceiling = ceil["matmul_TFLOPs"] if w["flops"] else ceil["copy_GBps"]
        rows.append(_row(f"{name}: lazytriton", "lazytriton", [t * 1e3 for t in lazy], workload=name, correct=ok,
                         rate=[rate(t) for t in lazy], rate_unit=unit, ceiling=ceiling, first_call_s=first_s))
        rows.append(_row(f"{name}: {w['ref_name']}", "other", [t * 1e3 for t in ref], workload=name,
                         rate=[rate(t) for t in ref], rate_unit=unit, ceiling=ceiling))
        tuning.append(_tuning_quality(name, w, progress))
    return {"title": "Kernel time of tuned workloads", "unit": "us", "better": "lower", "rows": rows,
            "ceilings": ceil, "tuning": tuning,
            "notes": ["do_bench medians; rate = bytes moved (or flops) / time, against the device's measured "
                      "copy bandwidth (1 GiB copy) and fp16 matmul rate (8192^3 torch.matmul)"]}


def _tuning_quality(name: str, w: dict, progress: Progress) -> dict:
    """Chosen config vs the exhaustive best, every config timed with Triton's own launch."""
    from triton.testing import do_bench

    rec = w["lazy"].records[-1] if w["lazy"].records else None
    configs = w["kernel"].configs
    times = []
    for cfg in configs:
        meta = {**cfg.kwargs, **w["meta"]}
        g = w["grid"](meta)
        launch = lambda: w["kernel"].fn[g](*w["args"], **meta, num_warps=cfg.num_warps,  # noqa: E731
                                           num_stages=cfg.num_stages)
        try:
            times.append(do_bench(launch, warmup=20, rep=100, return_mode="median") * 1e3)
        except Exception:  # noqa: BLE001  (out of resources: cannot win)
            times.append(float("inf"))
    chosen = rec.winner_index if rec is not None else None
    best = min(range(len(times)), key=lambda i: times[i])
    if w.get("first"):
        w["first"]()  # the in-place workload: configs above ran x * 1.0; nothing to restore
    return {"workload": name, "configs": [str(c) for c in configs], "times_us": times, "chosen": chosen,
            "best": best, "ratio": times[chosen] / times[best] if chosen is not None else None}


GPU_SECTIONS = {"launch": launch, "throughput": throughput}


# -- the cpu section -------------------------------------------------------------------------


def cpu(progress: Progress, full: bool) -> dict:
    """What needs no GPU: jit(...).lower() of the 8-config matmul, compile time
    of each config for sm_90 (fresh Triton cache), launch-stub build time."""
    rows, notes = [], []
    progress("cpu: lowering the 8-config matmul for CUDA")
    lowering = _lowering_ms(reps=5 if full else 3)
    if lowering is not None:
        rows.append(_row("lazytriton.jax: jit(...).lower() of the 8-config matmul", "lazytriton", lowering))
    else:
        notes.append("JAX not importable: no lowering row")
    progress("cpu: compiling each demo config for sm_90 in a fresh Triton cache")
    rows += _compile_rows()
    progress("cpu: building a launch stub for a new argument shape")
    rows.append(_row("launch stub build (generated C, g++)", "lazytriton", [_stub_build_ms()]))
    return {"title": "Without a GPU: lowering, compile per config (sm_90), stub build", "unit": "ms",
            "better": "lower", "rows": rows, "notes": notes}


def _lowering_ms(reps: int) -> list[float] | None:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    import triton

    from lazytriton.demo_kernels import demo_matmul
    from lazytriton.jax import triton_call

    m = n = k = 2048
    a = jax.ShapeDtypeStruct((m, k), jnp.float16)
    out = []
    for _ in range(reps):
        def mm(x, y):  # a new function each time: nothing cached by JAX
            return triton_call(x, y, M=m, N=n, K=k, sam=k, sak=1, sbk=n, sbn=1, scm=n, scn=1, kernel=demo_matmul,
                               out_shape=jax.ShapeDtypeStruct((m, n), jnp.float16),
                               grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])))
        t0 = time.perf_counter()
        jax.jit(mm).trace(a, a).lower(lowering_platforms=("cuda",))
        out.append((time.perf_counter() - t0) * 1e3)
    return out


_COMPILE_ONE = r"""
import json, sys, time
from lazytriton.arrays import PointerArg
from lazytriton.compiler import Binder, Candidate, compile_one, default_target
from lazytriton.demo_kernels import DEMO_CONFIGS, demo_matmul
from lazytriton.spec import describe
spec, target = describe(demo_matmul), default_target()
binder = Binder(spec, target)
p = PointerArg(1 << 20, "fp16")
cfg = DEMO_CONFIGS[int(sys.argv[1])]
bound = binder.bind((p, p, p, 2048, 2048, 2048, 2048, 1, 2048, 1, 2048, 1), cfg.all_kwargs())
t0 = time.perf_counter()
compile_one(spec, target, bound)
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))
"""


def _compile_rows() -> list[dict]:
    """One fresh process and Triton cache per config: what a cold compile costs."""
    import json

    from lazytriton.demo_kernels import DEMO_CONFIGS

    rows = []
    for i, cfg in enumerate(DEMO_CONFIGS):
        with tempfile.TemporaryDirectory() as d:
            env = {**os.environ, "TRITON_CACHE_DIR": d, "TRITON_DEFAULT_FP_FUSION": "1"}
            r = subprocess.run([sys.executable, "-c", _COMPILE_ONE, str(i)], capture_output=True, text=True,
                               env=env, timeout=600)
        ms = json.loads(r.stdout.strip().splitlines()[-1])["ms"] if r.returncode == 0 else float("nan")
        label = ", ".join(f"{k}={v}" for k, v in cfg.kwargs.items()) + f", warps={cfg.num_warps}, stages={cfg.num_stages}"
        rows.append(_row(f"compile config {i} ({label})", "lazytriton", [ms], config=str(cfg)))
    return rows


_STUB_BUILD = r"""
import json, time
from lazytriton import stubgen
from lazytriton.arrays import DeviceArray
from lazytriton.bench.kernels import permute_rows
from lazytriton.runtime import LazyKernel
a, idx = DeviceArray(1 << 20, "fp32", 4096), DeviceArray(1 << 21, "i32", 64)
shape = LazyKernel(permute_rows)._shape((a, idx, a, 1000))
t0 = time.perf_counter()
stubgen.load_stub(shape)
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))
"""


def _stub_build_ms() -> float:
    """A generated stub built synchronously in a fresh process and an empty cache."""
    import json

    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "LAZYTRITON_CACHE_DIR": d, "LAZYTRITON_STUB_BUILD": "sync",
               "LAZYTRITON_COMPILE_WORKERS": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
        r = subprocess.run([sys.executable, "-c", _STUB_BUILD], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"stub build failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["ms"]
