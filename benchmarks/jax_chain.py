"""Per-kernel time of a jitted chain of 32 tiny Triton kernels, side by side:

  lazytriton, command buffers on    every custom call captured into a CUDA graph
  lazytriton, command buffers off   the handler launches from C++ on every call
  jax-triton, command buffers on    (when jax_triton imports; its calls are never captured)
  floor: XLA FFI call               a custom call that launches nothing, then one
                                    that does a plain cuLaunchKernel of the same cubin
                                    (benchmarks/ffi_floor.cc): XLA's own cost per call
  floor: CUDA graph replay          32 captured launches of the same cubin, replayed
  floor: raw cuLaunchKernel loop    host cost per launch from C++ on the same cubin

and the time of jit(...).lower() for an 8-config autotuned matmul. XLA_FLAGS
is read once per process, so each configuration runs in its own process.
    python benchmarks/jax_chain.py
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
N, CHAIN, ITERS, ROUNDS = 1024, 32, 200, 15
CB_ON = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
CB_OFF = "--xla_gpu_enable_command_buffer="


def chain_fn(call, kernel):
    import triton

    def chain(x):
        for _ in range(CHAIN):
            x = call(x, N, kernel=kernel, out_shape=x, grid=lambda m: (triton.cdiv(N, m["BLOCK"]),), BLOCK=1024)
        return x
    return chain


def add_one_cubin():
    """The add-one kernel compiled by lazytriton (on a CuPy array): (Kernel, array, stream)."""
    import cupy
    import lazytriton

    sys.path.insert(0, str(TESTS))
    from kernels import jaxk

    x = cupy.zeros(N, cupy.float32)
    k = lazytriton.kernel(jaxk.add_one_kernel)
    s = cupy.cuda.Stream(non_blocking=True)
    k[(1,)](x, N, x, BLOCK=1024, stream=s.ptr)
    s.synchronize()
    return next(iter(k._kernels.values())), x, s


def ffi_floor(kind: str):
    """A call of benchmarks/ffi_floor.cc's `kind` handler ("noop" or "raw"), and its run counter."""
    import hashlib

    import jax
    from lazytriton import stubgen

    src = Path(__file__).with_name("ffi_floor.cc").read_text()
    tag = "-bench" + hashlib.sha256(src.encode()).hexdigest()[:8]
    mod = stubgen.load_module("lt_bench_ffi", lambda: src, "the FFI floor handlers",
                              extra_flags=(f"-I{jax.ffi.include_dir()}",), tag=tag)
    if kind == "raw":
        kern, _, _ = add_one_cubin()
        mod.set_cubin(kern.cubin, kern.name, 32 * kern.metadata["num_warps"], N)
    jax.ffi.register_ffi_target(f"lt_bench_{kind}", mod.handlers()[kind], platform="CUDA")
    return (lambda x: jax.ffi.ffi_call(f"lt_bench_{kind}", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)), mod.runs


def time_chain(which: str) -> dict:
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(TESTS))
    from kernels import jaxk

    runs = None  # the handler's run counter, where there is one
    if which.startswith("ffi-"):
        call, runs = ffi_floor(which.split("-")[1])

        def chain(x):
            for _ in range(CHAIN):
                x = call(x)
            return x
        f = jax.jit(chain, donate_argnums=(0,) if which.endswith("donated") else ())
    elif which.startswith("xla"):  # XLA's own kernels, kept apart: what JAX and the graph cost per op
        def chain(x):
            for _ in range(CHAIN):
                x = jax.lax.optimization_barrier(x + 1.0)
            return x
        f = jax.jit(chain, donate_argnums=(0,) if which.endswith("donated") else ())
    else:
        if which == "jax-triton":
            import jax_triton

            call = jax_triton.triton_call
        else:
            from lazytriton.jax import triton_call as call
        # Donating x keeps the chain's input and output buffers where they are
        # (as in a training loop); otherwise every call brings new addresses,
        # and XLA re-records the custom calls that touch them.
        f = jax.jit(chain_fn(call, jaxk.add_one_kernel), donate_argnums=(0,) if which.endswith("donated") else ())
    x = jnp.zeros(N, jnp.float32)
    for _ in range(5):
        x = f(x)
    x.block_until_ready()
    per = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(ITERS):
            x = f(x)
        x.block_until_ready()
        per.append((time.perf_counter() - t0) / (ITERS * CHAIN) * 1e6)
    expect = 0 if which.startswith("ffi-noop") else CHAIN * (5 + ROUNDS * ITERS)
    assert float(x[0]) == expect, (float(x[0]), expect)
    out = {"us_per_kernel": statistics.median(per)}
    if which.startswith("lazytriton"):
        from lazytriton.jax import handler_stats

        runs = lambda: handler_stats()["executes"]  # noqa: E731
    if runs:  # how often XLA ran the handler (capture or launch) per kernel call
        e0 = runs()
        for _ in range(ITERS):
            x = f(x)
        x.block_until_ready()
        out["handler_runs_per_kernel"] = (runs() - e0) / (ITERS * CHAIN)
    return out


