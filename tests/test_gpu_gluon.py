"""Gluon kernels (@triton.experimental.gluon.jit) on a GPU through lazytriton:
standalone with CuPy arrays (plain, autotuned, a 2D blocked layout, a
device-side TMA copy that needs global scratch) and through
lazytriton.jax.triton_call under jax.jit (command buffers forced on by
conftest). Fresh random data every time, outputs poisoned first, compared with
NumPy. Skipped without a GPU."""
import functools

import numpy as np
import pytest
import triton

import lazytriton
from kernels import gluonk

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


def rand(*shape):
    return np.random.default_rng().standard_normal(shape).astype(np.float32)


def poisoned(*shape):
    return cp.full(shape, cp.nan, cp.float32)


def capability() -> int:
    return int(cp.cuda.Device().compute_capability)  # "90" on an H100/H200


@pytest.mark.parametrize("n", [1, 1000, 98_765])
def test_gluon_vector_add(cache_dir, n):
    k = lazytriton.kernel(gluonk.vec_add)
    for _ in range(2):  # the second call launches the resolved winner from C++
        x, y = rand(n), rand(n)
        out = poisoned(n)
        k[(triton.cdiv(n, 512),)](cp.asarray(x), cp.asarray(y), out, n, BLOCK=512, WARPS=4, num_warps=4)
        cp.cuda.runtime.deviceSynchronize()
        np.testing.assert_array_equal(out.get(), x + y)
    assert k.records and k.records[-1].candidates[0]["error"] is None


def test_gluon_autotuned_vector_add(cache_dir):
    k = lazytriton.kernel(gluonk.vec_add_tuned)
    n = 1_000_003
    before = lazytriton.stats()
    for _ in range(3):
        x, y = rand(n), rand(n)
        out = poisoned(n)
        k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](cp.asarray(x), cp.asarray(y), out, n)
        cp.cuda.runtime.deviceSynchronize()
        np.testing.assert_array_equal(out.get(), x + y)
    assert lazytriton.stats()["resolves"] == before["resolves"] + 1
    rec = k.records[-1]
    assert len(rec.candidates) == 3 and all(c["error"] is None for c in rec.candidates), rec.candidates
    assert sum(c["time_ms"] is not None for c in rec.candidates) >= 2  # really tuned


@pytest.mark.parametrize("M, N", [(1, 7), (33, 100), (257, 1000)])
def test_gluon_2d_blocked_layout(cache_dir, M, N):
    k = lazytriton.kernel(gluonk.scale_rows)
    pitch = N + 3  # rows not contiguous with each other
    xs = rand(M, pitch)
    y = rand(N)
    alpha = float(np.random.default_rng().uniform(-2, 2))
    out = poisoned(M, pitch)
    BM, BN = 16, 64
    k[(triton.cdiv(M, BM), triton.cdiv(N, BN))](cp.asarray(xs), cp.asarray(y), out, M, N, pitch, pitch, alpha,
                                                BM=BM, BN=BN, WARPS=4, num_warps=4)
    cp.cuda.runtime.deviceSynchronize()
    got = out.get()
    ref = np.float32(alpha).astype(np.float64) * xs[:, :N].astype(np.float64) + y.astype(np.float64)
    np.testing.assert_allclose(got[:, :N], ref, rtol=1e-6, atol=1e-6)
    assert np.isnan(got[:, N:]).all()  # the padding columns were never written


@pytest.mark.skipif(not gluonk.HAVE_DEVICE_TMA, reason="Gluon device-side TMA descriptors need Triton 3.6+")
@pytest.mark.parametrize("M, N", [(32, 32), (8, 64), (16, 128)])
def test_gluon_device_tma_copy_with_global_scratch(cache_dir, M, N):
    if capability() < 90:
        pytest.skip("TMA needs Hopper or newer")
    k = lazytriton.kernel(gluonk.tma_copy)
    for _ in range(2):
        x = rand(M, N)
        out = poisoned(M, N)
        k[(1,)](cp.asarray(x), out, M, N)
        cp.cuda.runtime.deviceSynchronize()
        np.testing.assert_array_equal(out.get(), x)
    assert k.records[-1].candidates[0]["error"] is None


