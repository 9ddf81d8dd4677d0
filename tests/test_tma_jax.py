"""lazytriton.jax.TensorDescriptor (jax-triton 0.4's spelling) without a GPU:
the pytree, the checks jax-triton makes, and what lowering puts in the call
site's payload (the handler encodes the CUtensorMap from the operand's
address on every execution); config pre_hooks run at trace time and their
block shapes replayed by the handler's resolution."""
import dataclasses
import json
import re

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton import jax as ltj  # noqa: E402
from lazytriton.jax import ffi as jax_ffi  # noqa: E402
from lazytriton.runtime import stubgen
from lazytriton.runtime.resolve import Resolution  # noqa: E402

from kernels import tma  # noqa: E402
from test_tma import hooked, _writes_nargs  # noqa: E402

BASE = 0x7F0000000000


def lower(f, *avals) -> str:
    return jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()


def payload(text: str) -> dict:
    m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', text)
    assert m, text
    return json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))


def test_tensor_descriptor_is_jax_tritons():
    x = jnp.zeros((16, 128), jnp.float16)
    d = ltj.TensorDescriptor.from_array(x, [16, 64])
    assert (d.shape, d.strides, d.block_shape, d.layout, d.padding, d.round_f32_to_tf32) == \
        ((16, 128), (128, 1), (16, 64), None, "zero", False)
    leaves, tree = jax.tree_util.tree_flatten(d)
    assert len(leaves) == 1 and leaves[0] is x  # base is the leaf, the rest is static
    assert jax.tree_util.tree_unflatten(tree, [x]) == d
    assert [f.name for f in dataclasses.fields(ltj.TensorDescriptor)] == [
        "base", "shape", "strides", "block_shape", "layout", "padding", "round_f32_to_tf32"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.block_shape = (8, 8)
    with pytest.raises(ValueError, match="padding must be 'zero' or 'nan', got 'inf'"):
        ltj.TensorDescriptor.from_array(x, [16, 64], padding="inf")
    with pytest.raises(ValueError, match="shape, strides, and block_shape must have the same length, got 2, 2, 1"):
        ltj.TensorDescriptor(x, (16, 128), (128, 1), (16,))


def copy(x, block, **kw):
    M, N = block
    return ltj.triton_call(ltj.TensorDescriptor.from_array(x, block, **kw), kernel=tma.tma_copy_kernel,
                           out_type=jax.ShapeDtypeStruct(tuple(block), x.dtype), grid=1, M=M, N=N)


def test_lowering_describes_the_descriptor(cache_dir):
    before = lazytriton.stats()["compiles"]
    d = payload(lower(lambda x: copy(x, (32, 64), padding="nan"), jax.ShapeDtypeStruct((64, 128), jnp.float16)))
    assert d["v"] == jax_ffi.PAYLOAD_VERSION == 6
    a = d["args"][0]
    assert a == {"buffer": 0, "dtype": "fp16", "shape": [64, 128], "name": "in_desc",
                 "desc": {"shape": [64, 128], "strides": [128, 1], "block": [32, 64], "padding": "nan",
                          "tf32": False}}
    assert d["args"][1] == {"buffer": 1, "dtype": "fp16", "shape": [32, 64], "name": "out_ptr"}  # the output
    assert lazytriton.stats()["compiles"] == before


def test_handler_args_and_key_from_the_descriptor(cache_dir):
    d = payload(lower(lambda x: copy(x, (32, 64)), jax.ShapeDtypeStruct((64, 128), jnp.float32)))
    d["n_inputs"], d["aliases"] = 1, []
    site = jax_ffi.Site(d)
    args = site.call_args(((BASE, 64 * 128 * 4), (BASE + 2**20, 32 * 64 * 4)))
    desc = args[0]
    assert isinstance(desc, lazytriton.TensorDescriptor)
    assert (desc.shape, desc.strides, desc.block_shape, desc.padding) == ([64, 128], [128, 1], [32, 64], "zero")
    assert desc.base.data_ptr() == BASE
    shape = site.lazy._shape(site.lazy._bind_call(tuple(args), {}))
    assert shape.slots[0].kind == "desc" and shape.slots[0].rank == 2


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.int32])
def test_round_f32_to_tf32_needs_float32(dtype):
    with pytest.raises(ValueError, match="TMA descriptors with round_f32_to_tf32=True must have a float32 input "
                                         "type, but got"):
        lower(lambda x: copy(x, (16, 16), round_f32_to_tf32=True), jax.ShapeDtypeStruct((16, 16), dtype))


