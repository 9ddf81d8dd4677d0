"""Reliability of the first call on a GPU: faults in trials, exceptions in the
user's tuning hooks, scratch memory, memory pressure, many processes on one
cache, a tuner killed mid-way, and a first execution already under capture."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import triton
import triton.language as tl

import lazytriton
from lazytriton import _core
from kernels import basic, capture

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
TESTS = Path(__file__).resolve().parent


def rand(n, dtype=np.float32):
    return cp.asarray(np.random.default_rng().standard_normal(n).astype(dtype))


def run_script(code: str, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=timeout, cwd=os.path.expanduser("~"))


def records(cache_dir: Path) -> list:
    return list(Path(cache_dir).glob("**/records/*.ltr"))


FAULT = """
import sys, faulthandler
faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where
sys.path.insert(0, {tests!r})
import cupy as cp, triton, lazytriton
from kernels import capture
k = lazytriton.kernel(capture.faulty_kernel)
n = 1 << 16
x = cp.arange(n, dtype=cp.float32); out = cp.full(n, -1, cp.float32)
try:
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n, out)
    cp.cuda.runtime.deviceSynchronize()
except Exception as exc:
    print("RAISED", type(exc).__name__, exc)
    sys.exit(3)
print("NO ERROR")
"""


def test_fault_in_a_trial_names_kernel_and_config_and_persists_nothing(cache_dir):
    # Isolation off: the trial in this process faults (with it on, the config never launches here:
    # tests/test_gpu_isolation.py).
    r = run_script(FAULT.format(tests=str(TESTS)), {"LAZYTRITON_CACHE_DIR": str(cache_dir),
                                                    "LAZYTRITON_ISOLATION": "0"}, timeout=150)
    assert r.returncode == 3, (r.stdout[-2000:], r.stderr[-3000:])  # a Python exception, not an abort
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RAISED"))
    assert "faulty_kernel" in line and "BLOCK: 512" in line and "tuning trial" in line, line
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in line or "CUDA_ERROR_" in line, line
    assert records(cache_dir) == []  # no winner a later process could trust


class Flaky:
    """Raises on its first call after arm(), then behaves."""

    def __init__(self, fn):
        self.fn, self.armed = fn, False

    def arm(self):
        self.armed = True

    def __call__(self, *a, **k):
        from lazytriton.model.spec import ReadRecorder

        probing = bool(a) and isinstance(a[0], ReadRecorder)  # lazytriton finding what a heuristic reads
        if self.armed and not probing:
            self.armed = False
            raise ZeroDivisionError("flaky user hook")
        return self.fn(*a, **k)


def _flaky_kernels():
    heur = Flaky(lambda args: args["n"] % args["BLOCK"] == 0)
    prune = Flaky(lambda configs, named, **kw: configs)
    perf = Flaky(lambda **kw: kw["BLOCK"])

    def make(**autotune):
        @triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (128, 1024)], key=["n"], **autotune)
        @triton.heuristics({"EVEN": heur})
        @triton.jit
        def scale2(x, out, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(out + offs, tl.load(x + offs, mask=m) * 2, mask=m)
        return scale2

    return {"heuristic": (heur, make()),
            "early_config_prune": (prune, make(prune_configs_by={"early_config_prune": prune})),
            "perf_model": (perf, make(prune_configs_by={"perf_model": perf, "top_k": 1}))}


@pytest.mark.parametrize("hook", ["heuristic", "early_config_prune", "perf_model"])
def test_exception_in_a_tuning_hook_surfaces_then_the_next_call_retries(cache_dir, hook):
    flaky, kern = _flaky_kernels()[hook]
    k = lazytriton.kernel(kern)
    n = 10_000
    x, out = rand(n), cp.full(n, cp.nan, cp.float32)
    grid = lambda m: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731
    flaky.arm()
    with pytest.raises(ZeroDivisionError, match="scale2.*flaky user hook"):
        k[grid](x, out, n)
    k[grid](x, out, n)  # retried from scratch: nothing half-resolved was kept
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(out.get(), (x * 2).get())


def test_jax_exceptions_in_tuning_hooks_surface_at_the_caller_then_retry(cache_dir, monkeypatch):
    """JAX evaluates heuristics once, at trace time (their values choose the grid
    and travel to the compile): an exception there is raised by the call that
    traces. early_config_prune runs at the first execution, on the real
    buffers: an exception there is an XLA error status naming the kernel, and
    the next execution resolves cleanly."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from lazytriton import jax as ltj

    n = 4096
    x = jax.random.normal(jax.random.key(0), (n,), jnp.float32)
    import lazytriton.cache.store as store

    for hook in ("heuristic", "early_config_prune"):
        # A cache per hook: the kernels are the same source with the same configs, so the
        # winner of the first would (rightly) be reused by the second, which never prunes.
        monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(cache_dir / hook))
        monkeypatch.setattr(store, "_default", None)
        flaky, kern = _flaky_kernels()[hook]
        f = jax.jit(lambda x: ltj.triton_call(x, kernel=kern, out_type=x, n=n,  # noqa: B023
                                              grid=lambda m: (triton.cdiv(n, m["BLOCK"]),)))
        if hook == "heuristic":
            flaky.arm()
            with pytest.raises(Exception, match="scale2") as exc:
                f(x)
        else:
            compiled = f.lower(x).compile()
            flaky.arm()
            with pytest.raises(Exception, match="scale2") as exc:
                compiled(x).block_until_ready()
        assert "flaky user hook" in str(exc.value)
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(x) * 2)