# -- through lazytriton.jax.triton_call, under jax.jit -------------------------------------------


def test_triton_call_gluon_vector_add_under_jit(cache_dir, jax_gpu):
    jax = jax_gpu
    import jax.numpy as jnp

    from lazytriton import jax as ltj

    n = 200_003

    @jax.jit
    def f(x, y):  # vec_add(x, y, out, n): `n` by name, the output takes `out`
        return ltj.triton_call(x, y, n=n, kernel=gluonk.vec_add_tuned, out_type=x,
                               grid=lambda m: (triton.cdiv(n, m["BLOCK"]),))

    for _ in range(3):  # first execution tunes; later ones (recorded into command buffers) launch from C++
        x, y = rand(n), rand(n)
        np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x), jnp.asarray(y))), x + y)


@pytest.mark.parametrize("size", [40, 500, 16 * 1024 + 1])
def test_triton_call_jax_tritons_gluon_memcpy(cache_dir, jax_gpu, size):
    jax = jax_gpu
    import jax.numpy as jnp

    from lazytriton import jax as ltj

    block = 64
    f = jax.jit(lambda x: ltj.triton_call(x, size=size, kernel=gluonk.memcpy, out_type=x,
                                          grid=(triton.cdiv(size, block),), num_warps=1, block_size=block))
    x = rand(size)
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), x)

    # In place into a Ref filled with NaN: every element must be written.
    def g(x, y_ref):
        return ltj.triton_call(x, y_ref, size, kernel=gluonk.memcpy, out_type=(), grid=(triton.cdiv(size, block),),
                               num_warps=1, block_size=block)

    x = rand(size)
    y_ref = jax.new_ref(jnp.full((size,), jnp.nan, jnp.float32))
    g(jnp.asarray(x), y_ref)
    np.testing.assert_array_equal(np.asarray(y_ref[...]), x)


def test_triton_call_gluon_2d_and_scalar_under_jit(cache_dir, jax_gpu):
    jax = jax_gpu
    import jax.numpy as jnp

    from lazytriton import jax as ltj

    M, N = 100, 300
    BM, BN = 16, 64

    @functools.partial(jax.jit, static_argnums=2)
    def f(x, y, alpha):
        return ltj.triton_call(x, y, M=M, N=N, stride_x=N, stride_out=N, alpha=alpha, kernel=gluonk.scale_rows,
                               out_type=x, grid=(triton.cdiv(M, BM), triton.cdiv(N, BN)), BM=BM, BN=BN, WARPS=4,
                               num_warps=4)

    for _ in range(2):
        x, y = rand(M, N), rand(N)
        alpha = float(np.random.default_rng().uniform(-2, 2))
        got = np.asarray(f(jnp.asarray(x), jnp.asarray(y), alpha))
        ref = np.float32(alpha).astype(np.float64) * x.astype(np.float64) + y.astype(np.float64)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not gluonk.HAVE_DEVICE_TMA, reason="Gluon device-side TMA descriptors need Triton 3.6+")
@pytest.mark.parametrize("M, N", [(32, 32), (8, 64), (16, 128)])  # jax-triton 0.4's gluon_test shapes
def test_triton_call_gluon_device_tma_copy(cache_dir, jax_gpu, M, N):
    jax = jax_gpu
    import jax.numpy as jnp

    from lazytriton import jax as ltj

    if capability() < 90:
        pytest.skip("TMA needs Hopper or newer")
    f = jax.jit(lambda x: ltj.triton_call(x, kernel=gluonk.tma_copy, out_type=x, grid=1, M=M, N=N))
    for _ in range(3):  # the device-side descriptors live in the instruction's scratch arena
        x = rand(M, N)
        np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), x)
