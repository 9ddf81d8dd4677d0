"""The lazy runtime on a real GPU (CuPy arrays). Skipped without a GPU."""
import threading

import numpy as np
import pytest

import lazytriton
import triton

from kernels import basic, hopper

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


def rand(n, dtype=np.float32):
    return cp.asarray(np.random.default_rng().standard_normal(n).astype(dtype))


def test_vector_add(cache_dir):
    k = lazytriton.kernel(basic.add_kernel)
    n = 98_765
    x, y, out = rand(n), rand(n), cp.full(n, cp.nan, cp.float32)
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n, BLOCK=1024)
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(out.get(), (x + y).get())
    before = lazytriton.stats()
    x2, y2 = rand(n), rand(n)
    k[(triton.cdiv(n, 1024),)](x2, y2, out, n, BLOCK=1024)
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(out.get(), (x2 + y2).get())
    after = lazytriton.stats()
    assert after["resolves"] == before["resolves"], "second call must not resolve again"
    assert after["launches"] == before["launches"] + 1


def test_matmul_autotuned(cache_dir):
    k = lazytriton.kernel(basic.matmul_kernel)
    M, N, K = 512, 384, 256
    a = rand(M * K, np.float16).reshape(M, K)
    b = rand(K * N, np.float16).reshape(K, N)
    c = cp.full((M, N), cp.nan, cp.float16)
    grid = lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))  # noqa: E731
    k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
    ref = a.astype(cp.float32) @ b.astype(cp.float32)
    err = float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref))
    assert err < 1e-2, err
    rec = k.records[-1]
    assert len(rec.candidates) == 8
    timed = [c for c in rec.candidates if c["time_ms"] is not None]
    assert len(timed) >= 2, rec.candidates


def test_inplace_increment_is_x_plus_one(cache_dir):
    k = lazytriton.kernel(basic.increment_kernel)
    n = 1 << 20
    x0 = rand(n)
    x = x0.copy()
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n)
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(x.get(), (x0 + 1).get())
    assert len([c for c in k.records[-1].candidates if c["time_ms"]]) == 6  # really tuned


def test_atomic_add_reset_to_zero(cache_dir):
    k = lazytriton.kernel(basic.sum_kernel)
    n = 300_000
    x = cp.asarray(np.random.default_rng().integers(-8, 8, n).astype(np.float32))
    total = cp.zeros(1, cp.float32)
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, total, n)
    cp.cuda.runtime.deviceSynchronize()
    assert float(total.get()[0]) == float(x.sum().get())


def test_shared_memory_above_48k(cache_dir):
    k = lazytriton.kernel(basic.big_shared_kernel)
    B, n = 64, 512
    x = rand(n * n).reshape(n, n)
    out = cp.full((B, B), cp.nan, cp.float32)
    k[(1,)](x, out, n, BLOCK=B, num_stages=3)
    cp.cuda.runtime.deviceSynchronize()
    meta = next(iter(k.loaded_kernels.values())).metadata
    assert meta["shared"] > 48 * 1024, meta
    xs = x.astype(cp.float64)
    ref = sum(xs[:B, kk:kk + B] @ xs[kk:kk + B, :B] for kk in range(0, n, B))
    err = float(cp.linalg.norm(out - ref) / cp.linalg.norm(ref))
    assert err < 1e-2, err  # tf32 dot


def test_num_ctas_2_on_hopper(cache_dir):
    if cp.cuda.Device().compute_capability < "90":
        pytest.skip("clusters need sm_90")
    k = lazytriton.kernel(hopper.cluster_copy_kernel)
    n = 100_000
    x, out = rand(n), cp.full(n, cp.nan, cp.float32)
    k[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024, num_ctas=2)
    cp.cuda.runtime.deviceSynchronize()
    assert next(iter(k.loaded_kernels.values())).metadata["num_ctas"] == 2
    np.testing.assert_array_equal(out.get(), (x * 2).get())


def test_heuristics_inside_autotune(cache_dir):
    k = lazytriton.kernel(basic.scale_kernel)
    for n in (4096, 4000):
        x, out = rand(n), cp.full(n, cp.nan, cp.float32)
        k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, 2.5, n)
        cp.cuda.runtime.deviceSynchronize()
        np.testing.assert_allclose(out.get(), (x * np.float32(2.5)).get(), rtol=1e-6)


def test_sixteen_threads_tune_once(cache_dir):
    k = lazytriton.kernel(basic.increment_kernel)
    n = 1 << 18
    base = [rand(n) for _ in range(16)]
    xs = [b.copy() for b in base]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(16)]
    errors = []
    barrier = threading.Barrier(16)

    def work(i):
        try:
            with cp.cuda.Device(0):
                barrier.wait()
                k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](xs[i], n, stream=streams[i].ptr)
                streams[i].synchronize()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    before = lazytriton.stats()["tunes"]
    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert lazytriton.stats()["tunes"] == before + 1
    assert len(k.records) == 1
    for b, x in zip(base, xs):
        np.testing.assert_array_equal(x.get(), (b + 1).get())


def test_launch_errors_name_kernel_and_cuda_error(cache_dir):
    k = lazytriton.kernel(basic.add_kernel)
    x = rand(16)
    with pytest.raises(TypeError, match="add_kernel.*argument y"):
        k[(1,)](x, "nope", x, 16, BLOCK=16)
    with pytest.raises(ValueError, match="grid"):
        k[(1, 2, 3, 4)](x, x, x, 16, BLOCK=16)


def test_zero_grid_launches_nothing(cache_dir):
    k = lazytriton.kernel(basic.add_kernel)
    x = rand(16)
    out = cp.full(16, 7.0, cp.float32)
    k[(0,)](x, x, out, 16, BLOCK=16)
    cp.cuda.runtime.deviceSynchronize()
    assert (out.get() == 7.0).all()


def test_torch_tensors_launch_and_cpu_tensors_are_refused(cache_dir):
    torch = pytest.importorskip("torch")
    k = lazytriton.kernel(basic.add_kernel)
    n = 4096
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    s = torch.cuda.current_stream().cuda_stream
    k[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024, stream=s)
    torch.cuda.synchronize()
    assert torch.equal(out, x + y)
    # A host tensor has a data_ptr() too: launching on it would fault the context.
    with pytest.raises(TypeError, match=r"add_kernel.*argument y.*tensor is on cpu.*move it to the GPU"):
        k[(triton.cdiv(n, 1024),)](x, y.cpu(), out, n, BLOCK=1024, stream=s)
    k[(triton.cdiv(n, 1024),)](y, x, out, n, BLOCK=1024, stream=s)  # the context is fine
    torch.cuda.synchronize()
    assert torch.equal(out, x + y)
