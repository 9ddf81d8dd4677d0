"""The field corpus on the CPU (no GPU needed): every upstream kernel the GPU
corpus runs imports from its installed package, lazytriton wraps it, and its
candidates for the specializations the GPU sequences use (optional pointers
None and given, the dtypes, the wrappers' constexprs and options) bind and
compile to sm_90 cubins whose kernel parameters are the runtime arguments
lazytriton passes (then the two scratch pointers). Skips per package when it
is not installed (see tests/field/upstream.py and README "Field corpus")."""
import re
import subprocess
from pathlib import Path

import pytest
import triton
from triton.backends.compiler import GPUTarget

import lazytriton
from lazytriton.model.arrays import DeviceArray
from lazytriton.compile.compiler import compile_all
from lazytriton.runtime.resolve import Resolution

from field import upstream

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
PARAM_BYTES = {"i1": 1, "u1": 1, "i8": 1, "i16": 2, "i32": 4, "u32": 4, "fp32": 4, "i64": 8, "u64": 8, "fp64": 8}
_next = [0x7F0000000000]


def arr(dtype: str, n: int) -> DeviceArray:
    """A stand-in device buffer (address 256-aligned, as the allocators give)."""
    ptr = _next[0]
    _next[0] += (n * 8 + 0xFFFF) & ~0xFFF
    return DeviceArray(ptr, dtype, n * (1 if dtype == "u1" else int(dtype.lstrip("uifbp")) // 8))


# key -> [(variant label, positional args, keyword args)], as the wrappers call them.
def _te_permute(pad, probs, scale, dt="bf16", T=37, E=8, H=1000):
    n_out = T * 2 + (E * 16 if pad else 0)
    return (f"pad={pad} probs={probs} scale={scale} {dt}",
            (arr(dt, T * H), arr("i32", T * (2 * E + 1)), arr("fp32", T * E) if probs else None,
             arr("fp32", T * 8) if scale else None, arr("fp32", n_out * 8) if scale else None,
             arr("i64", E) if pad else None, arr(dt, n_out * H), arr("fp32", n_out) if probs else None,
             8, T, n_out, 2 * E + 1, 1, H, 1, H, 1, E if probs else None, 1 if probs else None,
             8 if scale else None, 1 if scale else None, 1 if probs else None, 8 if scale else None,
             1 if scale else None, arr(dt, n_out * H), arr("fp32", n_out) if probs else None, E, H),
            dict(PERMUTE_PROBS=probs, PERMUTE_SCALE=scale, FUSION_PAD=pad))


def _te_unpermute(pad, merging, probs, dt="bf16", T=37, E=8, H=1000):
    n_in = T * 2 + (E * 16 if pad else 0)
    return (f"pad={pad} merging={merging} probs={probs} {dt}",
            (arr(dt, n_in * H), arr("i32", T * (2 * E + 1)), arr("fp32", T * E) if merging else None,
             arr("fp32", n_in) if probs else None, arr("i64", E) if pad else None, arr(dt, T * H),
             arr("fp32", T * E) if probs else None, 2 * E + 1, 1, H, 1, H, 1, E if merging else None,
             1 if merging else None, 1 if probs else None, E if probs else None, 1 if probs else None,
             arr(dt, T * H), arr("fp32", T * E) if probs else None, E, H),
            dict(PROBS_LOAD_WIDTH=triton.next_power_of_2(E), WITH_MERGING_PROBS=merging, PERMUTE_PROBS=probs,
                 FUSION_UNPAD=pad))


def _rms(w, dt, cast, n=1000):
    return (f"W={w} {dt} casting={cast}",
            (arr(dt, 8 * n), n, arr(dt, 8 * n), n, arr(dt, n) if w else None, 1 if w else 0, arr("fp32", 8), 1, n,
             1e-6, 0.0, cast),
            dict(elementwise_affine=w, BLOCK_SIZE=triton.next_power_of_2(n), num_warps=4))


def _ce(weight, z, acc, softcap, dt="fp32", V=5000):
    return (f"weight={weight} z_loss={z} accuracy={acc} softcap={softcap} {dt}",
            (), dict(X_ptr=arr(dt, 8 * V), X_stride=V, Y_ptr=arr("i64", 8), Y_stride=1,
                     weight_ptr=arr("fp32", V) if weight else None, loss_ptr=arr(dt, 8),
                     z_loss_ptr=arr(dt, 8) if z else None, loss_stride=1,
                     token_accuracy_ptr=arr("fp32", 8) if acc else None, token_accuracy_stride=1 if acc else 0,
                     predicted_tokens_ptr=None, predicted_tokens_stride=0, n_cols=V, n_non_ignore=7,
                     sum_non_ignore_weight=3.5 if weight else 7, ignore_index=-100,
                     weight_sum=12.5 if weight else 0.0, lse_square_scale=1e-4 if z else 0.0, label_smoothing=0.0,
                     reduction="mean", softcap=softcap, RETURN_Z_LOSS=z, RETURN_TOKEN_ACCURACY=acc,
                     RETURN_PREDICTED_TOKENS=False, BLOCK_SIZE=triton.next_power_of_2(V), HAS_WEIGHT=weight,
                     HAS_SOFTCAPPING=softcap is not None, HAS_GRADIENTS=True, num_warps=32))


def _fused_recurrent(h0, ht, varlen, dt="bf16", B=2, T=33, H=2, K=64, V=64):
    N = 3 if varlen else B
    return (f"h0={h0} ht={ht} cu_seqlens={varlen} {dt}",
            (), dict(q=arr(dt, B * T * H * K), k=arr(dt, B * T * H * K), v=arr(dt, B * T * H * V), g=None,
                     g_gamma=None, gk=arr("fp32", B * T * H * K), gv=None, o=arr("fp32", B * T * H * V),
                     h0=arr("fp32", N * H * K * V) if h0 else None, ht=arr("fp32", N * H * K * V) if ht else None,
                     cu_seqlens=arr("i64", N + 1) if varlen else None, scale=K ** -0.5, T=T if not varlen else B * T,
                     B=B if not varlen else 1, H=H, K=K, V=V, BK=64, BV=64, USE_G=False, USE_G_GAMMA=False,
                     USE_GK=True, USE_GV=False, REVERSE=False, STATE_V_FIRST=False))


CASES = {
    "te._row_id_map_pass_1_kernel": [("T=37 E=8", (arr("u1", 37 * 8), 37, 1, 37, 17, 1, arr("i32", 37 * 17),
                                                   arr("i32", 8)), dict(BLOCK_SIZE=1024))],
    "te._row_id_map_pass_2_kernel": [("T=37 E=8", (arr("i32", 37 * 17), arr("i32", 8), 37, 17, 1, 8, 1024), {})],
    "te._row_id_map_pass_3_kernel": [("T=37 E=8", (arr("i32", 37 * 17), 17, 1, 8, 8), {})],
    "te._permute_kernel": [_te_permute(False, False, False), _te_permute(True, False, False),
                           _te_permute(True, True, False), _te_permute(False, True, True, "fp16")],
    "te._unpermute_kernel": [_te_unpermute(False, False, False), _te_unpermute(True, True, True),
                             _te_unpermute(False, True, False, "fp32")],
    "liger._rms_norm_forward_kernel": [_rms(True, "bf16", 0), _rms(False, "fp16", 1), _rms(True, "fp32", 2)],
    "liger._layer_norm_forward_kernel": [("fp16", (arr("fp16", 8 * 1000), 1000, arr("fp16", 8 * 1000), 1000,
                                                   arr("fp16", 1000), 1, arr("fp16", 1000), 1, arr("fp32", 8), 1,
                                                   arr("fp32", 8), 1, 1000, 1e-5),
                                          dict(BLOCK_SIZE=1024, num_warps=4))],
    "liger._swiglu_forward_kernel": [("bf16", (arr("bf16", 8 * 1000), arr("bf16", 8 * 1000),
                                               arr("bf16", 8 * 1000), 1000, 1.0),
                                      dict(n_cols=1000, BLOCK_SIZE=1024, num_warps=4))],
    "liger.liger_cross_entropy_kernel": [_ce(False, False, False, None), _ce(True, True, True, 30.0),
                                         _ce(False, True, False, None, "bf16")],
    "liger._triton_rope": [("bf16 partial", (arr("bf16", 2 * 17 * 4 * 64), 4 * 64, arr("bf16", 2 * 17 * 2 * 64),
                                             2 * 64, arr("bf16", 17 * 64), 64, arr("bf16", 17 * 64), 64, 17, 2, 1,
                                             4, 2, 64, 4, 2, 64, 32, 32),
                            dict(BLOCK_SIZE=4, BACKWARD_PASS=False))],
    "fla.fused_recurrent_fwd_kernel": [_fused_recurrent(False, False, False), _fused_recurrent(True, True, False),
                                       _fused_recurrent(True, False, True, "fp32")],
    "fla.l2norm_fwd_kernel": [("fp16 D=100", (), dict(x=arr("fp16", 77 * 100), y=arr("fp16", 77 * 100),
                                                      rstd=arr("fp32", 77), eps=1e-6, T=77, D=100, BD=128, NB=1))],
}


def lazy(key: str) -> lazytriton.LazyKernel:
    try:
        return lazytriton.kernel(upstream.kernel(key))
    except upstream.Missing:
        raise
    except ImportError as exc:  # the package is there but cannot import here (a torch it needs, say)
        pytest.skip(f"{key}: {exc}")


@pytest.mark.parametrize("key", sorted(upstream.KERNELS))
def test_upstream_kernel_imports_and_lazytriton_wraps_it(key):
    k = lazy(key)
    assert isinstance(k, lazytriton.LazyKernel)
    assert k.name == upstream.KERNELS[key][2]
    # Autotuned upstream kernels (TE's, fla's CachedAutotuner subclass, under fla's heuristics) keep every config.
    layer, configs = upstream.kernel(key), []
    while not isinstance(layer, triton.runtime.JITFunction):
        configs = getattr(layer, "configs", configs)
        layer = layer.fn
    assert len(k.spec.configs) == len(configs)


def cubin_params(cubin: bytes, tmp_path: Path) -> list[int]:
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    dump = subprocess.run([str(CUOBJDUMP), "-elf", str(path)], capture_output=True, text=True, check=True).stdout
    sizes = {int(o, 16): int(s, 16)
             for o, s in re.findall(r"Ordinal\s*:\s*(0x[0-9a-f]+).*?Size\s*:\s*(0x[0-9a-f]+)", dump)}
    return [sizes[i] for i in sorted(sizes)]


CASE_IDS = [(key, i) for key in sorted(CASES) for i in range(len(CASES[key]))]


@pytest.mark.parametrize("key,i", CASE_IDS, ids=[f"{k}-{CASES[k][i][0]}" for k, i in CASE_IDS])
def test_candidates_compile_for_sm90(key, i, tmp_path, cache_dir):
    label, args, kwargs = CASES[key][i]
    k = lazy(key)
    full = k._bind_call(args, dict(kwargs))  # the positional call tuple the stubs read
    res = Resolution(k, (0,), full, 0, (1,), k._shape(full))
    res.target = TARGET
    cands = res._candidates()
    assert len(cands) == max(1, len(k.spec.configs))
    # Two candidates at most per case: each is a full Triton compile on a small CI machine.
    picked = cands[:1] + cands[-1:] if len(cands) > 1 else cands
    compile_all(k.spec, TARGET, picked)
    for c in picked:
        assert c.error is None and c.binary is not None, f"{key} [{label}] config {c.index}: {c.error}"
        md = c.binary.metadata
        assert md["target"]["arch"] == 90 and md["name"] == k.name
        runtime = c.bound.runtime_types()
        # A pointer given None is a constexpr for Triton: no parameter (the FUSION_PAD case).
        sig = c.bound.flat_signature
        for name, v in zip([p.name for p in k.call_params], full):
            if v is None:
                assert sig.get(name, "constexpr") == "constexpr", (name, sig)
        if CUOBJDUMP.exists():
            expected = [8 if t.startswith("*") else PARAM_BYTES[t] for t in runtime] + [8, 8]
            got = cubin_params(c.binary.cubin, tmp_path)
            # Parameters of 1 byte are padded by the ABI to their own slots: compare sizes in order.
            assert got == expected, (key, label, runtime, got)
