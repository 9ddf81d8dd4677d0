"""Host-side TMA tensor descriptors as kernel arguments, without a GPU: how a
descriptor is keyed (Triton specializes it on its dtype and block shape only),
compiled for sm_90 (and decomposed for sm_80), expanded into kernel
parameters (checked against the cubin's own parameter table), validated
(clear errors naming the kernel and the argument) and how config pre_hooks
that set block shapes become part of each candidate's compile.

Addresses are made up (lazytriton.model.arrays.DeviceArray); nothing is launched."""
import json
import os
import re
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.tools.tensor_descriptor import TensorDescriptor as TritonTD

import lazytriton
from lazytriton import _core
from lazytriton.model import pre_hooks, tensor_desc
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DTYPE_IDS, DTYPES, DeviceArray, PointerArg, itemsize
from lazytriton.compile.compiler import Binder, compile_all, compile_one
from lazytriton.runtime.resolve import Resolution
from lazytriton.model.spec import KernelSpecError, kernel_spec

from kernels import tma

SM90 = GPUTarget("cuda", 90, 32)
SM80 = GPUTarget("cuda", 80, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
BASE = 0x7F0000000000
NO_GPU = not lazytriton.gpu_available()[0]
# The descriptor parameter layout of the installed Triton (tensor_desc.h): 1 for 3.5/3.6, 2 for 3.7+.
INSTALLED_ABI = 1 if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7) else 2


def array(shape, dtype="fp16", addr=BASE) -> DeviceArray:
    n = 1
    for s in shape:
        n *= s
    return DeviceArray(addr, dtype, n * itemsize(dtype), tuple(shape))


def triton_td(base, shape, strides, block, padding="zero") -> TritonTD:
    """Triton's own TensorDescriptor (its __post_init__ wants a torch tensor: bypassed)."""
    d = object.__new__(TritonTD)
    d.base, d.shape, d.strides, d.block_shape, d.padding = base, list(shape), list(strides), list(block), padding
    d.round_f32_to_tf32 = False
    return d


def desc(shape=(256, 128), block=(64, 64), dtype="fp16", addr=BASE, **kw) -> lazytriton.TensorDescriptor:
    return lazytriton.TensorDescriptor.from_tensor(array(shape, dtype, addr), list(block), **kw)


# -- keys ----------------------------------------------------------------------------------


def stubs_for(k, args):
    shape = k._shape(args)
    return shape, stubgen.generic_stub(shape), stubgen.load_stub(shape)


def test_descriptor_slot_and_key(cache_dir):
    k = lazytriton.kernel(tma.tma_copy_kernel)
    out = array((64, 64))
    args = k._bind_call((desc((256, 128), (64, 64)), out), {"M": 64, "N": 64})
    shape, generic, built = stubs_for(k, args)
    slot = shape.slots[0]
    assert (slot.kind, DTYPES[slot.dtype], slot.rank) == ("desc", "fp16", 2)
    key = generic.key(args)
    assert key == built.key(args)
    # The block shape is in the key (it is the kernel's type); shape, strides, base and padding are not.
    same = k._bind_call((desc((512, 64), (64, 64), addr=BASE + 4096, padding="nan"), out), {"M": 64, "N": 64})
    assert built.key(same) == key and generic.key(same) == key
    other_block = k._bind_call((desc((256, 128), (32, 64)), out), {"M": 64, "N": 64})
    assert built.key(other_block) != key
    # Another dtype or rank is another shape (stub), whose key ends with another shape word.
    for other in (desc((256, 128), (64, 64), dtype="bf16"), desc((4, 256, 128), (1, 64, 64))):
        a = k._bind_call((other, out), {"M": 64, "N": 64})
        assert built.key(a) is None  # not this stub's shape
        assert stubgen.load_stub(k._shape(a)).key(a)[-1] != key[-1]


def test_params_report_what_the_launch_encodes(cache_dir):
    k = lazytriton.kernel(tma.tma_copy_kernel)
    d = desc((256, 128), (64, 32), padding="nan")
    args = k._bind_call((d, array((64, 32), addr=BASE + 2**20)), {"M": 64, "N": 32})
    _, generic, built = stubs_for(k, args)
    expected = (BASE, DTYPE_IDS["fp16"], (256, 128), (128, 1), (64, 32), True, False)
    assert generic.params(args)[0] == built.params(args)[0] == expected
    assert tensor_desc.read(d, "d").as_tuple() == expected


