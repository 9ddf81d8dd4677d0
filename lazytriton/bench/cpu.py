"""The section that needs no GPU (the `cpu` suite, run in CI; also the last
section of the GPU suites): jit(...).lower() of the 8-config matmul, the cold
compile of each of its configs for sm_90 (a fresh process and Triton cache
each), and the build of a generated launch stub."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from .common import row as _row



LOWER_ROW = "lazytriton.jax: jit(...).lower() of the 8-config matmul"
STUB_ROW = "launch stub build (generated C, g++)"


def configs(suite: str) -> list[int]:
    """The demo configs whose cold compile is timed: all 8, or 2 in the quick suite."""
    from lazytriton.demo_kernels import DEMO_CONFIGS

    return [0, 5] if suite == "quick" else list(range(len(DEMO_CONFIGS)))


def row_names(suite: str) -> list[str]:
    from lazytriton.demo_kernels import DEMO_CONFIGS

    return [LOWER_ROW] + [_compile_label(i, DEMO_CONFIGS[i]) for i in configs(suite)] + [STUB_ROW]


def _compile_label(i: int, cfg) -> str:
    label = ", ".join(f"{k}={v}" for k, v in cfg.kwargs.items()) + f", warps={cfg.num_warps}, stages={cfg.num_stages}"
    return f"compile config {i} ({label})"


def run(progress, suite: str) -> dict:
    """What needs no GPU: jit(...).lower() of the 8-config matmul, compile time
    of each config for sm_90 (fresh Triton cache), launch-stub build time."""
    rows, notes = [], []
    progress("cpu: lowering the 8-config matmul for CUDA")
    lowering = _lowering_ms(reps=5 if suite == "full" else 3)
    if lowering is not None:
        rows.append(_row(LOWER_ROW, "lazytriton", lowering))
    else:
        notes.append("JAX not importable: no lowering row")
    progress("cpu: compiling each demo config for sm_90 in a fresh Triton cache")
    rows += _compile_rows(configs(suite), progress)
    progress("cpu: building a launch stub for a new argument shape")
    rows.append(_row(STUB_ROW, "lazytriton", [_stub_build_ms()]))
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
from lazytriton.model.arrays import PointerArg
from lazytriton.compile.compiler import Binder, Candidate, compile_one
from lazytriton.compile.targets import default_target
from lazytriton.demo_kernels import DEMO_CONFIGS, demo_matmul
from lazytriton.model.spec import kernel_spec
spec, target = kernel_spec(demo_matmul), default_target()
binder = Binder(spec, target)
p = PointerArg(1 << 20, "fp16")
cfg = DEMO_CONFIGS[int(sys.argv[1])]
bound = binder.bind((p, p, p, 2048, 2048, 2048, 2048, 1, 2048, 1, 2048, 1), cfg.all_kwargs())
t0 = time.perf_counter()
compile_one(spec, target, bound)
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))
"""


def _compile_rows(which: list[int], progress) -> list[dict]:
    """One fresh process and Triton cache per config: what a cold compile costs."""
    from lazytriton.demo_kernels import DEMO_CONFIGS

    rows = []
    for j, i in enumerate(which):
        cfg = DEMO_CONFIGS[i]
        progress(f"cpu: compile config {i} ({j + 1}/{len(which)})")
        with tempfile.TemporaryDirectory() as d:
            env = {**os.environ, "TRITON_CACHE_DIR": d, "TRITON_DEFAULT_FP_FUSION": "1"}
            r = subprocess.run([sys.executable, "-c", _COMPILE_ONE, str(i)], capture_output=True, text=True,
                               env=env, timeout=600)
        ms = json.loads(r.stdout.strip().splitlines()[-1])["ms"] if r.returncode == 0 else float("nan")
        rows.append(_row(_compile_label(i, cfg), "lazytriton", [ms], config=str(cfg),
                         **({} if r.returncode == 0 else {"error": r.stderr.strip()[-500:]})))
    return rows


_STUB_BUILD = r"""
import json, time
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DeviceArray
from lazytriton.bench.kernels import permute_rows
from lazytriton.runtime.kernel import LazyKernel
a, idx = DeviceArray(1 << 20, "fp32", 4096), DeviceArray(1 << 21, "i32", 64)
shape = LazyKernel(permute_rows)._shape((a, idx, a, 1000))
t0 = time.perf_counter()
stubgen.load_stub(shape)
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))
"""


def _stub_build_ms() -> float:
    """A generated stub built synchronously in a fresh process and an empty cache."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "LAZYTRITON_CACHE_DIR": d, "LAZYTRITON_STUB_BUILD": "sync",
               "LAZYTRITON_COMPILE_WORKERS": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
        r = subprocess.run([sys.executable, "-c", _STUB_BUILD], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"stub build failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["ms"]
