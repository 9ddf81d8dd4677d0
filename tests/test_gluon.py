"""Gluon kernels (@triton.experimental.gluon.jit) through lazytriton, without a
GPU: described as Gluon, compiled from Gluon's own ASTSource (in this process
and in the compile server's workers) to cubin for sm_80 and sm_90, autotuned
(triton.autotune around a Gluon kernel), keyed apart from a @triton.jit kernel
of the same source, and lowered through lazytriton.jax.triton_call."""
import logging
import pickle

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonJITFunction
from triton.runtime.jit import JITFunction

import lazytriton
from lazytriton.compile import pool as compile_pool
from lazytriton.compile.ir_text import front_end
from lazytriton.cache import keys
from lazytriton.model.arrays import DeviceArray
from lazytriton.compile.compiler import Binder, Candidate, compile_all
from lazytriton.compile.targets import ast_source
from lazytriton.runtime.resolve import Resolution
from lazytriton.model.spec import kernel_spec

from kernels import basic, gluonk
from test_compile import check_binary

X = DeviceArray(0x7F0000000000, "fp32", 1 << 20)
SM90 = GPUTarget("cuda", 90, 32)


def bound(kernel, args, kwargs, target=SM90):
    spec = kernel_spec(kernel)
    return spec, Candidate(0, None, Binder(spec, target).bind(args, kwargs))


def test_gluon_kernels_are_described_as_gluon():
    for k in (gluonk.vec_add, gluonk.vec_add_tuned, gluonk.scale_rows):
        assert kernel_spec(k).gluon
    assert not kernel_spec(basic.add_kernel).gluon
    spec = kernel_spec(gluonk.vec_add_tuned)  # triton.autotune around a Gluon kernel
    assert [c.kwargs for c in spec.configs] == [{"BLOCK": 256, "WARPS": 2}, {"BLOCK": 512, "WARPS": 4},
                                                {"BLOCK": 2048, "WARPS": 8}]
    assert spec.tune_keys == ["n"]
    sig = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr", "WARPS": "constexpr"}
    src = ast_source(gluonk.vec_add, sig, {(4,): 512, (5,): 4}, {})
    assert type(src).__name__ == "GluonASTSource"
    assert type(ast_source(basic.add_kernel, sig, {(4,): 512}, {})).__name__ == "ASTSource"


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("case", ["vec_add", "scale_rows", "copy_scalar", "memcpy"])
def test_gluon_kernel_to_cubin(arch, case, tmp_path):
    target = GPUTarget("cuda", arch, 32)
    kernel, args, kwargs = {
        "vec_add": (gluonk.vec_add, (X, X, X, 1000, 512, 4), {"num_warps": 4}),
        "scale_rows": (gluonk.scale_rows, (X, X, X, 30, 40, 48, 48, 1.5, 16, 32, 2), {"num_warps": 2}),
        "copy_scalar": (gluonk.copy_scalar, (X, X), {}),
        "memcpy": (gluonk.memcpy, (X, X, 500, 64), {"num_warps": 1}),
    }[case]
    spec, c = bound(kernel, args, kwargs, target)
    # Triton 3.9's Gluon front end (expand_dims, scale_rows) leaves four ir.attribute objects that
    # its nanobind leak check reports when this process exits: Triton's own triton.compile of
    # the kernel does the same in a script. The front end runs here since issue 47.
    compile_all(spec, target, [c])
    check_binary(c, case, arch, tmp_path)  # ELF arch, metadata, parameters = runtime args + 2 scratch pointers
    assert c.binary.metadata["num_warps"] == kwargs.get("num_warps", 4)


def test_a_tl_ast_source_cannot_compile_a_gluon_kernel(tmp_path, monkeypatch):
    # Why lazytriton must pick Gluon's source: Triton's plain ASTSource has no warp count for the layouts.
    # (A fresh Triton cache: Triton's key is fn.cache_key, the same for both sources.)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    spec, c = bound(gluonk.vec_add, (X, X, X, 1000, 512, 4), {"num_warps": 4})
    b = c.bound
    with pytest.raises(Exception, match="num-warps|parsing"):
        triton.compile(triton.compiler.ASTSource(spec.fn, b.signature, b.constexprs, b.attrs), target=SM90,
                       options=b.options.__dict__)


@pytest.mark.skipif(not gluonk.HAVE_DEVICE_TMA, reason="Gluon's device-side TMA descriptors need Triton 3.6+")
def test_gluon_device_tma_kernel_reports_its_scratch(tmp_path):
    spec, c = bound(gluonk.tma_copy, (X, X, 16, 32), {})
    compile_all(spec, SM90, [c], max_workers=0)
    check_binary(c, "tma_copy", 90, tmp_path)
    md = c.binary.metadata
    assert md["global_scratch_size"] >= 256 and md["global_scratch_align"] == 128  # two 128-byte descriptors
    assert md["shared"] >= 16 * 32 * 4


