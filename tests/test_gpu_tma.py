"""Host-side TMA tensor descriptors on a real GPU (sm_90+): Triton's own
TensorDescriptor (torch) and lazytriton's (CuPy) as kernel arguments, the
pre_hook autotune of Triton's tutorials 09 (persistent matmul) and 06 (fused
attention, Hopper host-descriptor variant), padding="nan", CUDA-graph capture,
the winner persisted with its block shapes. Every output is poisoned first and
checked against a float32 reference. Skipped without a GPU."""
import numpy as np
import pytest
import triton

import lazytriton

from kernels import tma

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


@pytest.fixture(autouse=True)
def hopper():
    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("host TMA descriptors need sm_90 or newer")


def rand(shape, dtype=np.float16, seed=None):
    rng = np.random.default_rng(seed)
    return cp.asarray(rng.standard_normal(shape).astype(np.float32).astype(dtype))


def num_sms() -> int:
    return cp.cuda.Device().attributes["MultiProcessorCount"]


def small_matmul():
    """Tutorial 09's kernel with 4 of its 48 configs, to keep the tests that tune it
    short (the torch test runs the tutorial's own list)."""
    return tma.matmul_kernel_tma_persistent_small


def persistent_grid(M, N, sms):
    return lambda META: (min(sms, triton.cdiv(M, META["BLOCK_SIZE_M"]) * triton.cdiv(N, META["BLOCK_SIZE_N"])),)


# -- single descriptors ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint16, np.int32])
@pytest.mark.parametrize("shape", [(32, 32), (8, 64), (16, 128)])
def test_copy(cache_dir, dtype, shape):
    M, N = shape
    x = cp.asarray(np.random.default_rng().integers(-100, 100, shape)).astype(dtype) \
        if np.dtype(dtype).kind in "iu" else rand(shape, dtype)
    out = cp.full(shape, 0x7F, dtype) if np.dtype(dtype).kind in "iu" else cp.full(shape, cp.nan, dtype)
    k = lazytriton.kernel(tma.tma_copy_kernel)
    k[(1,)](lazytriton.TensorDescriptor.from_tensor(x, [M, N]), out, M=M, N=N)
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(out.get(), x.get())


@pytest.mark.parametrize("padding", ["zero", "nan"])
def test_padding_is_observable_on_out_of_bounds_loads(cache_dir, padding):
    # A 40 x 24 fp32 tensor read in 32 x 32 blocks: the block is wider than the tensor
    # (valid for TMA: the columns past the edge read the padding), and the second
    # program's rows 40..63 are past the edge too.
    R, C, BM, BN = 40, 24, 32, 32
    x = rand((R, C), np.float32)
    out = cp.full((2, BM, BN), 7.0, cp.float32)
    d = lazytriton.TensorDescriptor.from_tensor(x, [BM, BN], padding=padding)
    k = lazytriton.kernel(tma.tma_block_load_kernel)
    k[(2,)](d, out, 0, 0, BM=BM, BN=BN)
    cp.cuda.runtime.deviceSynchronize()
    got = out.get().reshape(2 * BM, BN)
    np.testing.assert_array_equal(got[:R, :C], x.get())
    oob = np.ones((2 * BM, BN), bool)
    oob[:R, :C] = False
    if padding == "nan":
        assert np.isnan(got[oob]).all()
    else:
        assert (got[oob] == 0).all()


def test_descriptors_change_per_call_without_resolving(cache_dir):
    # Base, shape and strides are read on every call (not in the key): new buffers,
    # a view with other strides and another shape launch the same winner.
    k = lazytriton.kernel(tma.tma_scale_store_kernel)
    BM, BN = 32, 64
    for i, (R, C, view) in enumerate([(128, 128, False), (96, 192, False), (64, 256, True)]):
        full = rand((R, 2 * C if view else C))
        src = full[:, :C] if view else full  # a strided view: row stride 2 * C
        dst = cp.full((R, C), cp.nan, cp.float16)
        d_in = lazytriton.TensorDescriptor.from_tensor(src, [BM, BN])
        assert d_in.strides == [2 * C if view else C, 1]
        d_out = lazytriton.TensorDescriptor.from_tensor(dst, [BM, BN])
        before = lazytriton.stats()["resolves"]
        k[(triton.cdiv(R, BM), triton.cdiv(C, BN))](d_in, d_out, 3.0, BM=BM, BN=BN)
        cp.cuda.runtime.deviceSynchronize()
        np.testing.assert_array_equal(dst.get(), (src.astype(cp.float32) * 3.0).astype(cp.float16).get())
        if i:
            assert lazytriton.stats()["resolves"] == before


