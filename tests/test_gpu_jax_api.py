"""lazytriton.jax's jax-triton 0.4 surface on a GPU: Refs, 0.4 aliases,
pytrees, backend options, side effects, callable constexprs, vmap, and a
jax.export artifact run in fresh processes (tuned, then from the persisted winner)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lazytriton import jax as ltj  # noqa: E402
from kernels import jaxk  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("jax_gpu")]
TESTS = Path(__file__).resolve().parent


def cdiv_grid(n):
    return lambda m: (triton.cdiv(n, m["BLOCK"]),)


@triton.jit
def n_first_inc_kernel(n, x, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)


@triton.jit
def acc_kernel(x, acc, n, out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(acc + offs, mask=m)
    tl.store(out + offs, tl.load(x + offs, mask=m) + a, mask=m)
    tl.store(acc + offs, a + 1, mask=m)


@triton.jit
def scale_kernel(x, s, out, BLOCK: tl.constexpr = 64):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs) * s)


@triton.jit
def add_fn(a, b):
    return a + b


@triton.jit
def mul_fn(a, b):
    return a * b


@triton.jit
def dispatch_kernel(x, y, out, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, FN(tl.load(x + offs), tl.load(y + offs)))


@pytest.mark.parametrize("jit", [False, True])
def test_ref_updated_in_place(cache_dir, jit):
    n = 5000
    x = jnp.arange(n, dtype=jnp.float32)
    r = jax.new_ref(x)

    def f(r):  # autotuned: every trial must leave the Ref at x + 1
        return ltj.triton_call(r, n, kernel=jaxk.inc_inplace_kernel, out_type=(), grid=cdiv_grid(n))

    assert (jax.jit(f) if jit else f)(r) == ()
    np.testing.assert_array_equal(np.asarray(r[...]), np.arange(n) + 1)


def test_scalar_before_ref_and_ref_with_allocated_output(cache_dir):
    n = 64
    x = jnp.arange(n, dtype=jnp.float32)
    r = jax.new_ref(x)
    ltj.triton_call(n, r, kernel=n_first_inc_kernel, out_type=(), grid=(1,), BLOCK=64)
    np.testing.assert_array_equal(np.asarray(r[...]), np.arange(n) + 1)
    acc = jax.new_ref(jnp.full((n,), 10.0, jnp.float32))
    out = ltj.triton_call(x, acc, n, kernel=acc_kernel, out_type=x, grid=(1,), BLOCK=64)
    np.testing.assert_array_equal(np.asarray(out), np.arange(n) + 10.0)
    np.testing.assert_array_equal(np.asarray(acc[...]), np.full(n, 11.0))


@pytest.mark.parametrize("donate", [False, True])
def test_alias_0_4_convention_with_and_without_donation(cache_dir, donate):
    n = 4096
    x = jax.random.normal(jax.random.key(0), (n,), jnp.float32)
    want = np.asarray(x) + 1
    f = lambda x: ltj.triton_call(x, n, kernel=jaxk.inc_inplace_kernel, out_type=x,  # noqa: E731
                                  grid=cdiv_grid(n), input_output_aliases={0: 0})
    if donate:
        f = jax.jit(f, donate_argnums=0)
        ptr = x.unsafe_buffer_pointer()
    out = f(x)
    if donate:
        assert x.is_deleted() and out.unsafe_buffer_pointer() == ptr
    np.testing.assert_allclose(np.asarray(out), want)


def test_aliased_output_zeroed_and_pytree_out(cache_dir):
    n = 64
    x = jnp.arange(n, dtype=jnp.float32)
    acc = jnp.full((n,), 5.0, jnp.float32)
    outs = jax.jit(lambda x, acc: ltj.triton_call(
        x, acc, n, kernel=acc_kernel, out_type={"acc": acc, "out": x}, grid=(1,), BLOCK=64,
        input_output_aliases={1: 0}, zeroed_outputs=(0,)))(x, acc)
    np.testing.assert_array_equal(np.asarray(outs["out"]), np.arange(n))  # acc zeroed before the launch
    np.testing.assert_array_equal(np.asarray(outs["acc"]), np.ones(n))


def test_backend_options_callable_constexpr_and_floats(cache_dir):
    x = jnp.arange(64, dtype=jnp.float32)
    y = jnp.full((64,), 3.0, jnp.float32)
    out = ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,),
                          backend_options={"num_warps": 2, "enable_fp_fusion": False})
    np.testing.assert_array_equal(np.asarray(out), np.arange(64) * 2.0)
    for s in (1e-30, float("inf")):
        np.testing.assert_array_equal(np.asarray(ltj.triton_call(x + 1, s, kernel=scale_kernel, out_type=x,
                                                                 grid=(1,))), (np.arange(64, dtype=np.float32) + 1) * np.float32(s))  # in fp32, as the kernel
    call = lambda fn: ltj.triton_call(x, y, kernel=dispatch_kernel, out_type=x, grid=(1,), FN=fn,  # noqa: E731
                                      BLOCK=64)
    np.testing.assert_array_equal(np.asarray(call(add_fn)), np.arange(64) + 3.0)
    np.testing.assert_array_equal(np.asarray(call(mul_fn)), np.arange(64) * 3.0)


@triton.jit
def wide_scale_kernel(x, s, t, out, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, (tl.load(x + offs) * (s * t)).to(tl.float32))


def test_floats_fp32_cannot_hold_are_passed_as_fp64(cache_dir):
    """s * t == 1 only when both arrive as fp64 (in fp32: 0 * inf = nan)."""
    x = jax.random.normal(jax.random.key(7), (64,), jnp.float32)
    out = jax.jit(lambda x: ltj.triton_call(x, 1e-300, 1e300, kernel=wide_scale_kernel, out_type=x, grid=(1,),
                                            BLOCK=64))(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x), rtol=1e-6)


def test_has_side_effect_keeps_an_unused_call(cache_dir):
    x = jnp.arange(64, dtype=jnp.float32)

    def f(x, keep):
        ltj.triton_call(x, 2.0, kernel=scale_kernel, out_type=x, grid=(1,), has_side_effect=keep)
        return x + 1

    for keep in (False, True):
        before = ltj.handler_stats()["executes"]
        jax.block_until_ready(jax.jit(f, static_argnums=1)(x, keep))
        assert (ltj.handler_stats()["executes"] > before) == keep


def test_vmap(cache_dir):
    x = jnp.arange(3 * 64, dtype=jnp.float32).reshape(3, 64)
    out = jax.jit(jax.vmap(lambda r: ltj.triton_call(r, 2.0, kernel=scale_kernel, out_type=r, grid=(1,))))(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 2)


RUN_EXPORTED = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
import lazytriton
from lazytriton import jax as ltj
ltj.register()  # this process never traces a triton_call: the handler must be registered by hand
exp = jax.export.deserialize(open(sys.argv[1], "rb").read())
n = 10_001
x = jnp.arange(n, dtype=jnp.float32)
np.testing.assert_array_equal(np.asarray(exp.call(x)), np.arange(n) + 1)
print(json.dumps(lazytriton.stats()))
"""