def test_device_side_descriptors_take_scratch_from_a_pool(cache_dir):
    if cp.cuda.Device().compute_capability < "90":
        pytest.skip("device-side tensor descriptors need Hopper")
    k = lazytriton.kernel(capture.device_tma_matmul)
    M = N = K = 512
    grid = lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))  # noqa: E731
    a = rand(M * K, np.float16).reshape(M, K)
    b = rand(K * N, np.float16).reshape(K, N)
    c = cp.full((M, N), cp.nan, cp.float16)
    k[grid](a, b, c, M, N, K)  # tunes: every trial needs scratch
    allocs = lazytriton.stats()["scratch_allocs"]
    for _ in range(50):
        k[grid](a, b, c, M, N, K)
    cp.cuda.runtime.deviceSynchronize()
    assert lazytriton.stats()["scratch_allocs"] == allocs, "steady launches must reuse the stream's scratch"
    ref = a.astype(cp.float32) @ b.astype(cp.float32)
    np.testing.assert_allclose(c.astype(cp.float32).get(), ref.get(), rtol=2e-2, atol=5e-2)


@pytest.mark.exclusive_gpu  # fills the device: run it alone (pytest -m exclusive_gpu), never beside other GPU tests
def test_snapshots_fall_back_to_pinned_host_memory_when_the_device_is_full(cache_dir, caplog):
    import logging

    k = lazytriton.kernel(basic.increment_kernel)
    n = 16 << 20  # 64 MiB written in place: saved around every trial
    x0 = rand(n)
    x = x0.copy()
    cp.get_default_memory_pool().free_all_blocks()
    free, _ = cp.cuda.runtime.memGetInfo()
    hog = cp.cuda.runtime.malloc(free - (160 << 20))  # leaves less than the snapshot plus lazytriton's headroom
    try:
        cp.cuda.runtime.memset(hog, 0, free - (160 << 20))
        left = cp.cuda.runtime.memGetInfo()[0]
        assert left < (256 << 20), f"could not fill the device: {left} bytes still free"
        with caplog.at_level(logging.INFO, logger="lazytriton"):
            k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n)
            cp.cuda.runtime.deviceSynchronize()
    finally:
        cp.cuda.runtime.free(hog)
    assert "pinned host memory" in caplog.text, caplog.text[-2000:]
    np.testing.assert_array_equal(x.get(), (x0 + 1).get())  # x + 1, never x + k


SHARED = """
import sys, json, time
sys.path.insert(0, {tests!r})
import cupy as cp, numpy as np, triton, lazytriton
from kernels import basic
k = lazytriton.kernel(basic.increment_kernel)
n = 1 << 22
x0 = cp.random.standard_normal(n, dtype=cp.float32); x = x0.copy()
open({ready!r} + str({i}), "w").close()
while not __import__("os").path.exists({go!r}):
    time.sleep(0.005)
k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n)
cp.cuda.runtime.deviceSynchronize()
ok = bool(cp.all(x == x0 + 1))
s = lazytriton.stats()
print(json.dumps({{"ok": ok, "tunes": s["tunes"], "record_hits": s["record_hits"]}}))
"""


def test_four_processes_first_call_one_kernel_on_one_empty_cache(cache_dir, tmp_path):
    go = tmp_path / "go"
    procs = []
    for i in range(4):
        code = SHARED.format(tests=str(TESTS), ready=str(tmp_path / "ready"), go=str(go), i=i)
        procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env={**os.environ, "LAZYTRITON_CACHE_DIR": str(cache_dir)},
                                      cwd=os.path.expanduser("~")))
    deadline = time.time() + 120
    while len(list(tmp_path.glob("ready*"))) < 4 and time.time() < deadline:
        time.sleep(0.05)
    go.touch()  # all four call at once
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)  # a deadlock fails here
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["ok"] for o in outs), outs
    tuned = sum(o["tunes"] for o in outs)
    print(f"4 processes: {tuned} tuned, {sum(o['record_hits'] for o in outs)} used the published winner")
    assert tuned == 1 and sum(o["record_hits"] for o in outs) == 3, outs