def test_autotuned_pre_hook_kernel(cache_dir):
    k = lazytriton.kernel(tma.tma_scale_autotuned)
    R, C = 256, 256
    x, y = rand((R, C)), cp.full((R, C), cp.nan, cp.float16)
    dummy = [1, 1]
    grid = lambda m: (triton.cdiv(R, m["BM"]), triton.cdiv(C, m["BN"]))  # noqa: E731
    k[grid](lazytriton.TensorDescriptor.from_tensor(x, dummy), lazytriton.TensorDescriptor.from_tensor(y, dummy), 0.5)
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(y.get(), (x.astype(cp.float32) * 0.5).astype(cp.float16).get())
    rec = k.records[-1]
    assert sum(c["time_ms"] is not None for c in rec.candidates) == 3, rec.candidates
    blocks = rec.extra["launch"]["descriptors"]
    cfg = tma.tma_scale_autotuned.configs[rec.winner_index].kwargs
    assert blocks == {"in_desc": f"tensordesc<fp16[{cfg['BM']}, {cfg['BN']}]>",
                      "out_desc": f"tensordesc<fp16[{cfg['BM']}, {cfg['BN']}]>"}


def tuple_descs_data(M, N, seed=None):
    """(p, a, b, scale) for tma.tma_tuple_descs: fresh random, scale an fp32 value."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(1).astype(np.float32), rng.standard_normal((2, 32, 64)).astype(np.float32),
            rng.standard_normal((48, 64)).astype(np.float32), float(np.float32(rng.uniform(0.5, 2.0))))


def tuple_descs_reference(p, a, b, scale, k, M, N):
    out = np.empty((2, M, N))
    for i in range(2):
        out[i] = (a[i, :M, :N].astype(np.float64) + b[i * M:(i + 1) * M, :N].astype(np.float64) * scale + 1
                  + np.float64(p[0]) + k)
    return out.astype(np.float32)


def test_descriptors_inside_a_tuple(cache_dir):
    # Triton 3.5/3.6's own launcher refuses a descriptor inside a tuple (its signature expansion
    # only looks at top-level arguments); the compiled kernel takes each leaf's expansion in order
    # (test_launch_bytes.py checks the bytes on the CPU): this checks what the kernel reads.
    M, N = 16, 32
    k = lazytriton.kernel(tma.tma_tuple_descs)
    for _ in range(2):  # the second call: the stub, new buffers
        hp, ha, hb, scale = tuple_descs_data(M, N)
        p, a, b = cp.asarray(hp), cp.asarray(ha), cp.asarray(hb)
        out = cp.full((2, M, N), cp.nan, cp.float32)
        descs = (lazytriton.TensorDescriptor.from_tensor(a, [1, M, N]),
                 (lazytriton.TensorDescriptor.from_tensor(b, [M, N]), scale, 1))
        k[(2,)](p, descs, out, 7, M=M, N=N)
        cp.cuda.runtime.deviceSynchronize()
        got = out.get()
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, tuple_descs_reference(hp, ha, hb, scale, 7, M, N), rtol=1e-5, atol=1e-5)


# -- tutorial 09: persistent matmul with host descriptors and its pre_hook autotune -------------


def check_matmul(c, a, b):
    ref = a.astype(np.float32) @ b.astype(np.float32).T
    got = c.astype(np.float32)
    assert not np.isnan(got).any()
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 1e-2, err


def test_tutorial_09_with_torch(cache_dir):
    torch = pytest.importorskip("torch")
    from triton.tools.tensor_descriptor import TensorDescriptor

    k = lazytriton.kernel(tma.matmul_kernel_tma_persistent)  # the tutorial's 48 configs and pre_hook
    M, N, K = 1000, 776, 520  # edges that are not multiples of any block
    sms = num_sms()
    stream = torch.cuda.current_stream().cuda_stream
    for i in range(2):
        a = torch.randn((M, K), device="cuda").half()
        b = torch.randn((N, K), device="cuda").half()
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        dummy = [1, 1]  # as the tutorial: the pre_hook sets the real block shapes
        descs = [TensorDescriptor.from_tensor(t, dummy) for t in (a, b, c)]
        before = lazytriton.stats()
        k[persistent_grid(M, N, sms)](*descs, M, N, K, FP8_OUTPUT=False, NUM_SMS=sms, WARP_SPECIALIZE=False,
                                      stream=stream)
        torch.cuda.synchronize()
        check_matmul(c.cpu().numpy(), a.cpu().numpy(), b.cpu().numpy())
        if i:
            assert lazytriton.stats()["resolves"] == before["resolves"]
    rec = k.records[-1]
    assert len(rec.candidates) == 48
    assert sum(c["time_ms"] is not None for c in rec.candidates) >= 2
    win = tma.matmul_kernel_tma_persistent.configs[rec.winner_index].kwargs
    bn = win["BLOCK_SIZE_N"] // 2 if win["EPILOGUE_SUBTILE"] else win["BLOCK_SIZE_N"]
    assert rec.extra["launch"]["descriptors"]["c_desc"] == f"tensordesc<fp16[{win['BLOCK_SIZE_M']}, {bn}]>"


def test_tutorial_09_with_cupy_and_a_persisted_winner(cache_dir):
    M, N, K = 512, 384, 256
    sms = num_sms()
    a, b = rand((M, K)), rand((N, K))

    def call(k):
        c = cp.full((M, N), cp.nan, cp.float16)
        descs = [lazytriton.TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, c)]
        k[persistent_grid(M, N, sms)](*descs, M, N, K, FP8_OUTPUT=False, NUM_SMS=sms, WARP_SPECIALIZE=False)
        cp.cuda.runtime.deviceSynchronize()
        check_matmul(c.get(), a.get(), b.get())

    k1 = small_matmul()
    call(lazytriton.kernel(k1))
    compiles = lazytriton.stats()["compiles"]
    hits = lazytriton.stats()["record_hits"]
    call(lazytriton.kernel(k1))  # a new LazyKernel: the persisted winner, with its block shapes, no compile
    assert lazytriton.stats()["record_hits"] == hits + 1
    assert lazytriton.stats()["compiles"] == compiles


def test_tutorial_09_captured_in_a_cuda_graph(cache_dir):
    # The CUtensorMap is encoded into the launch's parameters: a captured launch
    # replays with the buffers it was captured with, whatever their contents.
    M, N, K = 256, 256, 128
    sms = num_sms()
    a, b = rand((M, K)), rand((N, K))
    c = cp.full((M, N), cp.nan, cp.float16)
    descs = [lazytriton.TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, c)]
    k = lazytriton.kernel(small_matmul())
    run = lambda s: k[persistent_grid(M, N, sms)](*descs, M, N, K, FP8_OUTPUT=False, NUM_SMS=sms,  # noqa: E731
                                                    WARP_SPECIALIZE=False, stream=s.ptr)
    s = cp.cuda.Stream(non_blocking=True)
    run(s)  # resolve (tune) outside capture
    s.synchronize()
    with s:
        s.begin_capture()
        run(s)
        graph = s.end_capture()
    for _ in range(2):
        a[...] = rand((M, K))
        b[...] = rand((N, K))
        c.fill(cp.nan)
        cp.cuda.runtime.deviceSynchronize()
        graph.launch(s)
        s.synchronize()
        check_matmul(c.get(), a.get(), b.get())


# -- tutorial 06: fused attention forward, Hopper host-descriptor variant -----------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tutorial_06_attention_forward(cache_dir, causal, head_dim):
    torch = pytest.importorskip("torch")
    from triton.tools.tensor_descriptor import TensorDescriptor

    Z, H, N_CTX, D = 2, 3, 512, head_dim
    sm_scale = 0.5
    q, k_, v = (torch.randn((Z, H, N_CTX, D), device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    M = torch.full((Z, H, N_CTX), float("nan"), device="cuda", dtype=torch.float32)
    y_dim = Z * H * N_CTX
    dummy = [1, 1]  # as the tutorial: its pre_hook sets the block shapes
    desc_q, desc_k, desc_v, desc_o = (TensorDescriptor(t, shape=[y_dim, D], strides=[D, 1], block_shape=dummy)
                                      for t in (q, k_, v, o))
    kern = lazytriton.kernel(tma.attn_fwd)
    grid = lambda META: (triton.cdiv(N_CTX, META["BLOCK_M"]), Z * H, 1)  # noqa: E731
    kern[grid](sm_scale, M, Z, H, desc_q, desc_k, desc_v, desc_o, N_CTX=N_CTX, HEAD_DIM=D, FP8_OUTPUT=False,
               STAGE=3 if causal else 1, warp_specialize=False, IS_HOPPER=True,
               stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    p = torch.matmul(q.float(), k_.float().transpose(2, 3)) * sm_scale
    if causal:
        p = p.masked_fill(~torch.tril(torch.ones((N_CTX, N_CTX), device="cuda", dtype=torch.bool)), float("-inf"))
    ref = torch.matmul(torch.softmax(p, dim=-1), v.float())
    assert not torch.isnan(o).any()
    torch.testing.assert_close(o.float(), ref, atol=2e-2, rtol=0)
    assert not torch.isnan(M).any()


# -- JAX: lazytriton.jax.TensorDescriptor under jax.jit, command buffers on (conftest.py) -------


@pytest.fixture
def jx(jax_gpu):
    from lazytriton import jax as ltj
    return jax_gpu, jax_gpu.numpy, ltj


@pytest.mark.parametrize("dtype, padding, tf32", [("float32", "zero", False), ("float32", "nan", True),
                                                  ("float16", "nan", False), ("int8", "zero", False)])
def test_jax_host_descriptor_copy(cache_dir, dtype, padding, tf32, jx):
    # jax-triton 0.4's test_host_side_tma_copy.
    jax, jnp, ltj = jx
    M, N = 16, 128
    x = jax.random.uniform(jax.random.key(0), (M, N), dtype=jnp.float32)
    x = (x * 100).astype(dtype) if dtype == "int8" else x.astype(dtype)

    @jax.jit
    def f(x):
        d = ltj.TensorDescriptor.from_array(x, block_shape=[M, N], padding=padding, round_f32_to_tf32=tf32)
        return ltj.triton_call(d, kernel=tma.tma_copy_kernel, out_type=jax.typeof(x), grid=1, M=M, N=N)

    want = jnp.float32(jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)) if tf32 else x
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(want))


def test_jax_descriptors_inside_a_tuple(cache_dir, jx):
    jax, jnp, ltj = jx
    M, N = 16, 32
    scale = tuple_descs_data(M, N)[3]

    @jax.jit
    def f(p, a, b):
        descs = (ltj.TensorDescriptor.from_array(a, [1, M, N]), (ltj.TensorDescriptor.from_array(b, [M, N]), scale, 1))
        return ltj.triton_call(p, descs, k=7, kernel=tma.tma_tuple_descs,
                               out_type=jax.ShapeDtypeStruct((2, M, N), jnp.float32), grid=2, M=M, N=N)

    keep = []
    for _ in range(3):  # fresh operands, kept alive (new addresses): the handler encodes from them each time
        hp, ha, hb, _ = tuple_descs_data(M, N)
        operands = [jnp.asarray(x) for x in (hp, ha, hb)]
        keep += operands
        got = np.asarray(f(*operands))
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, tuple_descs_reference(hp, ha, hb, scale, 7, M, N), rtol=1e-5, atol=1e-5)


def test_jax_tutorial_09_changing_buffers_under_command_buffers(cache_dir, jx):
    jax, jnp, ltj = jx
    M, N, K = 512, 384, 256
    sms = num_sms()
    kernel = small_matmul()

    @jax.jit
    def mm(a, b):
        # c is written through a descriptor: an input aliased to the output (jax-triton 0.4's convention),
        # poisoned with NaN here: the kernel must overwrite all of it.
        c0 = jnp.full((M, N), jnp.nan, jnp.float16)
        descs = [ltj.TensorDescriptor.from_array(t, [1, 1]) for t in (a, b, c0)]
        return ltj.triton_call(*descs, M, N, K, kernel=kernel, out_type=jax.ShapeDtypeStruct((M, N), jnp.float16),
                               input_output_aliases={2: 0}, grid=persistent_grid(M, N, sms),
                               FP8_OUTPUT=False, NUM_SMS=sms, WARP_SPECIALIZE=False)

    keep, pointers = [], set()
    for i in range(4):  # fresh operands each time: XLA re-records with the new addresses
        ka, kb = jax.random.split(jax.random.key(i))
        a = jax.random.normal(ka, (M, K), jnp.float16)
        b = jax.random.normal(kb, (N, K), jnp.float16)
        keep += [a, b]
        pointers.add(a.unsafe_buffer_pointer())
        c = mm(a, b)
        check_matmul(np.asarray(c), np.asarray(a), np.asarray(b))
    assert len(pointers) == 4
    assert lazytriton.stats()["tunes"] >= 1


@pytest.mark.parametrize("causal", [False, True])
def test_jax_tutorial_06_attention_forward_under_command_buffers(cache_dir, jx, causal):
    """Tutorial 06's forward kernel, its pre_hook autotune, through triton_call
    under jax.jit with command buffers on: host descriptors over (Z*H*N_CTX,
    HEAD_DIM) views of (Z, H, N_CTX, HEAD_DIM) arrays, as the tutorial builds
    them; o (through a descriptor) and the log-sum-exp M (through a pointer) are
    inputs poisoned with NaN and aliased to the outputs (jax-triton 0.4's
    convention). Fresh q, k, v at each execution, checked against float32."""
    jax, jnp, ltj = jx
    Z, H, N_CTX, D = 2, 3, 512, 64
    y, sm_scale = Z * H * N_CTX, 0.5

    @jax.jit
    def attn(q, k, v):
        o0 = jnp.full((Z, H, N_CTX, D), jnp.nan, jnp.float16)
        m0 = jnp.full((Z, H, N_CTX), jnp.nan, jnp.float32)
        dq, dk, dv, do = (ltj.TensorDescriptor(t, shape=(y, D), strides=(D, 1), block_shape=(1, 1))
                          for t in (q, k, v, o0))
        return ltj.triton_call(sm_scale, m0, Z, H, dq, dk, dv, do, kernel=tma.attn_fwd,
                               out_type=(jax.typeof(o0), jax.typeof(m0)), input_output_aliases={7: 0, 1: 1},
                               grid=lambda META: (triton.cdiv(N_CTX, META["BLOCK_M"]), Z * H, 1),
                               N_CTX=N_CTX, HEAD_DIM=D, FP8_OUTPUT=False, STAGE=3 if causal else 1,
                               warp_specialize=False, IS_HOPPER=True)

    for i in range(3):  # new operands each time: XLA re-records the command buffer with their addresses
        q, k, v = (jax.random.normal(key, (Z, H, N_CTX, D), jnp.float16)
                   for key in jax.random.split(jax.random.key(10 + i), 3))
        o, m = attn(q, k, v)
        qf, kf, vf = (np.asarray(t, np.float32) for t in (q, k, v))
        p = qf @ kf.transpose(0, 1, 3, 2) * sm_scale
        if causal:
            p = np.where(np.tril(np.ones((N_CTX, N_CTX), bool)), p, -np.inf)
        e = np.exp(p - p.max(-1, keepdims=True))
        ref = (e / e.sum(-1, keepdims=True)) @ vf
        o, m = np.asarray(o, np.float32), np.asarray(m)
        assert not np.isnan(o).any() and not np.isnan(m).any()
        np.testing.assert_allclose(o, ref, atol=2e-2, rtol=0)
        # M: the row's log2-sum-exp of the scaled scores (the tutorial's backward reads it)
        lse2 = (np.log(e.sum(-1)) + p.max(-1)) / np.log(2)
        np.testing.assert_allclose(m, lse2, atol=1e-2, rtol=1e-3)
    assert lazytriton.stats()["tunes"] >= 1


# -- C++: a bundle's tutorial 09 winner launched with lt::TensorDesc arguments -----------------

MATMUL_CPP = r"""
#include <lazytriton/bundle.h>
#ifdef LT_LAZY
#include <lazytriton/embed.h>
#endif
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