def test_layout_is_not_supported():
    x = jax.ShapeDtypeStruct((16, 16), jnp.float16)

    def f(x):
        return ltj.triton_call(ltj.TensorDescriptor(x, (16, 16), (16, 1), (16, 16), layout="swizzled"),
                               kernel=tma.tma_copy_kernel, out_type=x, grid=1, M=16, N=16)

    with pytest.raises(NotImplementedError, match="layout"):
        lower(f, x)


def test_bad_strides_are_refused_at_trace_time():
    x = jax.ShapeDtypeStruct((16, 12), jnp.float16)  # a 24-byte row: not a multiple of 16 bytes
    with pytest.raises(ValueError, match=r"argument in_desc: strides \[12, 1\]: every stride but the last must be "
                                         "a multiple of 16 bytes"):
        lower(lambda x: copy(x, (16, 8)), x)


def test_tutorial_09_pre_hook_runs_at_trace_time_and_is_replayed(cache_dir):
    kernel = triton.autotune(configs=tma.matmul_tma_persistent_get_configs(pre_hook=tma.matmul_tma_set_block_size_hook)[:6],
                             key=["M", "N", "K", "WARP_SPECIALIZE"])(tma.matmul_kernel_tma_persistent.fn)
    M, N, K = 512, 256, 128

    def f(a, b):
        # The output is written through a descriptor too: an aliased input (jax-triton 0.4's convention).
        c0 = jnp.zeros((M, N), jnp.float16)
        descs = [ltj.TensorDescriptor.from_array(t, [1, 1]) for t in (a, b, c0)]
        return ltj.triton_call(*descs, M, N, K, kernel=kernel, out_type=jax.ShapeDtypeStruct((M, N), jnp.float16),
                               input_output_aliases={2: 0},
                               grid=lambda META: (min(132, triton.cdiv(M, META["BLOCK_SIZE_M"])
                                                      * triton.cdiv(N, META["BLOCK_SIZE_N"])),),
                               FP8_OUTPUT=False, NUM_SMS=132, WARP_SPECIALIZE=False)

    d = payload(lower(f, jax.ShapeDtypeStruct((M, K), jnp.float16), jax.ShapeDtypeStruct((N, K), jnp.float16)))
    assert len(d["configs"]) == 6
    for c in d["configs"]:
        kw = c["kwargs"]
        bn = kw["BLOCK_SIZE_N"] // 2 if kw["EPILOGUE_SUBTILE"] else kw["BLOCK_SIZE_N"]
        assert c["blocks"] == {"a_desc": [kw["BLOCK_SIZE_M"], kw["BLOCK_SIZE_K"]],
                               "b_desc": [kw["BLOCK_SIZE_N"], kw["BLOCK_SIZE_K"]], "c_desc": [kw["BLOCK_SIZE_M"], bn]}
    assert d["args"][2]["buffer"] == 3 and d["aliases"] == [[2, 0]]  # c0 is written in place: the output buffer
    # The handler's resolution replays them: each candidate is compiled for its config's block shapes.
    site = jax_ffi.Site(d)
    bufs = ((BASE, M * K * 2), (BASE + 2**20, N * K * 2), (BASE + 2**21, M * N * 2), (BASE + 2**21, M * N * 2))
    args = tuple(site.call_args(bufs))
    lk = site.lazy
    call = lk._bind_call(args, {})
    key = stubgen.load_stub(lk._shape(call)).key(call)
    res = Resolution(lk, key, call, 0, site._grid, lk._shape(call))
    res.target = GPUTarget("cuda", 90, 32)
    for cand, c in zip(res._candidates(), d["configs"]):
        assert cand.extra["desc_blocks"] == c["blocks"]
        assert cand.bound.signature["c_desc"] == f"tensordesc<fp16{c['blocks']['c_desc']}>"


def test_other_pre_hooks_raise_not_implemented():
    x = jax.ShapeDtypeStruct((64, 64), jnp.float16)

    def f(x):
        return ltj.triton_call(ltj.TensorDescriptor.from_array(x, [1, 1]), jnp.zeros((64,), jnp.float16), 64, 1,
                               kernel=hooked(_writes_nargs), out_type=x, grid=1)

    with pytest.raises(NotImplementedError, match=r"config 0 \(.*\) has a pre_hook.*this one writes to nargs"):
        lower(f, x)
