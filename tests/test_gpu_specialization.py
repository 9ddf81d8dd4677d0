"""Issue 23's two field failures, end to end on the GPU (their CPU regression
tests: test_specialization.py::test_a_none_slot_takes_only_none,
test_jax_lowering.py::test_python_ints_outside_int32_are_typed_as_triton_types_them,
and the differential test, test_differential.py).

1. One kernel object, call sequences that switch optional arguments between
   None and arrays (and strides between None and ints), as TransformerEngine's
   permutation wrapper does: every call checked against numpy on fresh random
   data, outputs poisoned first; the table-driven and the generated stubs.
2. lazytriton.jax with a Python int beyond int32 (an 8 GiB buffer indexed with
   int64 offsets), aliased in place, under jax.jit with command buffers on.

test_gpu_memcheck.py runs both again under compute-sanitizer's memcheck."""
import random

import numpy as np
import pytest
import triton

import lazytriton
from kernels import differential_kernels as dk

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("stubs", ["off", "sync"], ids=["table-driven", "generated"])
def test_optional_pointers_switching_between_none_and_arrays(cache_dir, monkeypatch, stubs):
    cp = pytest.importorskip("cupy")
    monkeypatch.setenv("LAZYTRITON_STUB_BUILD", stubs)
    k = lazytriton.kernel(dk.optional_inputs)
    rng = np.random.default_rng()
    order = random.Random(23)
    # The order first (None, then an array), then a seeded mix.
    plan = [(False, False, False), (True, False, False), (False, False, True), (True, True, True),
            (True, True, False), (False, False, False)] + [
        (order.random() < 0.5, order.random() < 0.5, order.random() < 0.5) for _ in range(24)]
    for i, (has_y, strided, has_scale) in enumerate(plan):
        n = order.choice([1000, 4096, 3333, 17])
        x = cp.asarray(rng.standard_normal(n).astype(np.float32))
        s_y = order.choice([2, 3]) if strided else None
        y = cp.asarray(rng.standard_normal(n * (s_y or 1)).astype(np.float32)) if has_y else None
        scale = cp.asarray(rng.standard_normal(1).astype(np.float32)) if has_scale else None
        out = cp.full(n, cp.nan, cp.float32)
        alpha, flag = 1.5, bool(i % 2)
        grid = lambda m: (triton.cdiv(m["n"], m["BLOCK"]),)  # noqa: E731
        k[grid](x, y, out, scale, s_y, n, alpha, flag, BLOCK=128, HAS_SCALE=scale is not None)
        want = x.get().astype(np.float64)
        if y is not None:
            want = want + y.get()[::s_y or 1][:n]
        if scale is not None:
            want = want * scale.get()[0]
        if flag:
            want = want * alpha
        np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-5, err_msg=f"call {i}: {plan[i]}")


def test_jax_int_beyond_int32_indexes_an_8_gib_buffer(jax_gpu, cache_dir):
    """n = 2**31 + 96 float32 elements (8 GiB), updated in place at its tail by a kernel
    whose offsets are int64 because n is: Triton types n i64."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from lazytriton import jax as ltj

    n = 2**31 + 96
    block, blocks = 128, 4
    free = jax.devices()[0].memory_stats() or {}
    if free.get("bytes_limit", 1 << 40) - free.get("bytes_in_use", 0) < 10 * 2**30:
        pytest.skip("needs 10 GiB of free GPU memory")
    tail = np.random.default_rng().standard_normal(block * blocks).astype(np.float32)
    k = tail.size

    @jax.jit
    def f(t):
        x = jnp.concatenate([jnp.zeros((n - k,), jnp.float32), t])  # 8 GiB, made by XLA in the program
        y = ltj.triton_call(x, n, kernel=dk.double_tail, out_type=x, grid=(blocks,), BLOCK=block,
                            input_output_aliases={0: 0})
        # Static slices (lax.slice): jnp indexing beyond int32 needs x64.
        return lax.slice(y, (n - k,), (n,)), lax.slice(y, (n - k - 1,), (n - k,)), lax.slice(y, (0,), (1,))

    got, before, first = f(jnp.asarray(tail))
    np.testing.assert_array_equal(np.asarray(got), tail * 2)
    assert float(before[0]) == 0.0 and float(first[0]) == 0.0