def test_triton_and_lazytriton_descriptors_key_alike(cache_dir):
    k = lazytriton.kernel(tma.tma_copy_kernel)
    base = array((256, 128))
    ours = lazytriton.TensorDescriptor.from_tensor(base, [64, 64])
    theirs = triton_td(base, (256, 128), (128, 1), (64, 64))
    out = array((64, 64))
    a1 = k._bind_call((ours, out), {"M": 64, "N": 64})
    a2 = k._bind_call((theirs, out), {"M": 64, "N": 64})
    assert k._shape(a1) == k._shape(a2)
    assert stubgen.load_stub(k._shape(a1)).key(a1) == stubgen.load_stub(k._shape(a2)).key(a2)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32", "fp8e4nv", "i8", "u16", "i32"])
def test_binder_type_is_dtype_and_block(dtype):
    spec = kernel_spec(tma.tma_copy_kernel)
    info = tensor_desc.read(desc((256, 128), (16, 32), dtype=dtype), "d")
    bound = Binder(spec, SM90).bind((), {"in_desc": tensor_desc.bind_value(info), "out_ptr": PointerArg(BASE, dtype),
                                         "M": 16, "N": 32})
    assert bound.signature["in_desc"] == info.type_string() == f"tensordesc<{dtype}[16, 32]>"
    assert (0,) not in bound.attrs or not bound.attrs[(0,)]  # Triton attaches no specialization to a descriptor


# -- validation ----------------------------------------------------------------------------

BAD = [
    (dict(shape=[64, 64], strides=[64, 2], block=[16, 16]), "last dimension must be contiguous"),
    (dict(shape=[64, 60], strides=[60, 1], block=[16, 16]), "multiple of 16 bytes"),
    (dict(shape=[64, 64], strides=[64, 1], block=[16, 16], addr=BASE + 8), "not 16-byte aligned"),
    (dict(shape=[64, 0], strides=[64, 1], block=[16, 16]), "each dimension must be in"),
    (dict(shape=[2] * 6, strides=[32, 16, 8, 4, 2, 1], block=[1] * 6), "rank 1 to 5"),
    (dict(shape=[64, 64], strides=[64, 1], block=[16]), "same length"),
    (dict(shape=[64, 64], strides=[64, 1], block=[16, 0]), "block_shape .*positive"),
    (dict(shape=[64, 64], strides=[64, 1], block=[16, 16], padding="nan", dtype="i32"), "floating-point"),
    (dict(shape=[64, 64], strides=[64, 1], block=[16, 16], padding="nan", dtype="fp8e4nv"), "16-, 32- or 64-bit"),
]


@pytest.mark.parametrize("bad, match", BAD, ids=[m for _, m in BAD])
def test_bad_descriptor_is_refused_naming_kernel_and_argument(cache_dir, bad, match):
    bad = dict(bad)
    base = array((64, 64), bad.pop("dtype", "fp16"), bad.pop("addr", BASE))
    d = triton_td(base, bad["shape"], bad["strides"], bad["block"], bad.get("padding", "zero"))
    k = lazytriton.kernel(tma.tma_copy_kernel)
    with pytest.raises(ValueError, match=rf"kernel tma_copy_kernel, argument in_desc: .*{match}"):
        k[(1,)](d, array((16, 16)), M=16, N=16)
    with pytest.raises(ValueError, match=match):  # lazytriton's own class checks as it is made
        lazytriton.TensorDescriptor(base, bad["shape"], bad["strides"], bad["block"], bad.get("padding", "zero"))


def test_a_built_stub_refuses_a_bad_descriptor_too(cache_dir):
    # A stub whose shape fits (fp16, rank 2) must not take a descriptor it cannot encode:
    # the call goes to Python, which names the problem.
    k = lazytriton.kernel(tma.tma_copy_kernel)
    good = k._bind_call((desc((64, 64), (16, 16)), array((16, 16))), {"M": 16, "N": 16})
    shape = k._shape(good)
    stub = stubgen.load_stub(shape)
    k._stubs = [stub]
    k._shapes[stub] = shape
    bad = triton_td(array((64, 64)), (64, 64), (64, 3), (16, 16))
    assert stub.key(k._bind_call((bad, array((16, 16))), {"M": 16, "N": 16})) is None
    with pytest.raises(ValueError, match="kernel tma_copy_kernel, argument in_desc: .*contiguous"):
        k[(1,)](bad, array((16, 16)), M=16, N=16)