def time_lowering(which: str) -> dict:
    import jax
    import jax.numpy as jnp
    import triton

    sys.path.insert(0, str(TESTS))
    from kernels import jaxk

    m = n = k = 2048
    if which == "jax-triton":
        import jax_triton

        call, kernel = jax_triton.triton_call, jaxk.matmul_kernel
    else:
        from lazytriton.jax import triton_call as call

        kernel = jaxk.matmul_kernel
    a = jax.ShapeDtypeStruct((m, k), jnp.float16)
    times = []
    for _ in range(1 if which == "jax-triton" else 7):
        def mm(x, y):  # a new function each time: nothing cached by jit
            return call(x, y, m, n, k, k, 1, n, 1, n, 1, kernel=kernel,
                        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float16),
                        grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])))
        t0 = time.perf_counter()
        jax.jit(mm).lower(a, a)
        times.append(time.perf_counter() - t0)
    return {"lower_ms": statistics.median(times[1:] or times) * 1e3}


def floors() -> dict:
    from lazytriton import _core

    kern, x, s = add_one_cubin()
    types, vals = ["*fp32", "i32", "*fp32"], [x.data.ptr, N, x.data.ptr]
    raw = []
    for _ in range(30):
        s.synchronize()
        raw.append(_core.raw_launch_loop(kern, (1,), s.ptr, types, vals, 200) / 200 * 1e6)
    with s:
        s.begin_capture()
        for _ in range(CHAIN):
            kern.launch((1,), s.ptr, types, vals)
        graph = s.end_capture()
    graph.launch(s)
    s.synchronize()
    per = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(ITERS):
            graph.launch(s)
        s.synchronize()
        per.append((time.perf_counter() - t0) / (ITERS * CHAIN) * 1e6)
    return {"raw_launch_us": statistics.median(raw), "graph_us_per_kernel": statistics.median(per)}


def child(task: str, which: str) -> None:
    out = {"chain": time_chain, "lower": time_lowering}.get(task, lambda w: floors())(which)
    print("RESULT " + json.dumps(out))


def run(task: str, which: str, flags: str) -> dict:
    env = {**os.environ, "XLA_FLAGS": flags, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    p = subprocess.run([sys.executable, __file__, "--child", task, which], capture_output=True, text=True, env=env,
                       cwd=os.path.expanduser("~"))
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}


CONFIGS = {  # row: (which, XLA_FLAGS)
    "lazytriton, command buffers on": ("lazytriton", CB_ON),
    "lazytriton, cb on, donated input": ("lazytriton-donated", CB_ON),
    "lazytriton, command buffers off": ("lazytriton", CB_OFF),
    "jax-triton, command buffers on": ("jax-triton", CB_ON),
    "XLA's own add (unfused), cb on": ("xla", CB_ON),
    "XLA's own add, cb on, donated input": ("xla-donated", CB_ON),
    "XLA's own add (unfused), cb off": ("xla", CB_OFF),
    "floor: XLA FFI call, no launch, cb off": ("ffi-noop", CB_OFF),
    "floor: XLA FFI + cuLaunchKernel, cb off": ("ffi-raw", CB_OFF),
    "floor: XLA FFI + cuLaunchKernel, cb on": ("ffi-raw", CB_ON),
    "floor: same, cb on, donated input": ("ffi-raw-donated", CB_ON),
}


def chains(repeats: int) -> dict:
    """Each configuration in `repeats` processes, interleaved (one process's
    figure drifts by tenths of a microsecond with the machine's load): the
    median of the per-process medians."""
    results = {name: [] for name in CONFIGS}
    for _ in range(repeats):
        for name, (which, flags) in CONFIGS.items():
            results[name].append(run("chain", which, flags))
    rows = {}
    for name, rs in results.items():
        ok = [r for r in rs if "us_per_kernel" in r]
        if not ok:
            rows[name] = rs[0]
            continue
        ok.sort(key=lambda r: r["us_per_kernel"])
        rows[name] = dict(ok[len(ok) // 2], spread=(ok[0]["us_per_kernel"], ok[-1]["us_per_kernel"]))
    return rows


def main() -> None:
    repeats = int(os.environ.get("JAX_CHAIN_REPEATS", "3"))
    rows = chains(repeats)
    fl = run("floors", "", CB_ON)
    low = {w: run("lower", w, CB_ON) for w in ("lazytriton", "jax-triton")}
    graph, raw = fl.get("graph_us_per_kernel"), fl.get("raw_launch_us")
    print(f"chain of {CHAIN} tiny kernels ({N} floats each), per kernel: in each of {repeats} processes the median "
          f"of {ROUNDS} rounds x {ITERS} runs; the median process shown, with the range over processes")
    print(f"{'path':40s} {'us/kernel':>10s} {'range':>11s} {'vs graph':>9s} {'vs raw':>8s}")
    for name, r in [*rows.items(), ("floor: CUDA graph replay", {"us_per_kernel": graph}),
                    ("floor: raw cuLaunchKernel loop", {"us_per_kernel": raw})]:
        us = r.get("us_per_kernel")
        if us is None:
            print(f"{name:40s} {'n/a':>10s}  {r.get('error', fl.get('error', ''))}")
            continue
        runs = r.get("handler_runs_per_kernel")
        lo, hi = r.get("spread", (us, us))
        print(f"{name:40s} {us:10.2f} {lo:5.2f}-{hi:<5.2f} {us / graph if graph else float('nan'):8.2f}x "
              f"{us / raw if raw else float('nan'):7.2f}x" + (f"   handler runs/kernel {runs:.3f}" if runs is not None else ""))
    for w, r in low.items():
        print(f"jit(...).lower() of an 8-config matmul, {w}: "
              + (f"{r['lower_ms']:.1f} ms" if "lower_ms" in r else f"n/a ({r.get('error')})"))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
    else:
        main()