def test_export_runs_in_fresh_processes(cache_dir, tmp_path):
    pytest.importorskip("flatbuffers")
    n = 10_001
    f = lambda x: ltj.triton_call(x, n, kernel=jaxk.inc_inplace_kernel, out_type=x,  # noqa: E731
                                  grid=cdiv_grid(n), input_output_aliases={0: 0})
    exp = jax.export.export(jax.jit(f), disabled_checks=[
        jax.export.DisabledSafetyCheck.custom_call(ltj.CUSTOM_CALL_TARGET_NAME)])(
        jax.ShapeDtypeStruct((n,), jnp.float32))
    path = tmp_path / "inc.jax"
    path.write_bytes(exp.serialize())
    env = {**os.environ, "LAZYTRITON_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(TESTS)}
    stats = []
    for _ in range(2):  # first: compiled and tuned there; second: the persisted winner, nothing compiled
        # cwd outside the checkout: the child must import the installed package, not the source tree.
        r = subprocess.run([sys.executable, "-c", RUN_EXPORTED, str(path)], capture_output=True, text=True,
                           timeout=600, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        stats.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert stats[0]["tunes"] == 1
    assert stats[1]["compiles"] == 0 and stats[1]["tunes"] == 0 and stats[1]["bench_launches"] == 0