def test_not_a_descriptor_in_a_descriptor_stub(cache_dir):
    k = lazytriton.kernel(tma.tma_copy_kernel)
    good = k._bind_call((desc((64, 64), (16, 16)), array((16, 16))), {"M": 16, "N": 16})
    stub = stubgen.load_stub(k._shape(good))
    assert stub.key((array((64, 64)), array((16, 16)), 16, 16)) is None
    assert stubgen.generic_stub(k._shape(good)).key((1.5, array((16, 16)), 16, 16)) is None


def meta_of(binary, **over) -> dict:
    md = dict(binary.metadata)
    md["tensordesc_meta"] = [dict(m, **over) for m in md["tensordesc_meta"]]
    return md


@pytest.fixture(scope="module")
def copy_sm90():
    spec = kernel_spec(tma.tma_copy_kernel)
    info = tensor_desc.read(desc((256, 128), (64, 64)), "d")
    bound = Binder(spec, SM90).bind((), {"in_desc": tensor_desc.bind_value(info), "out_ptr": PointerArg(BASE, "fp16"),
                                         "M": 64, "N": 64})
    return compile_one(spec, SM90, bound)


@pytest.mark.parametrize("over, match", [
    (dict(block_size=[64, 512]), r"block shape \[64, 512\]: TMA takes blocks of 1 to 256"),
    (dict(block_size=[64]), "compiled for a rank-1 descriptor, this one has rank 2"),
    (dict(elem_size=4), "compiled for 4-byte elements"),
    (dict(is_im2col=True), "im2col"),
])
def test_encode_checks_before_the_driver(copy_sm90, over, match):
    d = tensor_desc.read(desc((256, 128), (64, 64)), "d").as_tuple()
    with pytest.raises(lazytriton.RuntimeFailure, match=rf"kernel k, argument a_desc: .*{match}"):
        _core.pack_tensor_desc(meta_of(copy_sm90, **over), 0, d, "k", "a_desc")


def test_encode_needs_the_driver_only_after_its_checks(copy_sm90):
    d = tensor_desc.read(desc((256, 128), (64, 64)), "d").as_tuple()
    if NO_GPU:
        with pytest.raises(lazytriton.RuntimeFailure, match="no CUDA driver|no usable CUDA device|no CUDA device"):
            _core.pack_tensor_desc(copy_sm90.metadata, 0, d, "k", "a_desc")
    else:  # on a thread of its own, with no context current (the driver's CUDA_ERROR_INVALID_CONTEXT before)
        out = []
        t = threading.Thread(target=lambda: out.append(_core.pack_tensor_desc(copy_sm90.metadata, 0, d, "k", "a_desc")))
        t.start()
        t.join()
        assert [len(p) for p in out[0]] == [128, 4, 4, 8, 8]


ENCODE_WITHOUT_A_CONTEXT = """
import json, sys, threading
import lazytriton
from lazytriton import _core
from lazytriton.model import tensor_desc
from lazytriton.model.arrays import DeviceArray
md = json.loads(open(sys.argv[1]).read())
base = DeviceArray(0x7F0000000000, "fp16", 256 * 128 * 2, (256, 128))
d = tensor_desc.read(lazytriton.TensorDescriptor.from_tensor(base, [64, 64]), "d").as_tuple()
out = []

def pack():
    try:
        out.append([len(p) for p in _core.pack_tensor_desc(md, 0, d, "k", "a_desc")])
    except Exception as exc:
        out.append(str(exc))

for _ in range(2):  # each on a thread of its own: no context is current on it
    t = threading.Thread(target=pack)
    t.start()
    t.join()
print(json.dumps(out))
"""