KILLED = """
import sys, logging
sys.path.insert(0, {tests!r})
import cupy as cp, triton, lazytriton
from kernels import basic
class Kill(logging.Handler):
    def emit(self, record):
        if "tuning" in record.getMessage():
            import os, signal
            print("KILLING", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
logging.getLogger("lazytriton").addHandler(Kill()); logging.getLogger("lazytriton").setLevel(logging.INFO)
k = lazytriton.kernel(basic.increment_kernel)
n = 1 << 20
x = cp.zeros(n, cp.float32)
k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n)
"""

AFTER = """
import sys, json
sys.path.insert(0, {tests!r})
import cupy as cp, triton, lazytriton
from kernels import basic
k = lazytriton.kernel(basic.increment_kernel)
n = 1 << 20
x = cp.zeros(n, cp.float32)
k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n)
cp.cuda.runtime.deviceSynchronize()
print(json.dumps({{"ok": bool(cp.all(x == 1)), "tunes": lazytriton.stats()["tunes"]}}))
"""


def test_a_tuner_killed_mid_way_leaves_nothing_a_later_process_trusts(cache_dir):
    env = {"LAZYTRITON_CACHE_DIR": str(cache_dir)}
    r = run_script(KILLED.format(tests=str(TESTS)), env)
    assert r.returncode == -signal.SIGKILL and "KILLING" in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])
    assert records(cache_dir) == []
    r = run_script(AFTER.format(tests=str(TESTS)), env, timeout=120)  # the lock died with the killed process
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"ok": True, "tunes": 1}


@pytest.mark.parametrize("fallback", ["first_config", None])
def test_first_execution_already_under_capture(cache_dir, monkeypatch, fallback):
    """What the JAX handler does when XLA captures a call site that never ran
    (jax < 0.10.2 records on the first execution; jax 0.11 warms up first, so
    this drives the handler's own two steps directly): resolve with the
    stream capturing, then the fixed-layout launch with the instruction's
    scratch arena, recorded into a CUDA graph and replayed."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from lazytriton import jax as ltj
    from lazytriton.jax import ffi as jax_ffi
    from lazytriton.runtime.resolve import CaptureError

    if fallback:
        monkeypatch.setenv("LAZYTRITON_CAPTURE_FALLBACK", fallback)
    else:
        monkeypatch.delenv("LAZYTRITON_CAPTURE_FALLBACK", raising=False)
    rows, cols = 512, 300
    lowered = jax.jit(lambda inp, dst: ltj.triton_call(inp, dst, kernel=capture.permute_rows, out_shape=inp,
                                                       grid=(rows,), cols=cols)).trace(
        jax.ShapeDtypeStruct((rows, cols), jnp.float32), jax.ShapeDtypeStruct((rows,), jnp.int32)).lower(
        lowering_platforms=("cuda",)).as_text()
    import re

    m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', lowered)
    desc = re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1))
    inp = rand(rows * cols).reshape(rows, cols)
    dst = cp.asarray(np.random.default_rng().permutation(rows).astype(np.int32))
    out = cp.full((rows, cols), cp.nan, cp.float32)
    buffers = [(inp.data.ptr, inp.nbytes), (dst.data.ptr, dst.nbytes), (out.data.ptr, out.nbytes)]
    site = jax_ffi.Site(json.loads(desc))
    arena = _core.ScratchArena()
    bench = lazytriton.stats()["bench_launches"]
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture(mode=cp.cuda.runtime.streamCaptureModeThreadLocal)  # XLA's mode
        try:
            if fallback is None:
                with pytest.raises(CaptureError, match="never compiles or tunes under capture"):
                    site.resolve(tuple(buffers), s.ptr, cp.cuda.Device().id, True)
                return
            entry = site.resolve(tuple(buffers), s.ptr, cp.cuda.Device().id, True)
            _core.launch_fixed(entry, s.ptr, [b[0] for b in buffers], arena)
        finally:
            graph = s.end_capture()
    assert lazytriton.stats()["bench_launches"] == bench  # nothing ran while capturing
    for _ in range(3):
        inp[...] = rand(rows * cols).reshape(rows, cols)
        out.fill(cp.nan)
        cp.cuda.runtime.deviceSynchronize()  # those ran on CuPy's stream; s does not wait for it
        graph.launch(s)
        s.synchronize()
        want = np.empty((rows, cols), np.float32)
        want[dst.get()] = inp.get()
        np.testing.assert_array_equal(out.get(), want)