@pytest.fixture
def fresh_pool(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv("LAZYTRITON_COMPILE_WORKERS", raising=False)
    pool = compile_pool.get_pool()
    if pool is None:
        pytest.skip("no compile workers here")
    pool.close()  # restarted with this test's Triton cache
    assert pool.wait_ready()  # so that the candidates go to the workers
    yield pool
    pool.close()


def test_gluon_candidates_compile_in_worker_processes(fresh_pool, caplog):
    spec = kernel_spec(gluonk.vec_add_tuned)
    binder = Binder(spec, SM90)
    cands = [Candidate(i, cfg, binder.bind((X, X, X, 100_000), cfg.all_kwargs())) for i, cfg in enumerate(spec.configs)]
    b = cands[0].bound
    ir = front_end(spec.fn, SM90, b.signature, b.constexprs, b.attrs, b.options.__dict__)
    # Gluon's front end made the IR (its language and first stage travel with it); the job pickles.
    gluon_src = ast_source(spec.fn, b.signature, b.constexprs, b.attrs)
    assert pickle.loads(pickle.dumps({"ir": ir, "target": SM90}))["ir"]["text"] == ir["text"]
    assert (ir["language"], ir["ext"]) == (gluon_src.language, gluon_src.ext)
    with caplog.at_level(logging.INFO, logger="lazytriton"):
        compile_all(spec, SM90, cands)
    assert "worker process(es)" in caplog.text, caplog.text
    assert all(c.binary is not None for c in cands), [c.error for c in cands]
    assert [c.binary.metadata["num_warps"] for c in cands] == [2, 4, 8]
    assert len({c.binary.cubin for c in cands}) == 3
    # The worker's bytes are this process's bytes.
    local = [Candidate(0, spec.configs[0], binder.bind((X, X, X, 100_000), spec.configs[0].all_kwargs()))]
    compile_all(spec, SM90, local, max_workers=0)
    assert local[0].binary.cubin == cands[0].binary.cubin


def _same_source(x, out, n, BLOCK: tl.constexpr):
    pass


def test_fingerprint_and_keys_tell_gluon_from_tl_of_the_same_source():
    as_tl, as_gluon = JITFunction(_same_source), GluonJITFunction(_same_source)
    assert as_tl.cache_key == as_gluon.cache_key  # Triton's own key: the source alone
    assert keys.kernel_fingerprint(as_tl) != keys.kernel_fingerprint(as_gluon)
    sig = {"x": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    args = (sig, {(3,): 64}, {}, {"num_warps": 4}, SM90)
    assert keys.compile_key(as_tl, *args) != keys.compile_key(as_gluon, *args)
    # A tl kernel's fingerprint has no language part: keys cached before stay valid.
    assert keys.kernel_fingerprint(as_tl) == keys.hash_parts({"cache_key": as_tl.cache_key,
                                                              "globals": keys._used_globals(as_tl)})


def test_autotuned_gluon_resolution_binds_and_compiles_each_config(cache_dir):
    # What a first call runs after picking the device's target (given here: no GPU).
    k = lazytriton.kernel(gluonk.vec_add_tuned)
    args = (X, X, X, 100_000)
    res = Resolution(k, (0,), args, 0, lambda m: (triton.cdiv(100_000, m["BLOCK"]),), k._shape(args))
    res.target = SM90
    cands = res._candidates()
    assert [(c.bound.options.num_warps, c.bound.constexprs[(5,)]) for c in cands] == [(2, 2), (4, 4), (8, 8)]
    compile_all(k.spec, SM90, cands, max_workers=0)
    assert all(c.binary is not None for c in cands), [c.error for c in cands]
    assert len({res.compile_key(c) for c in cands}) == 3


@pytest.mark.skipif(lazytriton.gpu_available()[0], reason="resolves on fake addresses: CPU only")
def test_lazy_gluon_call_reaches_resolution(cache_dir):
    k = lazytriton.kernel(gluonk.vec_add)
    with pytest.raises(lazytriton.RuntimeFailure, match="kernel vec_add: .*driver"):
        k[(2,)](X, X, X, 1000, BLOCK=512, WARPS=4, num_warps=4, stream=0)


# -- lazytriton.jax.triton_call with a Gluon kernel (lowered for CUDA on the CPU) ------------------

def _lower(f, *avals):
    from test_jax_lowering import lower, payload

    return payload(lower(f, *avals))


def test_triton_call_lowers_a_gluon_kernel_and_its_site_compiles_it(cache_dir):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from lazytriton import jax as ltj
    from lazytriton.jax import ffi as jax_ffi

    n = 10_000
    f32 = jax.ShapeDtypeStruct((n,), jnp.float32)

    def f(x, y):
        # vec_add(x, y, out, n): `n` bound by name, the output takes `out` (jax-triton 0.4's binding).
        return ltj.triton_call(x, y, n=n, kernel=gluonk.vec_add_tuned, out_type=x,
                               grid=lambda m: (triton.cdiv(n, m["BLOCK"]),))

    d = _lower(f, f32, f32)
    assert d["kernel"]["name"] == "vec_add_tuned"
    assert d["kernel"]["fingerprint"] == keys.kernel_fingerprint(gluonk.vec_add_tuned)
    assert [c["kwargs"] for c in d["configs"]] == [c.kwargs for c in gluonk.vec_add_tuned.configs]
    assert [c["grid"][0] for c in d["configs"]] == [triton.cdiv(n, b) for b in (256, 512, 2048)]
    # The handler's side: the site rebuilt from the payload compiles Gluon for the device's target.
    jax_ffi._kernels.clear()
    site = jax_ffi.Site(d)
    assert site.lazy.spec.gluon
    assert [a.get("buffer", a.get("scalar")) for a in d["args"]] == [0, 1, 2, n]
    args = (X, X, X, n)
    res = Resolution(site.lazy, (0,), args, 0, site._grid, site.lazy._shape(args))
    res.target = SM90
    cands = res._candidates()
    compile_all(site.lazy.spec, SM90, cands, max_workers=0)
    assert [c.binary.metadata["num_warps"] for c in cands] == [2, 4, 8], [c.error for c in cands]


def test_triton_call_with_jax_tritons_gluon_memcpy(cache_dir):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from lazytriton import jax as ltj

    size, block = 500, 64
    x = jax.ShapeDtypeStruct((size,), jnp.float32)
    d = _lower(lambda x: ltj.triton_call(x, size=size, kernel=gluonk.memcpy, out_type=x,
                                         grid=(triton.cdiv(size, block),), num_warps=1, block_size=block), x)
    assert d["kernel"]["name"] == "memcpy"
    # The constexprs are the call's arguments (the payload carries the one binding), num_warps an option.
    assert [a.get("buffer", a.get("scalar")) for a in d["args"]] == [0, 1, size, block]
    assert [a.get("dtype") for a in d["args"][:2]] == ["fp32", "fp32"]
    assert d["options"] == {"num_warps": 1} and d["configs"] == [{"grid": [8, 1, 1], "kwargs": {}, "zeroed": []}]


def test_triton_call_gluon_memcpy_into_a_ref(cache_dir):
    # test_gpu_gluon's in-place memcpy (jax-triton 0.4's test_memcpy_inplace): `size` positional after the Ref.
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from lazytriton import jax as ltj

    size, block = 500, 64

    def g(x, y):
        r = jax.new_ref(y)
        assert ltj.triton_call(x, r, size, kernel=gluonk.memcpy, out_type=(), grid=(triton.cdiv(size, block),),
                               num_warps=1, block_size=block) == ()
        return r[...]

    x = jax.ShapeDtypeStruct((size,), jnp.float32)
    d = _lower(g, x, x)
    # x: input 0; the Ref: input 1 aliased to the call's one output (buffer 2), which the kernel writes.
    assert [a.get("buffer", a.get("scalar")) for a in d["args"]] == [0, 2, size, block]
    assert d["aliases"] == [[1, 0]] and d["options"] == {"num_warps": 1}


@pytest.mark.skipif(not gluonk.HAVE_DEVICE_TMA, reason="Gluon's device-side TMA descriptors need Triton 3.6+")
def test_triton_call_lowers_the_device_tma_copy_and_its_site_compiles_it(cache_dir):
    # test_gpu_gluon's shapes: every one compiles for sm_90 with two 128-byte descriptors in global scratch.
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from lazytriton import jax as ltj
    from lazytriton.jax import ffi as jax_ffi

    for M, N in [(32, 32), (8, 64), (16, 128)]:
        d = _lower(lambda x: ltj.triton_call(x, kernel=gluonk.tma_copy, out_type=x, grid=1, M=M, N=N),
                   jax.ShapeDtypeStruct((M, N), jnp.float32))
        assert [a.get("buffer", a.get("scalar")) for a in d["args"]] == [0, 1, M, N]
        jax_ffi._kernels.clear()
        site = jax_ffi.Site(d)
        args = (X, X, M, N)
        res = Resolution(site.lazy, (0,), args, 0, site._grid, site.lazy._shape(args))
        res.target = SM90
        (c,) = res._candidates()
        compile_all(site.lazy.spec, SM90, [c], max_workers=0)
        assert c.binary is not None, c.error
        md = c.binary.metadata
        assert md["global_scratch_size"] >= 256 and md["global_scratch_align"] == 128 and md["shared"] >= M * N * 4