def test_encode_on_a_thread_without_a_current_context(fake_driver, copy_sm90, tmp_path):
    """A thread's first launch packs its descriptors before the launch makes the device's context
    current, and the driver encodes a tensor map only with one (CUDA_ERROR_INVALID_CONTEXT, as on
    every GPU machine before; the stand-in driver answers as the driver does)."""
    (tmp_path / "meta.json").write_text(json.dumps(copy_sm90.metadata))
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_driver), TRITON_LIBCUDA_PATH=str(fake_driver),
               FAKE_CUDA_LOG="discard")
    r = subprocess.run([sys.executable, "-c", ENCODE_WITHOUT_A_CONTEXT, str(tmp_path / "meta.json")], env=env,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [[128, 4, 4, 8, 8]] * 2


@pytest.mark.skipif(not NO_GPU, reason="checks the machine without a GPU")
def test_launch_of_an_installed_descriptor_kernel_checks_then_needs_a_gpu(cache_dir, copy_sm90):
    k = lazytriton.kernel(tma.tma_copy_kernel)
    args = k._bind_call((desc((256, 128), (64, 64)), array((64, 64), addr=BASE + 2**20)), {"M": 64, "N": 64})
    key = stubgen.load_stub(k._shape(args)).key(args)
    for md, match in ((meta_of(copy_sm90, block_size=[64, 512]), "argument in_desc: block shape .*1 to 256"),
                      (copy_sm90.metadata, "no CUDA driver|no usable CUDA device|no CUDA device")):
        k._core.install(list(key), _core.Entry(_core.Kernel(copy_sm90.cubin, md), [True, True, False, False], {}))
        with pytest.raises(lazytriton.RuntimeFailure, match=rf"kernel tma_copy_kernel[:,] .*{match}"):
            k[(1,)](*args)


# -- compile and the parameter layout --------------------------------------------------------


def cubin_param_sizes(cubin: bytes, tmp_path: Path) -> list[int]:
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    dump = subprocess.run([str(CUOBJDUMP), "-elf", str(path)], capture_output=True, text=True, check=True).stdout
    params = re.findall(r"Ordinal\s*:\s*(0x[0-9a-f]+).*?Size\s*:\s*(0x[0-9a-f]+)", dump)
    sizes = {int(o, 16): int(s, 16) for o, s in params}
    return [sizes[i] for i in sorted(sizes)]


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="no cuobjdump in Triton's wheel")
def test_sm90_descriptor_is_a_128_byte_map_then_shape_and_strides(copy_sm90, tmp_path):
    md = copy_sm90.metadata
    (tm,) = md["tensordesc_meta"]
    assert tm["block_size"] == [64, 64] and tm["elem_size"] == 2 and not tm.get("is_im2col")
    core = _core.Kernel(copy_sm90.cubin, md).metadata
    # (Triton 3.5/3.6 have no is_im2col field: the core reads it as False.)
    assert core["tensordesc_meta"] == [{"is_im2col": False, **m} for m in md["tensordesc_meta"]]
    assert core["lt_tensordesc_abi"] == INSTALLED_ABI
    # in_desc: CUtensorMap, 2 x i32 shape, 2 x i64 strides; out_ptr; the two scratch pointers.
    assert cubin_param_sizes(copy_sm90.cubin, tmp_path) == [128, 4, 4, 8, 8, 8, 8, 8]


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="no cuobjdump in Triton's wheel")
@pytest.mark.parametrize("abi", [2, 1])
def test_sm80_descriptor_is_decomposed(tmp_path, abi):
    spec = kernel_spec(tma.tma_copy_kernel)
    d = desc((256, 128), (64, 64), padding="nan")
    info = tensor_desc.read(d, "d")
    bound = Binder(spec, SM80).bind((), {"in_desc": tensor_desc.bind_value(info), "out_ptr": PointerArg(BASE, "fp16"),
                                         "M": 64, "N": 64})
    binary = compile_one(spec, SM80, bound)
    assert not binary.metadata["tensordesc_meta"]  # not lowered to TMA: the decomposed layout
    md = dict(binary.metadata, lt_tensordesc_abi=abi)
    params = _core.pack_tensor_desc(md, 0, info.as_tuple(), "k", "in_desc")  # no driver needed here
    i64 = lambda *v: [struct.pack("<q", x) for x in v]  # noqa: E731
    flags = [b"\x01", b"\x00"] if abi == 2 else [b"\x01"]  # padding == "nan", then (3.7+) round_f32_to_tf32
    assert params == [struct.pack("<Q", BASE), *i64(256, 128, 128, 1), *flags,
                      *[struct.pack("<i", x) for x in (256, 128)], *i64(128, 1)]
    if abi == INSTALLED_ABI:  # the installed Triton compiled it: its parameter table matches
        assert [len(p) for p in params] + [8, 8, 8] == cubin_param_sizes(binary.cubin, tmp_path)
    tf32 = tensor_desc.read(desc((256, 128), (64, 64), "fp32", round_f32_to_tf32=True), "d").as_tuple()
    if abi == 1:  # Triton 3.5/3.6's decomposed descriptor cannot round to tf32: refused, not ignored
        with pytest.raises(lazytriton.RuntimeFailure, match="argument in_desc: round_f32_to_tf32 on a kernel not "
                                                            "lowered to TMA .* needs Triton 3.7"):
            _core.pack_tensor_desc(md, 0, tf32, "k", "in_desc")
    else:
        assert _core.pack_tensor_desc(md, 0, tf32, "k", "in_desc")[5:7] == [b"\x00", b"\x01"]
    assert _core.Kernel(binary.cubin, binary.metadata).metadata["lt_tensordesc_abi"] == INSTALLED_ABI