// argv: bundle, kernel name, M, N, K, a.bin, b.bin, c.bin (written), NUM_SMS[, python path (lazy)]
int main(int argc, char** argv) {
  try {
    lt::Bundle bundle = lt::Bundle::open(argv[1]);
#ifdef LT_LAZY
    lt::enable_lazy(bundle, {{argv[10]}});
#endif
    const int64_t M = std::atoll(argv[3]), N = std::atoll(argv[4]), K = std::atoll(argv[5]);
    const int64_t sms = std::atoll(argv[9]);
    auto read = [](const char* path, size_t n) {
      std::vector<uint16_t> v(n);
      std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 2));
      return v;
    };
    std::vector<uint16_t> ha = read(argv[6], size_t(M * K)), hb = read(argv[7], size_t(N * K)), hc(size_t(M * N));
    const lt::Driver& d = lt::driver();
    lt::current_context();
    lt::cu::CUdeviceptr a, b, c;
    lt::check(d.cuMemAlloc(&a, ha.size() * 2), "cuMemAlloc");
    lt::check(d.cuMemAlloc(&b, hb.size() * 2), "cuMemAlloc");
    lt::check(d.cuMemAlloc(&c, hc.size() * 2), "cuMemAlloc");
    lt::check(d.cuMemcpyHtoDAsync(a, ha.data(), ha.size() * 2, nullptr), "cuMemcpyHtoDAsync");
    lt::check(d.cuMemcpyHtoDAsync(b, hb.data(), hb.size() * 2, nullptr), "cuMemcpyHtoDAsync");
    lt::check(d.cuMemsetD8Async(c, 0xFF, hc.size() * 2, nullptr), "cuMemsetD8Async");  // fp16 NaN
    // The tutorial's dummy block: the winner's pre_hook block shapes are the ones encoded.
    lt::TensorDesc da(lt::DevicePtr(a), {M, K}, {K, 1}, {1, 1});
    lt::TensorDesc db(lt::DevicePtr(b), {N, K}, {K, 1}, {1, 1});
    lt::TensorDesc dc(lt::DevicePtr(c), {M, N}, {N, 1}, {1, 1});
    lt::BundleKernel k = bundle.kernel(
        argv[2], "tensordesc<fp16[1, 1]>,tensordesc<fp16[1, 1]>,tensordesc<fp16[1, 1]>,i32,i32,i32",
        {{"FP8_OUTPUT", false}, {"NUM_SMS", sms}, {"WARP_SPECIALIZE", false}});
    auto grid = [&](const lt::Meta& m) {
      int64_t tiles = ((M + m["BLOCK_SIZE_M"] - 1) / m["BLOCK_SIZE_M"]) * ((N + m["BLOCK_SIZE_N"] - 1) / m["BLOCK_SIZE_N"]);
      return lt::Dim3{unsigned(tiles < sms ? tiles : sms)};
    };
    k.launch(nullptr, grid, {da, db, dc, M, N, K});
    lt::check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
    lt::check(d.cuMemcpyDtoHAsync(hc.data(), c, hc.size() * 2, nullptr), "cuMemcpyDtoHAsync");
    lt::check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
    std::ofstream(argv[8], std::ios::binary).write(reinterpret_cast<const char*>(hc.data()), std::streamsize(hc.size() * 2));
    std::printf("winner: %s\n", k.winner({da, db, dc, M, N, K}).specialization.c_str());
  } catch (const lt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
"""

MATMUL_CMAKE = """
cmake_minimum_required(VERSION 3.18)
project(tma_matmul LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(lazytriton CONFIG REQUIRED)
add_executable(matmul_aot matmul.cc)
target_link_libraries(matmul_aot PRIVATE lazytriton::runtime)
if(TARGET lazytriton::embed)
  add_executable(matmul_lazy matmul.cc)
  target_compile_definitions(matmul_lazy PRIVATE LT_LAZY)
  target_link_libraries(matmul_lazy PRIVATE lazytriton::embed)
endif()
"""


@pytest.fixture(scope="module")
def matmul_programs(tmp_path_factory):
    from test_embed import CMAKE, cmake_build

    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    src = tmp_path_factory.mktemp("tma-matmul-src")
    (src / "matmul.cc").write_text(MATMUL_CPP)
    (src / "CMakeLists.txt").write_text(MATMUL_CMAKE)
    cmake_build(src, src / "build")
    return src / "build"


def _run_matmul(exe, d, name, M, N, K, tmp_path, extra=()):
    from test_embed import run

    a, b = rand((M, K), seed=1).get(), rand((N, K), seed=2).get()
    a.tofile(tmp_path / "a.bin")
    b.tofile(tmp_path / "b.bin")
    out = run(exe, d, name, M, N, K, tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "c.bin", num_sms(), *extra)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    check_matmul(np.fromfile(tmp_path / "c.bin", np.float16).reshape(M, N), a, b)
    return out


def test_cpp_bundle_launches_tutorial_09(matmul_programs, tmp_path, cache_dir):
    from lazytriton.cpp import bundle

    M, N, K = 512, 384, 256
    sms = num_sms()
    a, b, c = rand((M, K)), rand((N, K)), cp.empty((M, N), cp.float16)
    descs = [lazytriton.TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, c)]
    d = tmp_path / "bundle"
    v = bundle.Bundle(d).add(small_matmul(), *descs, M, N, K, grid=persistent_grid(M, N, sms),
                             source="kernels.tma:matmul_kernel_tma_persistent_small",
                             FP8_OUTPUT=False, NUM_SMS=sms, WARP_SPECIALIZE=False)
    assert v["types"][:3] == ["tensordesc<fp16[1, 1]>"] * 3 and v["key_values"] == {"M": M, "N": N, "K": K}
    assert len(v["launch"]["tensordesc_meta"]) == 3
    out = _run_matmul(matmul_programs / "matmul_aot", d, "matmul_kernel_tma_persistent", M, N, K, tmp_path)
    assert "tensordesc<fp16[1, 1]>" in out.stdout


def test_cpp_lazy_mode_tunes_a_descriptor_kernel(matmul_programs, tmp_path, cache_dir):
    from pathlib import Path

    exe = matmul_programs / "matmul_lazy"
    if not exe.exists():
        pytest.skip("lazytriton::embed not built (no shared libpython)")
    d = tmp_path / "bundle"
    tests = Path(__file__).resolve().parent
    name = "kernels.tma:matmul_kernel_tma_persistent_small"
    _run_matmul(exe, d, name, 256, 256, 128, tmp_path, extra=(tests,))
    from lazytriton.cpp import bundle
    (v,) = bundle.Bundle(d).variants()
    assert v["types"][0] == "tensordesc<fp16[1, 1]>"
    # The next run launches the persisted winner without Python.
    _run_matmul(matmul_programs / "matmul_aot", d, name, 256, 256, 128, tmp_path)
