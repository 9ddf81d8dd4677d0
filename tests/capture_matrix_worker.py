"""One row of the command-buffer matrix (tests/test_gpu_capture_matrix.py).

The parent sets this process's configuration in the environment (XLA_FLAGS for
command buffers on or off, XLA_PYTHON_CLIENT_ALLOCATOR, LAZYTRITON_CAPTURE_FALLBACK,
a fresh LAZYTRITON_CACHE_DIR) and may run it under compute-sanitizer. Every
kernel case runs >= 4 executions with fresh random inputs, with stable buffer
addresses (inputs made inside the jitted function) and with changing ones
(new input arrays on every call, so XLA updates or re-records the graph), and
is compared with a NumPy reference. One JSON line per case and mode.

    python capture_matrix_worker.py [--garbage] [--cases permute,scatter,...]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import triton  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton import jax as ltj  # noqa: E402
from kernels import capture, jaxk  # noqa: E402

EXECUTIONS = 4


def cdiv_grid(n):
    return lambda m: (triton.cdiv(n, m["BLOCK"]),)


class Case:
    """gen(key) -> inputs (jnp); fn(*inputs) -> outputs; ref(*np inputs) -> expected."""
    donate = False
    hopper = False
    exact = True

    @contextlib.contextmanager
    def tracing(self):
        yield


class Permute(Case):
    """TransformerEngine's case: rows moved by an index map made earlier in
    the same jit (argsort of argsort), `cols` passed as a keyword."""
    rows, cols = 4096, 1024

    def gen(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        return (jax.random.uniform(k1, (self.rows,)), jax.random.normal(k2, (self.rows, self.cols)),
                jax.random.normal(k3, (self.rows,)))

    def fn(self, keys, inp, y):
        dst = jnp.argsort(jnp.argsort(keys)).astype(jnp.int32)
        out = ltj.triton_call(inp, dst, kernel=capture.permute_rows, out_type=inp, grid=(self.rows,), cols=self.cols)
        return out, y * 2.0

    def ref(self, keys, inp, y):
        dst = np.argsort(np.argsort(keys, kind="stable"), kind="stable")
        out = np.empty_like(inp)
        out[dst] = inp
        return out, y * 2.0


class Scatter(Case):
    n = 1 << 16

    def gen(self, key):
        k1, k2 = jax.random.split(key)
        return jax.random.normal(k1, (self.n,)), jax.random.uniform(k2, (self.n,))

    def fn(self, src, keys):
        idx = jnp.argsort(keys).astype(jnp.int32)
        return ltj.triton_call(src, idx, self.n, kernel=jaxk.scatter_kernel, out_type=src, grid=cdiv_grid(self.n))

    def ref(self, src, keys):
        out = np.empty_like(src)
        out[np.argsort(keys, kind="stable")] = src
        return out


class InPlace(Case):
    n = 100_003

    def __init__(self, donate):
        self.donate = donate

    def gen(self, key):
        return (jax.random.normal(key, (self.n,)),)

    def fn(self, x):
        return ltj.triton_call(x, self.n, kernel=jaxk.inc_inplace_kernel, out_type=x, grid=cdiv_grid(self.n),
                               input_output_aliases={0: 0})

    def ref(self, x):
        return x + 1


class UnsharedAlias(Case):
    """A declared alias XLA did not share: the output must start as the input."""
    n = 10_001

    def gen(self, key):
        return (jax.random.normal(key, (self.n,)),)

    def fn(self, x):
        return ltj.triton_call(x, self.n, kernel=jaxk.inc_even_kernel, out_type=x, grid=cdiv_grid(self.n),
                               input_output_aliases={0: 0})

    def ref(self, x):
        out = x.copy()
        out[::2] += 1
        return out

    @contextlib.contextmanager
    def tracing(self):
        real = jax.ffi.ffi_lowering  # lazytriton.jax lowers through it: drop XLA's aliasing
        jax.ffi.ffi_lowering = lambda *a, operand_output_aliases=None, **kw: real(*a, **kw)
        try:
            yield
        finally:
            jax.ffi.ffi_lowering = real


class Zeroed(Case):
    n = 50_000
    exact = False

    def gen(self, key):
        return (jax.random.uniform(key, (self.n,)),)

    def fn(self, x):
        return ltj.triton_call(x, self.n, kernel=jaxk.total_kernel, out_type=jax.ShapeDtypeStruct((1,), jnp.float32),
                               grid=cdiv_grid(self.n), zeroed_outputs=(0,))

    def ref(self, x):
        return np.array([x.astype(np.float64).sum()], np.float32)


class TwoOutputs(Case):
    n = 40_000

    def gen(self, key):
        k1, k2 = jax.random.split(key)
        return jax.random.normal(k1, (self.n,)), jax.random.normal(k2, (self.n,))

    def fn(self, x, y):
        return ltj.triton_call(x, y, self.n, kernel=jaxk.sum_diff_inplace_kernel, out_type=(x, x), grid=cdiv_grid(self.n),
                               input_output_aliases={0: 0})

    def ref(self, x, y):
        return x + y, x - y


class Scratch(Case):
    """Device-side tensor descriptors (Hopper): global scratch under capture."""
    hopper = True
    exact = False
    m = n = k = 512

    def gen(self, key):
        k1, k2 = jax.random.split(key)
        return (jax.random.normal(k1, (self.m, self.k), jnp.float16), jax.random.normal(k2, (self.k, self.n),
                                                                                         jnp.float16))

    def fn(self, a, b):
        m, n = self.m, self.n
        return ltj.triton_call(a, b, kernel=capture.device_tma_matmul,
                               out_type=jax.ShapeDtypeStruct((m, n), jnp.float16),
                               grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])),
                               M=m, N=n, K=self.k)

    def ref(self, a, b):
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)


class Chain(Case):
    n = 2048

    def gen(self, key):
        return (jax.random.normal(key, (self.n,)),)

    def fn(self, x):
        for _ in range(32):
            x = ltj.triton_call(x, self.n, kernel=jaxk.add_one_kernel, out_type=x, grid=cdiv_grid(self.n), BLOCK=1024)
        return x

    def ref(self, x):
        out = x.copy()
        for _ in range(32):
            out = out + np.float32(1)
        return out


CASES = {"permute": Permute, "scatter": Scatter, "inplace": lambda: InPlace(False),
         "inplace_donated": lambda: InPlace(True), "unshared_alias": UnsharedAlias, "zeroed": Zeroed,
         "two_outputs": TwoOutputs, "scratch": Scratch, "chain": Chain}


def leave_garbage() -> None:
    """Random bits in device memory that is then freed: a kernel that reads a
    buffer before its producer ran (or out of its bounds) sees garbage, and
    an index map made of it sends stores far out of bounds."""
    for i in range(4):
        g = jax.random.bits(jax.random.key(1000 + i), ((64 << 20) // 4,), jnp.uint32)
        g.block_until_ready()
        del g


def check(case: Case, got, want) -> None:
    got = [np.asarray(g) for g in jax.tree_util.tree_leaves(got)]
    want = [np.asarray(w) for w in jax.tree_util.tree_leaves(want)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if case.exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-2, atol=5e-2)


def run_case(name: str, mode: str, seed: int) -> dict:
    case = CASES[name]()
    res = {"case": name, "mode": mode, "ok": False}
    if case.hopper and jax.devices()[0].compute_capability < "9.0":
        res.update(ok=True, skipped="needs Hopper")
        return res
    gen = jax.jit(case.gen)
    if mode == "stable":  # inputs are temporaries of the executable: the same addresses every time
        f = jax.jit(lambda key: (case.fn(*case.gen(key)), case.gen(key)))
    else:
        f = jax.jit(case.fn, donate_argnums=(0,) if case.donate else ())
    keep = []  # earlier inputs stay alive, so every call gets new addresses
    bench = []
    try:
        for i in range(EXECUTIONS):
            key = jax.random.key(seed * 100 + i)
            before = lazytriton.stats()["bench_launches"]
            with case.tracing() if i == 0 else contextlib.nullcontext():
                if mode == "stable":
                    out, inputs = f(key)
                else:
                    inputs = gen(key)
                    host = [np.asarray(a) for a in inputs]
                    out = f(*inputs)
                    keep.append(inputs if not case.donate else None)
            out = jax.block_until_ready(out)
            if mode == "stable":
                host = [np.asarray(a) for a in inputs]
            check(case, out, case.ref(*host))
            bench.append(lazytriton.stats()["bench_launches"] - before)
        res["ok"] = True
    except Exception as exc:  # noqa: BLE001  (reported, the parent asserts)
        res["error"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
        res["trace"] = traceback.format_exc()[-1500:]
    res["bench_launches"] = bench
    # Tuning happens on the first execution at most, never under capture.
    if res["ok"] and any(bench[1:]):
        res.update(ok=False, error=f"tuning trials after the first execution: {bench}")
    res["executions"] = len(bench)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--modes", default="stable,changing")
    ap.add_argument("--garbage", action="store_true")
    args = ap.parse_args()
    if args.garbage:
        leave_garbage()
    for i, name in enumerate(args.cases.split(",")):
        for mode in args.modes.split(","):
            print("RESULT " + json.dumps(run_case(name, mode, seed=7 * i + (mode == "stable"))), flush=True)
    print("STATS " + json.dumps({**lazytriton.stats(), **ltj.handler_stats()}), flush=True)


if __name__ == "__main__":
    main()