def test_abi_follows_the_triton_version_that_compiled_it(copy_sm90):
    for version, abi in (("3.5.1", 1), ("3.6.0", 1), ("3.7.0", 2), ("3.9.0", 2), ("4.0.0", 2)):
        md = {k: v for k, v in copy_sm90.metadata.items() if k != "lt_tensordesc_abi"}
        assert _core.Kernel(copy_sm90.cubin, dict(md, triton_version=version)).metadata["lt_tensordesc_abi"] == abi


# -- pre_hooks -------------------------------------------------------------------------------


def resolution(k, args, target=SM90):
    key = stubgen.load_stub(k._shape(args)).key(args)
    res = Resolution(k, key, args, 0, (1,), k._shape(args))
    res.target = target
    return res


def matmul_args(k, M=512, N=512, K=256, dummy=(1, 1)):
    a, b, c = array((M, K)), array((N, K), addr=BASE + 2**24), array((M, N), addr=BASE + 2**25)
    return k._bind_call((*(lazytriton.TensorDescriptor.from_tensor(x, list(dummy)) for x in (a, b, c)), M, N, K),
                        {"FP8_OUTPUT": False, "NUM_SMS": 132, "WARP_SPECIALIZE": False})


def test_tutorial_09_hook_blocks_per_config(cache_dir):
    k = lazytriton.kernel(tma.matmul_kernel_tma_persistent)
    res = resolution(k, matmul_args(k))
    cands = res._candidates()
    assert len(cands) == len(tma.matmul_tma_persistent_get_configs()) == 48
    for c in cands:
        kw = c.config.kwargs
        bn = kw["BLOCK_SIZE_N"] // 2 if kw["EPILOGUE_SUBTILE"] else kw["BLOCK_SIZE_N"]
        blocks = {"a_desc": [kw["BLOCK_SIZE_M"], kw["BLOCK_SIZE_K"]], "b_desc": [kw["BLOCK_SIZE_N"], kw["BLOCK_SIZE_K"]],
                  "c_desc": [kw["BLOCK_SIZE_M"], bn]}
        assert c.extra["desc_blocks"] == blocks
        for name, block in blocks.items():
            assert c.bound.signature[name] == f"tensordesc<fp16{block}>"


def test_tutorial_09_compiles_with_the_hooks_blocks(cache_dir):
    k = lazytriton.kernel(tma.matmul_kernel_tma_persistent)
    res = resolution(k, matmul_args(k))
    cands = [c for c in res._candidates() if c.config.num_stages == 3 and c.config.num_warps == 8][:2]
    compile_all(k.spec, SM90, cands)
    for c in cands:
        assert c.error is None, c.error
        metas = c.binary.metadata["tensordesc_meta"]
        assert len(metas) == 3
        # Triton's TMA box is the block, split to the swizzle width on the inner dimension.
        for m, name in zip(metas, ("a_desc", "b_desc", "c_desc")):
            assert m["block_size"][0] == c.extra["desc_blocks"][name][0]
        keys = {res.compile_key(c) for c in cands}
    assert len(keys) == 2


def test_tutorial_06_hook_with_isinstance(cache_dir):
    k = lazytriton.kernel(tma.attn_fwd)
    Z, H, N_CTX, D = 2, 3, 256, 64
    y = Z * H * N_CTX
    q, kk, v, o = (array((y, D), addr=BASE + i * 2**24) for i in range(4))
    descs = [lazytriton.TensorDescriptor(x, [y, D], [D, 1], [1, 1]) for x in (q, kk, v, o)]
    m = array((Z * H, N_CTX), "fp32", addr=BASE + 2**27)
    args = k._bind_call((0.5, m, Z, H, *descs), dict(N_CTX=N_CTX, HEAD_DIM=D, FP8_OUTPUT=False, STAGE=3,
                                                    warp_specialize=False, IS_HOPPER=True))
    cands = resolution(k, args)._candidates()
    assert cands
    for c in cands:
        bm, bn = c.config.kwargs["BLOCK_M"], c.config.kwargs["BLOCK_N"]
        assert c.extra["desc_blocks"] == {"desc_q": [bm, D], "desc_k": [bn, D], "desc_v": [bn, D], "desc_o": [bm, D]}
    # Its early_config_prune reads kwargs["N_CTX"], as Triton passes it.
    kept = k.spec.prune([c.config for c in cands], res_named(k, args), {})
    assert kept and all(c.kwargs["BLOCK_M"] <= N_CTX for c in kept)


def res_named(k, args):
    return dict(zip((p.name for p in k.call_params), args))


def _attn_key_blocks(stage, start_m, BM, BN, n_ctx):
    """The key blocks [start_n, start_n + BN) tutorial 06's _attn_fwd_inner visits
    for query block start_m in `stage` (its lo/hi and tl.range), and whether it masks them."""
    lo, hi = {1: (0, start_m * BM), 2: (start_m * BM, (start_m + 1) * BM), 3: (0, n_ctx)}[stage]
    return [(n, n + BN) for n in range(lo, hi, BN)], stage == 2


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tutorial_06_configs_left_by_its_prune_compute_attention_right(cache_dir, causal, head_dim):
    """Every config tuning may pick must visit each key exactly once per query
    block, unmasked only where every query of the block sees it (a causal
    BLOCK_M < BLOCK_N reads keys past the diagonal unmasked: the tutorial's
    prune drops it, Triton PR 8853, in release 3.6)."""
    k = lazytriton.kernel(tma.attn_fwd)
    Z, H, N_CTX, D = 2, 3, 512, head_dim
    y = Z * H * N_CTX
    descs = [lazytriton.TensorDescriptor(array((y, D), addr=BASE + i * 2**24), [y, D], [D, 1], [1, 1])
             for i in range(4)]
    m = array((Z * H, N_CTX), "fp32", addr=BASE + 2**27)
    stage = 3 if causal else 1
    args = k._bind_call((0.5, m, Z, H, *descs), dict(N_CTX=N_CTX, HEAD_DIM=D, FP8_OUTPUT=False, STAGE=stage,
                                                    warp_specialize=False, IS_HOPPER=True))
    kept = k.spec.prune([c.config for c in resolution(k, args)._candidates()], res_named(k, args), {})
    kept = [c for c in kept if c.kwargs["BLOCK_N"] <= D]  # the kernel's static_assert fails the others
    assert kept
    for c in kept:
        BM, BN = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        for start_m in range(N_CTX // BM):
            # _attn_fwd: STAGE & 1 runs the inner loop with 4 - STAGE, STAGE & 2 with 2.
            stages = ([4 - stage] if stage & 1 else []) + ([2] if stage & 2 else [])
            seen = np.zeros(N_CTX, int)
            for s in stages:
                blocks, masked = _attn_key_blocks(s, start_m, BM, BN, N_CTX)
                for a, b in blocks:
                    seen[a:min(b, N_CTX)] += 1
                    if causal and not masked:  # unmasked keys must precede every query of the block
                        assert b <= start_m * BM, (c, start_m, (a, b))
            want = (start_m + 1) * BM if causal else N_CTX
            assert (seen[:want] == 1).all() and (seen[want:] == 0).all(), (c, start_m)


def _zeroing_hook(nargs):
    nargs["c_desc"].block_shape = [nargs["BM"], nargs["BN"]]
    nargs["x"].zero_()


def _writes_nargs(nargs):
    nargs["BM"] = 32


def _reads_unkeyed(nargs):
    nargs["c_desc"].block_shape = [nargs["BM"], nargs["n"]]


def _reads_keyed(nargs):
    nargs["c_desc"].block_shape = [nargs["BM"], nargs["BN"] if nargs["k"] > 0 else 16]


def _raises(nargs):
    raise RuntimeError("boom")


def _sets_other(nargs):
    nargs["c_desc"].padding = "nan"


def _reads_base(nargs):
    nargs["c_desc"].block_shape = [nargs["BM"], nargs["c_desc"].base.shape[1]]


@triton.jit
def _hooked_body(c_desc, x, n, k, BM: tl.constexpr, BN: tl.constexpr):
    c_desc.store([0, 0], tl.zeros([BM, BN], tl.float16))


def hooked(hook):
    return triton.autotune(configs=[triton.Config({"BM": 16, "BN": 32}, pre_hook=hook),
                                    triton.Config({"BM": 32, "BN": 32}, pre_hook=hook)], key=["k"])(_hooked_body)


@pytest.mark.parametrize("hook, why", [
    (_zeroing_hook, r"reads \.zero_ of argument x"),
    (_writes_nargs, "writes to nargs"),
    (_raises, "raises RuntimeError: boom"),
    (_sets_other, r"sets c_desc\.padding"),
    (_reads_base, r"reads \.base of argument c_desc"),
    (lambda nargs: None, "sets no tensor descriptor's block_shape"),
    (print, "formats nargs"),
], ids=["zeroes-an-array", "writes-nargs", "raises", "sets-padding", "reads-base", "does-nothing", "print"])
def test_other_hooks_are_refused_when_wrapping(hook, why):
    with pytest.raises(KernelSpecError, match=rf"kernel _hooked_body: config 0 \(.*\) has a pre_hook; .*this one {why}"):
        lazytriton.kernel(hooked(hook))


def test_a_hook_reading_a_value_the_key_does_not_pin_is_refused(cache_dir):
    with pytest.raises(KernelSpecError, match=r"config 0 .* this one uses argument n, whose value the call key"):
        lazytriton.kernel(hooked(_reads_unkeyed))  # n is not in the key: its value may change under one winner


def _reads_keyed_scalar_later(nargs):
    # isinstance needs the argument's type: known only per call (then n is unkeyed: refused).
    if isinstance(nargs["c_desc"], tensor_desc.TritonTensorDescriptor):
        nargs["c_desc"].block_shape = [nargs["BM"], nargs["n"]]


def test_a_hook_deferred_to_the_call_is_refused_there(cache_dir):
    k = lazytriton.kernel(hooked(_reads_keyed_scalar_later))
    with pytest.raises(KernelSpecError, match=r"config 0 .* this one uses argument n, whose value the call key"):
        resolution(k, (desc((64, 64), (1, 1)), array((64,)), 64, 1))._candidates()


def test_a_hook_reading_a_keyed_value_is_run_per_call(cache_dir):
    k = lazytriton.kernel(hooked(_reads_keyed))  # k is the autotune key
    for kval, bn in ((1, 32), (0, 16)):
        cands = resolution(k, (desc((64, 64), (1, 1)), array((64,)), 64, kval))._candidates()
        assert [c.extra["desc_blocks"]["c_desc"] for c in cands] == [[16, bn], [32, bn]]


def test_hook_on_an_array_argument_is_refused(cache_dir):
    def on_array(nargs):
        nargs["x"].block_shape = [16, 16]
    k = lazytriton.kernel(triton.autotune(configs=[triton.Config({"BM": 16, "BN": 32}, pre_hook=on_array)],
                                          key=["k"])(_hooked_body))
    with pytest.raises(KernelSpecError, match="sets block_shape on argument x, which is not a tensor descriptor"):
        resolution(k, (desc((64, 64), (1, 1)), array((64,)), 64, 1))._candidates()


def test_set_blocks_replays_recorded_blocks():
    hook = pre_hooks.SetBlocks({"c_desc": [16, 32]})
    k = lazytriton.kernel(triton.autotune(configs=[triton.Config({"BM": 16, "BN": 32}, pre_hook=hook)],
                                          key=["k"])(_hooked_body))
    cands = resolution(k, (desc((64, 64), (1, 1)), array((64,)), 64, 1))._candidates()
    assert cands[0].extra["desc_blocks"] == {"c_desc": [16, 32]}


@triton.heuristics({"BN": lambda args: 64 if args["in_desc"].shape[1] >= 64 else 32})
@triton.jit
def _desc_heuristic_kernel(in_desc, out_ptr, BN: tl.constexpr):
    pass


def test_heuristics_reading_a_descriptor_run_in_python_per_call(cache_dir):
    # A descriptor's shape is not in the call key: its heuristic values are (Python heuristics' token).
    k = lazytriton.kernel(_desc_heuristic_kernel)
    keys = set()
    for n in (128, 32):
        args = k._bind_call((desc((64, n), (16, 16)), array((16, 16))), {})
        keys.add(stubgen.load_stub(k._shape(args)).key(args))
    assert k._python_heuristics and len(keys) == 2
